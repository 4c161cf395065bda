"""Every shipped profile loads, is sourced field by field, and its rates follow the CANN platform file."""

from __future__ import annotations

import pytest

import castcore

# name: (AI cores, vector cores, cube clock Hz, memory bytes) from the CANN platform files (see README)
EXPECTED = {
    "ascend-910b1": (24, 48, 1.85e9, 64 * 2**30),
    "ascend-910b2": (24, 48, 1.80e9, 64 * 2**30),
    "ascend-910b3": (20, 40, 1.80e9, 64 * 2**30),
    "ascend-910b4": (20, 40, 1.50e9, 32 * 2**30),
    "ascend-910c-die": (24, 48, 1.85e9, 64 * 2**30),
}


@pytest.fixture(scope="module")
def devices():
    return castcore.Session(load_packs=["ascend"]).devices


def test_every_profile_loads_and_only_the_910b3_is_default(devices):
    ascend = {n: d for n, d in devices.items() if d.origin.startswith("castpack-ascend:")}
    assert set(ascend) == {*EXPECTED, "ascend-310p-duo"}
    assert [n for n, d in ascend.items() if d.default] == ["ascend-910b3"]


@pytest.mark.parametrize("name", [*EXPECTED, "ascend-310p-duo"])
def test_every_number_has_a_source(devices, name):
    device = devices[name]
    fields = ["memory_bytes", "memory_bandwidth", "compute_efficiency", "memory_efficiency", "mma_op_cost_s",
              "gp_op_cost_s", "comm_op_cost_s", *(f"mma_flops.{d}" for d in device.mma_flops),
              *(f"gp_flops.{d}" for d in device.gp_flops), *(f"interconnect.{i.name}" for i in device.interconnect)]
    for field in fields:
        parts = field.split(".")
        assert any(".".join(parts[:n]) in device.sources for n in range(1, len(parts) + 1)), field


@pytest.mark.parametrize("name", EXPECTED)
def test_910_class_rates_follow_the_platform_file(devices, name):
    cores, vector_cores, clock, memory = EXPECTED[name]
    device = devices[name]
    assert device.mma_flops["bfloat16"] == pytest.approx(cores * 16 * 16 * 16 * 2 * clock)
    assert device.mma_flops["int8"] == pytest.approx(2 * device.mma_flops["float16"])
    assert device.gp_flops["float16"] == pytest.approx(vector_cores * 128 * 2 * clock)
    assert device.memory_bytes == memory


def test_inference_card_is_fp16_only_and_matches_the_datasheet(devices):
    chip = devices["ascend-310p-duo"]
    # Atlas 300I Duo: 140 TFLOPS FP16 / 280 TOPS INT8 / 408 GB/s per two-chip card.
    assert 2 * chip.mma_flops["float16"] == pytest.approx(140e12, rel=0.01)
    assert 2 * chip.mma_flops["int8"] == pytest.approx(280e12, rel=0.01)
    assert 2 * chip.memory_bandwidth == pytest.approx(408e9)
    assert "bfloat16" not in chip.mma_flops and not chip.interconnect


def test_910c_die_is_half_a_package(devices):
    die = devices["ascend-910c-die"]
    assert 2 * die.memory_bandwidth == pytest.approx(3.2e12)
    assert [level.name for level in die.interconnect] == ["ub", "roce"]
