"""castpack-amd installed beside castcore: its profiles load, every number sourced, and castcore finds
the pack, which claims no op (a pack of device profiles only). Run with `pytest` after installing the pack
(editable or not), or `python3 -m nox`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from importlib import resources

import pytest
import torch

import castcore

PACK = "castpack-amd"
MODULE = "castpack_amd"
ENTRY_POINT = "amd"
DEVICE = "mi300x"


@pytest.fixture
def session(monkeypatch) -> castcore.Session:
    """A session that sees every installed pack, whatever CASTCORE_* variables the shell has set."""
    for var in ("CASTCORE_LOAD_PACKS", "CASTCORE_DISABLE_PACKS", "CASTCORE_CUSTOM_OP_PATH", "CASTCORE_STRICT"):
        monkeypatch.delenv(var, raising=False)
    return castcore.Session()


def test_profile_loads_and_every_number_is_sourced():
    folder = resources.files(MODULE) / "profiles"
    profiles = [castcore.load_device_file(f) for f in folder.iterdir() if f.name.endswith(".toml")]  # raises, naming the field, if one is unsourced
    assert DEVICE in [p.name for p in profiles]
    for profile in profiles:
        assert profile.memory_bandwidth > 0 and profile.mma_flops, profile.name
        placeholders = sorted(k for k, v in profile.sources.items() if "PLACEHOLDER" in v)
        if placeholders:
            warnings.warn(f"{profile.origin}: sources still placeholders: {', '.join(placeholders)}", stacklevel=1)


def test_pack_is_loaded_through_its_entry_point_and_claims_no_op(session):
    (pack,) = [info for info in session.plugins.infos if info.name == ENTRY_POINT]
    assert (pack.kind, pack.status, pack.distribution) == ("pack", "loaded", PACK), pack.error
    assert not pack.claims and pack.hooks == []  # profiles only: the core prices every op
    assert session.devices[DEVICE].origin.startswith(f"{PACK}:profiles/")
    # Problems naming this pack or its device (another pack with the same device name, say).
    assert not [w for w in session.warnings if PACK in w or repr(DEVICE) in w], session.warnings


def test_castcore_audit_shows_who_answers_mm_on_the_device():
    env = {k: v for k, v in os.environ.items() if not k.startswith("CASTCORE_")}
    done = subprocess.run([sys.executable, "-m", "castcore", "audit", "--json", "--device", DEVICE, "--op", "aten::mm"],
                          capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    (row,) = json.loads(done.stdout)
    assert not row["winner"]["plugin"].startswith(PACK)


def test_a_matmul_is_priced_on_the_device(session):
    a = torch.empty(1024, 1024, dtype=torch.bfloat16, device="meta")
    (record,) = session.estimate(torch.mm, a, a, device=DEVICE).records
    assert record.estimate.time_s > 0
