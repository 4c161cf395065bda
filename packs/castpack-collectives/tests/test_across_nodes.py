"""Collectives across nodes as NCCL runs them, on the fabric a profile describes (NICs a device, the fraction of line
rate reached): NCCL's ring over the nodes, whose bytes go through the node's NICs, against numbers worked by hand."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

import castcore
from castcore import Interconnect
from castpack_collectives.alphabeta import bus_bandwidth, collective_cost

US = 1e-6
# castpack-nvidia's A100 board: NVLink 300 GB/s x 0.77 = 231 GB/s a GPU, NCCL's NVLink step latencies, no NVLS.
NVLINK = Interconnect(name="nvlink", devices=8, bandwidth=3e11, latency_s=2e-6, efficiency=0.77, topology="switch",
                      protocol_latency_s=(0.6e-6, 1.9e-6, 3.4e-6))
B_NVLINK = 3e11 * 0.77
NVLS = Interconnect(name="nvlink", devices=8, bandwidth=4.5e11, latency_s=2e-6, efficiency=0.82, topology="switch",
                    reduction_efficiency=0.58, reduction_latency_s=40e-6, protocol_latency_s=(0.6e-6, 1.9e-6, 3.4e-6))


def network(nics_per_device: float, efficiency: float = 0.9) -> Interconnect:
    """HDR InfiniBand, 200 Gb/s NICs (25 GB/s one way), ``nics_per_device`` of them a GPU."""
    return Interconnect(name="infiniband", devices=1024, bandwidth=2.5e10 * nics_per_device, latency_s=5e-6,
                        efficiency=efficiency, topology="clos", protocol_latency_s=(2.7e-6, 4.0e-6, 14.0e-6),
                        nic_bandwidth=2.5e10, nics_per_device=nics_per_device)


S = 2**28  # 256 MiB
MOVED = 2 * 15 / 16 * S  # an all-reduce ring of 16 ranks: 2(n-1)/n S a rank
# Simple over two nodes of 8: base 8.4 us, 28 steps inside a node at max(3.4, 3 x 1 us net overhead) and 2 across
# at 14 us: 8.4 + 95.2 + 28 = 131.6 us.
SIMPLE_LATENCY = 8.4 * US + 28 * 3.4 * US + 2 * 14.0 * US


def test_sixteen_a100_over_two_dgx_nodes_run_nccls_ring_through_the_nodes_nics():
    # One NIC a GPU: 8 x 25 GB/s x 0.9 = 180 GB/s a node, below NVLink's 231: 131.6 us + 503.3 MB / 180 GB/s.
    cost = collective_cost("all_reduce", S, 16, (NVLINK, network(1)))
    assert (cost.algorithm, cost.protocols, cost.levels) == ("ring", ("Simple",), ("infiniband",))
    assert cost.time_s == pytest.approx(SIMPLE_LATENCY + MOVED / 180e9)
    assert cost.time_s / US == pytest.approx(2927.8, abs=0.1)
    assert "hierarchical" not in cost.candidates  # NCCL has no such all-reduce without a reducing switch


def test_one_nic_per_two_gpus_halves_the_bandwidth_across_nodes():
    dgx = collective_cost("all_reduce", S, 16, (NVLINK, network(1)))
    shared = collective_cost("all_reduce", S, 16, (NVLINK, network(0.5)))
    # 8 x 12.5 GB/s x 0.9 = 90 GB/s a node: 131.6 us + 503.3 MB / 90 GB/s = 5724.0 us.
    assert shared.time_s == pytest.approx(SIMPLE_LATENCY + MOVED / 90e9)
    assert shared.time_s - SIMPLE_LATENCY == pytest.approx(2 * (dgx.time_s - SIMPLE_LATENCY))


def test_one_nic_a_node_at_70_percent_of_line_rate_gives_that_as_bus_bandwidth():
    # 8 GPUs x 25 GB/s x 0.125 x 0.7 = 17.5 GB/s through the node: a ring's busbw tends to it at large sizes.
    cost = collective_cost("all_reduce", 2**32, 16, (NVLINK, network(0.125, 0.7)))
    assert bus_bandwidth("all_reduce", 2**32, 16, cost.time_s) == pytest.approx(17.5e9, rel=0.001)
    # A faster network than NVLink leaves NVLink the ring's limit: 8 x 50 GB/s a node against 231 GB/s.
    fast = collective_cost("all_reduce", S, 16, (NVLINK, network(2)))
    assert fast.time_s == pytest.approx(SIMPLE_LATENCY + MOVED / B_NVLINK)


def test_a_small_all_reduce_across_nodes_pays_nccls_net_overhead_on_every_step():
    # LL: base 6.6 us, 28 steps inside at max(0.6, 1 us), 2 across at 2.7 us; 1920 B at min(180 / 4 GB/s, NCCL's
    # 39 GB/s LL cap over two nodes) = 39 GB/s.
    cost = collective_cost("all_reduce", 1024, 16, (NVLINK, network(1)))
    assert (cost.algorithm, cost.protocols) == ("ring", ("LL",))
    assert cost.time_s == pytest.approx(6.6 * US + 28 * 1.0 * US + 2 * 2.7 * US + 1920 / 39e9)


# The same levels with NCCL's tree step latencies (tuning.cc hwLatencies, Tree row: NVLink 0.6 / 1.25 / 4.0 us,
# network 5.0 / 8.5 / 14 us).
NVLINK_TREE = dataclasses.replace(NVLINK, tree_latency_s=(0.6e-6, 1.25e-6, 4.0e-6))


def with_tree(level: Interconnect) -> Interconnect:
    return dataclasses.replace(level, tree_latency_s=(5.0e-6, 8.5e-6, 14.0e-6))


def test_nccls_tree_takes_a_small_all_reduce_across_nodes_and_the_ring_a_large_one():
    levels = (NVLINK_TREE, with_tree(network(1)))
    # LL: base 6.8 us + 2 (7 x 0.6 + log2(2) x 5.0) us = 25.2 us; 1 KiB at half of min(180 x 0.92 / 3.8, 39) GB/s,
    # x 0.9, NCCL's correction for the tree at 1 KiB (floor(log2(1024 / 64)) = 4).
    small = collective_cost("all_reduce", 1024, 16, levels)
    assert (small.algorithm, small.protocols) == ("tree", ("LL",))
    assert small.time_s == pytest.approx(6.8 * US + 2 * (7 * 0.6 + 5.0) * US + 1024 / (0.9 * 39e9 / 2))
    assert small.candidates["ring"] == pytest.approx(6.6 * US + 28 * US + 2 * 2.7 * US + 1920 / 39e9)
    # Four nodes: the tree's latency grows by log2, 6.8 + 2 (4.2 + 2 x 5.0) = 35.2 us; the ring's by the ranks.
    four = collective_cost("all_reduce", 1024, 32, levels)
    assert four.algorithm == "tree" and four.time_s == pytest.approx(35.2 * US + 1024 / (0.9 * 20.4e9 / 2))
    # 256 MiB: the tree sends the buffer up and down at 0.92 / 2 of the rate, in LL128 x 120/128 (NCCL's correction
    # 1.0 at this size, Simple's 0.9): 14 + 2 (7 x 1.25 + 8.5) = 48.5 us + S / 77.6 GB/s; the ring moves 2(n-1)/n of
    # it at the whole rate and wins.
    large = collective_cost("all_reduce", S, 16, levels)
    assert large.algorithm == "ring" and large.time_s == pytest.approx(SIMPLE_LATENCY + MOVED / 180e9)
    assert large.candidates["tree"] == pytest.approx(48.5 * US + S / (180e9 * 0.46 * 120 / 128))


def test_no_tree_inside_a_node_for_other_collectives_or_without_tree_latencies():
    levels = (NVLINK_TREE, with_tree(network(1)))
    assert "tree" not in collective_cost("all_reduce", 1024, 8, levels).candidates
    assert "tree" not in collective_cost("all_gather", 1024, 16, levels).candidates
    assert "tree" not in collective_cost("all_reduce", 1024, 16, (NVLINK, network(1))).candidates


def test_all_gather_and_reduce_scatter_cross_the_network_once_a_ring():
    # 15 steps, one across: Simple 8.4 + 14 x 3.4 + 14.0 us; 15/16 S through 180 GB/s a node.
    for collective in ("all_gather", "reduce_scatter"):
        cost = collective_cost(collective, S, 16, (NVLINK, network(1)))
        assert (cost.algorithm, cost.steps) == ("ring", 15)
        assert cost.time_s == pytest.approx(8.4 * US + 14 * 3.4 * US + 14.0 * US + 15 / 16 * S / 180e9)


def test_a_reducing_switch_and_all_to_all_keep_the_hierarchical_algorithm():
    # NVLS inside the node under a tree across nodes (NCCL's NVLS tree) is what hierarchical stands for.
    h100 = collective_cost("all_reduce", S, 16, (NVLS, network(2)))
    assert "hierarchical" in h100.candidates and "ring" in h100.candidates
    assert "hierarchical" in collective_cost("all_to_all", S, 16, (NVLINK, network(1))).candidates
    # Inside one node nothing changes: the ring on NVLink alone.
    inside = collective_cost("all_reduce", S, 8, (NVLINK, network(1)))
    assert inside.levels == ("nvlink",)


def test_the_a100_profiles_network_is_one_200_gbs_nic_a_gpu():
    # castpack-nvidia's profile read as a file: this pack's session installs no other pack
    profile = Path(__file__).resolve().parents[3] / "packs/castpack-nvidia/castpack_nvidia/profiles/a100-sxm4-80gb.toml"
    a100 = castcore.load_device_file(profile)
    ib = a100.interconnect[-1]
    assert (ib.nic_bandwidth, ib.nics_per_device, ib.bandwidth) == (2.5e10, 1.0, 2.5e10)
    assert a100.interconnect[0].tree_latency_s == (0.6e-6, 1.25e-6, 4.0e-6)
    assert ib.tree_latency_s == (5.0e-6, 8.5e-6, 14.0e-6)
    cost = collective_cost("all_reduce", S, 16, a100.interconnect, a100.comm_op_cost_s)
    assert cost.time_s == pytest.approx(SIMPLE_LATENCY + MOVED / 180e9)
    assert collective_cost("all_reduce", 1024, 16, a100.interconnect).algorithm == "tree"
