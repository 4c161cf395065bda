"""Every shipped profile loads, is sourced field by field, and its rates follow the CANN platform file."""

from __future__ import annotations

import pytest

import castcore
import castcore.pack

# name: (AI cores, vector cores, cube clock Hz, memory bytes) from the CANN platform files (see README)
EXPECTED = {
    "ascend-910b1": (24, 48, 1.85e9, 64 * 2**30),
    "ascend-910b2": (24, 48, 1.80e9, 64 * 2**30),
    "ascend-910b3": (20, 40, 1.80e9, 64 * 2**30),
    "ascend-910b4": (20, 40, 1.50e9, 32 * 2**30),
    "ascend-910c-die": (24, 48, 1.85e9, 64 * 2**30),
    "ascend-910c-die-cm384": (24, 48, 1.85e9, 64 * 2**30),
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
              "gp_op_cost_s", "comm_op_cost_s", "compute_units", *(f"mma_flops.{d}" for d in device.mma_flops),
              *(f"gp_flops.{d}" for d in device.gp_flops), *(f"interconnect.{i.name}" for i in device.interconnect),
              *(f"mma_unit.{d}" for d in device.mma_unit), *(f"mma_tile.{d}" for d in device.mma_tile)]
    for field in fields:
        parts = field.split(".")
        assert any(".".join(parts[:n]) in device.sources for n in range(1, len(parts) + 1)), field


@pytest.mark.parametrize("name", EXPECTED)
def test_910_class_rates_follow_the_platform_file(devices, name):
    cores, vector_cores, clock, memory = EXPECTED[name]
    device = devices[name]
    assert device.mma_flops["bfloat16"] == pytest.approx(cores * 16 * 16 * 16 * 2 * clock)
    assert device.mma_flops["int8"] == pytest.approx(2 * device.mma_flops["float16"])
    assert device.memory_bytes == memory
    if name != "ascend-910b4":  # the 910B4 takes Huawei's own figures, below
        assert device.mma_flops["float16"] == device.mma_flops["bfloat16"]
        assert device.gp_flops["float16"] == pytest.approx(vector_cores * 128 * 2 * clock)


def test_910b4_takes_the_vendors_figures(devices):
    # Huawei's modelling tool, profile ATLAS_800_A2_280T_32G_PCIE: 280 T fp16, 245.8 T bf16, 560 T int8, 75 T fp32 on
    # the Cube, 16 T fp16 on the vector cores, 0.8 TB/s.
    chip = devices["ascend-910b4"]
    assert dict(chip.mma_flops) == pytest.approx({"float16": 280e12, "bfloat16": 245.76e12, "int8": 560e12,
                                                  "hf32": 122.88e12, "float32": 75e12})
    assert dict(chip.gp_flops) == pytest.approx({"float16": 16e12, "float32": 8e12, "bfloat16": 8e12})
    assert chip.memory_bandwidth == pytest.approx(0.8e12)


# AI cores (ai_core_cnt) and L0C bytes (l0_c_size) of each profile's CANN platform file.
CUBE = {"ascend-910b1": (24, 131072), "ascend-910b2": (24, 131072), "ascend-910b3": (20, 131072),
        "ascend-910b4": (20, 131072), "ascend-910c-die": (24, 131072), "ascend-910c-die-cm384": (24, 131072),
        "ascend-310p-duo": (8, 262144)}


@pytest.mark.parametrize("name", CUBE)
def test_cube_tiling_fields_load_and_follow_the_platform_file(devices, name):
    cores, l0c = CUBE[name]
    device = devices[name]
    assert device.compute_units == cores
    assert device.mma_unit["float16"] == (16, 16, 16) and device.mma_unit["int8"] == (16, 16, 32)  # [m, n, k]
    assert set(device.mma_tile) == set(device.mma_unit) == set(device.mma_flops)  # a block for every Cube dtype
    if "float32" in device.mma_unit:
        assert device.mma_unit["bfloat16"] == (16, 16, 16) and device.mma_unit["float32"] == (16, 16, 8)
    assert (128, 256, 64) in device.mma_tile["float16"]
    for dtype, tiles in device.mma_tile.items():
        for m, n, k in tiles:
            assert m * n * 4 <= l0c, (dtype, m, n)  # the fp32 / int32 accumulator block fits in L0C
            assert all(t % u == 0 for t, u in zip((m, n, k), device.mma_unit[dtype]))
    for field in ("compute_units", "mma_unit", "mma_tile"):
        assert "read 2026-11-23" in device.sources[field]


def test_inference_card_is_fp16_only_and_matches_the_datasheet(devices):
    chip = devices["ascend-310p-duo"]
    # Atlas 300I Duo: 140 TFLOPS FP16 / 280 TOPS INT8 / 408 GB/s per two-chip card.
    assert 2 * chip.mma_flops["float16"] == pytest.approx(140e12, rel=0.01)
    assert 2 * chip.mma_flops["int8"] == pytest.approx(280e12, rel=0.01)
    assert 2 * chip.memory_bandwidth == pytest.approx(408e9)
    assert "bfloat16" not in chip.mma_flops and not chip.interconnect


def test_910c_die_is_half_a_package_with_its_twin_die_innermost(devices):
    die = devices["ascend-910c-die"]
    assert 2 * die.memory_bandwidth == pytest.approx(3.2e12)
    levels = {level.name: level for level in die.interconnect}
    assert list(levels) == ["sio", "ub-l1", "roce"]
    # Innermost first, as castpack-collectives picks the first level that holds a group.
    assert [level.devices for level in die.interconnect] == sorted(level.devices for level in die.interconnect)
    assert (levels["sio"].devices, levels["sio"].topology) == (2, "full-mesh")
    assert levels["sio"].bandwidth == pytest.approx(270e9)  # 540 GB/s both ways between the two dies
    assert (levels["ub-l1"].devices, levels["ub-l1"].topology) == (16, "switch")  # one Atlas 800T/800I A3 server
    assert levels["ub-l1"].bandwidth == pytest.approx(196e9)  # 392 GB/s per package
    assert levels["roce"].bandwidth == pytest.approx(25e9)  # 200 Gb/s per die, 400 Gb/s per package


def test_cloudmatrix384_die_is_the_a3_die_on_a_768_die_ub_fabric(devices):
    server, pod = devices["ascend-910c-die"], devices["ascend-910c-die-cm384"]
    # The same die: every compute and memory figure, and its source, as the A3 server's profile gives it.
    for field in ("memory_bytes", "memory_bandwidth", "compute_efficiency", "memory_efficiency", "mma_op_cost_s",
                  "gp_op_cost_s", "attention_efficiency", "attention_op_cost_s", "comm_op_cost_s", "compute_units"):
        assert getattr(pod, field) == getattr(server, field), field
        assert pod.sources[field] == server.sources[field], field
    assert dict(pod.mma_flops) == dict(server.mma_flops) and dict(pod.gp_flops) == dict(server.gp_flops)
    assert dict(pod.mma_tile) == dict(server.mma_tile) and dict(pod.mma_unit) == dict(server.mma_unit)
    levels = {level.name: level for level in pod.interconnect}
    assert list(levels) == ["sio", "ub-l1", "ub-l2", "roce"]
    assert [level.devices for level in pod.interconnect] == [2, 16, 768, 4096]  # package, node, super node
    assert levels["sio"] == {level.name: level for level in server.interconnect}["sio"]
    for tier in ("ub-l1", "ub-l2"):  # both UB switch tiers: 392 GB/s per 910C package, halved
        assert (levels[tier].topology, levels[tier].bandwidth) == ("switch", pytest.approx(196e9))
        assert "2506.12708" in pod.sources[f"interconnect.{tier}"]
    assert levels["ub-l2"].devices == 384 * 2
    # Across nodes: under 1 us more latency and under 3% less bandwidth than inside one (the paper's measurement).
    assert levels["ub-l2"].latency_s - levels["ub-l1"].latency_s == pytest.approx(1e-6)
    assert levels["ub-l2"].efficiency == pytest.approx(levels["ub-l1"].efficiency * 0.97, abs=1e-3)
    assert levels["roce"].bandwidth == pytest.approx(25e9)  # the RDMA plane: 400 Gb/s per package
    for name in ("interconnect.ub-l1", "interconnect.ub-l2", "interconnect.roce"):
        assert "read 2026-11-29" in pod.sources[name] and "assum" in pod.sources[name]


def test_every_910b_carries_its_board_power():
    powered = {p.name: (p.tdp_w, p.idle_w) for p in castcore.pack.package_profiles("castpack_ascend") if p.tdp_w}
    assert {"ascend-910b1", "ascend-910b2", "ascend-910b3", "ascend-910b4"} <= set(powered)
    assert all(idle < tdp for tdp, idle in powered.values())
