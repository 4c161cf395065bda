"""A serving engine's own all-reduce (one_shot, two_shot): worked by hand, offered only for an engine's calls on a
level that gives its constants, and against a few of vLLM's measured custom all-reduce latencies."""

from __future__ import annotations

from pathlib import Path

import pytest

import castcore
from castcore import Interconnect
from castpack_collectives.alphabeta import ENGINE, NCCL, collective_cost

# A switch with the engine constants: one shot 5 us + (n-1) S / 1e11 B/s, two shots 10 us + 2 (n-1)/n S / 2e11 B/s.
BOARD = Interconnect(name="board", devices=8, bandwidth=4.5e11, latency_s=2e-6, efficiency=0.8, topology="switch",
                     engine_allreduce_max_bytes=4 * 2**20, one_shot_latency_s=5e-6, one_shot_bandwidth=1e11,
                     two_shot_latency_s=1e-5, two_shot_bandwidth=2e11)
PLAIN = Interconnect(name="plain", devices=8, bandwidth=4.5e11, latency_s=2e-6, efficiency=0.8, topology="switch")
OP_COST = 2e-5  # the library's host-side cost per call, which the engine's kernels inside its CUDA graph do not pay


def test_small_all_reduce_is_one_shot_without_the_library_cost():
    cost = collective_cost("all_reduce", 64e3, 8, (BOARD,), OP_COST, ENGINE)
    assert (cost.algorithm, cost.steps, cost.bytes_moved, cost.overhead_s) == ("one_shot", 1, 7 * 64e3, 0.0)
    assert cost.time_s == pytest.approx(5e-6 + 7 * 64e3 / 1e11)


def test_larger_all_reduce_is_two_shot_then_the_library_past_the_engine_limit():
    two = collective_cost("all_reduce", 2e6, 8, (BOARD,), OP_COST, ENGINE)
    assert two.algorithm == "two_shot" and two.time_s == pytest.approx(1e-5 + 2 * 7 / 8 * 2e6 / 2e11)
    past = collective_cost("all_reduce", 8 * 2**20, 8, (BOARD,), OP_COST, ENGINE)
    assert past.algorithm in NCCL and past.overhead_s == OP_COST


def test_on_a_full_mesh_a_group_uses_only_its_own_links():
    """The level's engine bandwidths are a rank's over all seven links; a group of 4 reads over 3 of them."""
    mesh = Interconnect(name="mesh", devices=8, bandwidth=4.48e11, latency_s=3e-6, efficiency=0.7,
                        topology="full-mesh", engine_allreduce_max_bytes=16 * 2**20, one_shot_latency_s=7e-6,
                        one_shot_bandwidth=3.5e11, two_shot_latency_s=9e-6, two_shot_bandwidth=2.8e11)
    one = collective_cost("all_reduce", 32e3, 4, (mesh,), OP_COST, ENGINE)
    assert one.algorithm == "one_shot" and one.time_s == pytest.approx(7e-6 + 3 * 32e3 / (3.5e11 * 3 / 7))
    two = collective_cost("all_reduce", 8e6, 4, (mesh,), OP_COST, ENGINE)
    assert two.algorithm == "two_shot" and two.time_s == pytest.approx(9e-6 + 2 * 3 / 4 * 8e6 / (2.8e11 * 3 / 7))
    whole = collective_cost("all_reduce", 8e6, 8, (mesh,), OP_COST, ENGINE)
    assert whole.time_s == pytest.approx(9e-6 + 2 * 7 / 8 * 8e6 / 2.8e11)  # all seven links


def test_engine_kernels_need_an_engine_call_an_all_reduce_and_the_constants():
    assert collective_cost("all_reduce", 64e3, 8, (BOARD,), OP_COST).algorithm in NCCL  # a library's call
    assert collective_cost("all_reduce", 64e3, 8, (PLAIN,), OP_COST, ENGINE).algorithm in NCCL
    assert collective_cost("all_gather", 64e3, 8, (BOARD,), OP_COST, ENGINE).algorithm in NCCL


# vLLM 0.24.0's custom all-reduce under CUDA graphs on 'NVIDIA H100 80GB HBM3' (aiconfigurator-core 0.12.0,
# systems/data/h100_sxm/comm/vllm/0.24.0/custom_allreduce_perf.parquet, read 2026-11-27): (GPUs, bytes) -> us.
VLLM_H100 = {(2, 4096): 4.375, (2, 131072): 5.18, (4, 16384): 4.904, (4, 524288): 12.757, (8, 2048): 5.554,
             (8, 65536): 7.864, (8, 2097152): 30.812}


H100 = Path(__file__).parents[2] / "castpack-nvidia" / "castpack_nvidia" / "profiles" / "h100-sxm5-80gb.toml"


def test_h100_profile_constants_price_vllms_custom_all_reduce():
    h100 = castcore.Session(load_packs=[], device_files=[H100]).device("h100-sxm5-80gb")
    for (n, size), us in VLLM_H100.items():
        cost = collective_cost("all_reduce", size, n, h100.interconnect, h100.comm_op_cost_s, ENGINE)
        assert cost.time_s * 1e6 == pytest.approx(us, rel=0.2), (n, size)  # the "within 20%"
