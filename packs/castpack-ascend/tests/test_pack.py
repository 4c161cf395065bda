"""castpack-ascend installed on its own beside castcore: found, its device sourced and the default."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

import castcore


@pytest.fixture
def session(monkeypatch):
    for var in ("CASTCORE_LOAD_PACKS", "CASTCORE_DISABLE_PACKS", "CASTCORE_CUSTOM_OP_PATH"):
        monkeypatch.delenv(var, raising=False)
    return castcore.Session()


def test_pack_is_loaded_through_its_entry_point(session):
    info = next(i for i in session.plugins.infos if i.name == "ascend")
    assert (info.kind, info.status, info.distribution) == ("pack", "loaded", "castpack-ascend")
    assert "ascend-910b3" in session.devices  # from the profile data its castcore.profiles entry point names


def test_910b_profile_is_the_default_and_every_number_is_sourced(session):
    device = session.device()
    assert device.name == "ascend-910b3"
    assert device.vendor == "Huawei"
    assert device.mma_flops["bfloat16"] == pytest.approx(20 * 16 * 16 * 16 * 2 * 1.8e9)
    assert device.memory_bytes == 64 * 2**30
    assert [level.name for level in device.interconnect] == ["hccs", "roce"]
    assert all(source.strip() for source in device.sources.values())


def test_aligned_mm_on_the_910b_is_the_cube_rate_but_for_the_last_wave(session):
    # 8192 is a whole number of fractals and of 128 x 256 blocks: 2048 blocks on 20 AI cores are 102.4 waves,
    # so the 103rd runs 8 of 20 cores: the only loss against the Cube's sustained rate, besides the kernel's
    # fixed cost (mma_op_cost_s).
    a = torch.empty(8192, 8192, dtype=torch.bfloat16, device="meta")
    (record,) = session.estimate(torch.mm, a, a, device="ascend-910b3").records
    device = session.device("ascend-910b3")
    assert record.estimate.source.plugin.startswith("castpack-ascend")
    ideal = 2 * 8192**3 / (device.mma_flops["bfloat16"] * device.compute_efficiency)
    assert record.estimate.detail["waves"] == 103
    assert record.estimate.time_s == pytest.approx(ideal * 103 / 102.4 + device.mma_op_cost_s)
    assert record.estimate.detail["padding_waste"] == pytest.approx(1 - 102.4 / 103)


def test_castcore_devices_lists_the_pack_profile():
    done = subprocess.run([sys.executable, "-m", "castcore", "devices", "--json"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    rows = {row["name"]: row for row in json.loads(done.stdout)}
    assert rows["ascend-910b3"]["default"] is True
    assert rows["ascend-910b3"]["origin"] == "castpack-ascend:profiles/atlas-800t-a2-910b.toml"
