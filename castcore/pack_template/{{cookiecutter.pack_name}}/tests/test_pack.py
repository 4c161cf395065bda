"""{{ cookiecutter.pack_name }} installed beside castcore: its profile loads, castcore finds the pack, and it wins
the ops it claims on its device. Run with `pytest` after installing the pack (editable or not), or `python3 -m nox`.

When you change what ops.py claims, keep test_pack_wins_every_op_it_claims_on_its_device as it is and
change or add the tests that name an op (mm, cumsum) to match.
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
from castcore.pack import Source, op_name

PACK = "{{ cookiecutter.pack_name }}"
MODULE = "{{ cookiecutter.module_name }}"
ENTRY_POINT = "{{ cookiecutter.__entry_point }}"
DEVICE = "{{ cookiecutter.device_name }}"


@pytest.fixture
def session(monkeypatch) -> castcore.Session:
    """A session that sees every installed pack, whatever CASTCORE_* variables the shell has set."""
    for var in ("CASTCORE_LOAD_PACKS", "CASTCORE_DISABLE_PACKS", "CASTCORE_CUSTOM_OP_PATH", "CASTCORE_STRICT"):
        monkeypatch.delenv(var, raising=False)
    return castcore.Session()


@pytest.fixture
def pack(session):
    found = [info for info in session.plugins.infos if info.name == ENTRY_POINT]
    assert found, f"castcore does not see {PACK}: install it first (pip install -e '.[test]')"
    return found[0]


def test_profile_loads_and_every_number_is_sourced():
    folder = resources.files(MODULE) / "profiles"
    profiles = [castcore.load_device_file(f) for f in folder.iterdir() if f.name.endswith(".toml")]  # raises, naming the field, if one is unsourced
    assert DEVICE in [p.name for p in profiles]
    for profile in profiles:
        assert profile.memory_bandwidth > 0 and profile.mma_flops, profile.name
        placeholders = sorted(k for k, v in profile.sources.items() if "PLACEHOLDER" in v)
        if placeholders:
            warnings.warn(f"{profile.origin}: sources still placeholders: {', '.join(placeholders)}", stacklevel=1)


def test_pack_is_loaded_through_its_entry_point(session, pack):
    assert (pack.kind, pack.status, pack.distribution) == ("pack", "loaded", PACK), pack.error
    assert pack.claims, "ops.py declares no estimator or properties"
    assert session.devices[DEVICE].origin.startswith(f"{PACK}:profiles/")
    # Problems naming this pack or its device (another pack with the same device name, say).
    assert not [w for w in session.warnings if PACK in w or repr(DEVICE) in w], session.warnings


def _audit(*options: str) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CASTCORE_")}
    done = subprocess.run([sys.executable, "-m", "castcore", "audit", "--json", "--device", DEVICE, *options],
                          capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_pack_wins_every_op_it_claims_on_its_device(pack):
    rows = [row for row in _audit() if any(c["plugin"] == pack.label for c in row["candidates"])]
    assert {row["op"] for row in rows} == {op_name(claim.op) for claim in pack.claims if claim.matches(DEVICE)}
    for row in rows:
        assert row["winner"]["plugin"] == pack.label, f"{row['op']} on {DEVICE} is won by {row['winner']}"
        assert row["status"] != "CONFLICT", f"{row['op']}: {row['candidates']}"


def test_example_mm_estimator_answers_mm_on_the_device(session, pack):
    a = torch.empty(1000, 3000, dtype=torch.bfloat16, device="meta")
    b = torch.empty(3000, 500, dtype=torch.bfloat16, device="meta")
    (record,) = session.estimate(torch.mm, a, b, device=DEVICE).records
    assert record.estimate.source == Source(pack.label, "estimator")
    assert record.estimate.time_s > 0


def test_example_cumsum_properties_are_turned_into_time_on_the_device(session, pack):
    x = torch.empty(4096, 4096, dtype=torch.float32, device="meta")
    report = session.estimate(lambda t: torch.cumsum(t, 0), x, device=DEVICE)
    (record,) = [r for r in report.records if r.invoke.name == "aten::cumsum"]
    assert record.estimate.source == Source(pack.label, "properties")
    assert record.properties.memory_bytes == 2 * x.nbytes


def test_example_cumsum_leaves_a_bool_scan_to_the_core(session, pack):
    """A mask's cumsum (a Llama's position ids) is no matrix-unit work: the core prices it, and no note says the
    device lacks a matrix rate for bool."""
    mask = torch.empty(8, 2048, dtype=torch.bool, device="meta")
    report = session.estimate(lambda t: torch.cumsum(t, 1), mask, device=DEVICE)
    (record,) = [r for r in report.records if r.invoke.name == "aten::cumsum"]
    assert record.estimate.source.plugin != pack.label
    assert not [line for line in report.borrowed_rates() if "bool" in line]


def test_claims_stay_on_the_pack_devices(session, pack):
    numbers = {"mma_flops": {"bfloat16": 1e14}, "gp_flops": {"float32": 1e13},
               "memory_bytes": 1e10, "memory_bandwidth": 1e12}
    other = castcore.device_from_dict({"name": "zz-other-device", "vendor": "test", **numbers,
                                       "sources": {k: "test value" for k in numbers}})
    a = torch.empty(256, 256, dtype=torch.bfloat16, device="meta")
    (record,) = session.estimate(torch.mm, a, a, device=other).records
    assert record.estimate.source.plugin != pack.label


def test_castcore_audit_shows_the_pack_winning_mm():
    (row,) = _audit("--op", "aten::mm")
    assert row["winner"]["plugin"].split()[0] == PACK
    assert row["winner"]["function"] == "mm"
