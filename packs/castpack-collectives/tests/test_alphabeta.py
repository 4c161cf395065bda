"""The pure alpha-beta formulas against numbers worked out by hand, and nccl-tests' bus bandwidth."""

from __future__ import annotations

import pytest

from castcore import Interconnect
from castpack_collectives.alphabeta import (COLLECTIVES, bus_bandwidth, bus_factor, collective_cost, flat,
                                            pick_level)

# A switch: any pair gets 100 GB/s * 0.5 = 5e10 B/s, one transfer at a time, 1 us a step.
BOARD = Interconnect(name="board", devices=8, bandwidth=1e11, latency_s=1e-6, efficiency=0.5, topology="switch")
# A full mesh of 8: 7e10 B/s per device = 1e10 B/s on each of the 7 links, 2 us a step.
MESH = Interconnect(name="mesh", devices=8, bandwidth=7e10, latency_s=2e-6, efficiency=1.0, topology="full-mesh")
NET = Interconnect(name="net", devices=64, bandwidth=1e10, latency_s=1e-5, efficiency=1.0, topology="clos")
RING = Interconnect(name="ring", devices=8, bandwidth=5e10, latency_s=1e-6, efficiency=1.0, topology="ring")
S = 8e6  # bytes
OP_COST = 1e-5


def test_group_of_one_costs_nothing_even_without_levels():
    cost = collective_cost("all_reduce", S, 1, (), OP_COST)
    assert (cost.time_s, cost.steps, cost.bytes_moved, cost.algorithm) == (0.0, 0, 0.0, "none")


def test_ring_all_reduce_eight_ranks():
    # 2(n-1) = 14 steps; 2*(7/8)*8e6 = 14e6 B at 5e10 B/s = 280 us; + 14 * 1 us
    phase = flat("all_reduce", "ring", S, 8, BOARD)
    assert (phase.steps, phase.bytes_moved) == (14, 14e6)
    assert phase.time_s == pytest.approx(294e-6)


@pytest.mark.parametrize("collective", ["all_gather", "reduce_scatter"])
def test_ring_gather_and_scatter_eight_ranks(collective):
    # n-1 = 7 steps; (7/8)*8e6 = 7e6 B at 5e10 B/s = 140 us; + 7 us
    phase = flat(collective, "ring", S, 8, BOARD)
    assert (phase.steps, phase.bytes_moved) == (7, 7e6)
    assert phase.time_s == pytest.approx(147e-6)


def test_recursive_doubling_all_reduce():
    # log2(8) = 3 rounds, each exchanging the whole 8e6 B: 3 us + 24e6 / 5e10 = 3 + 480 us
    phase = flat("all_reduce", "recursive_doubling", S, 8, BOARD)
    assert (phase.steps, phase.bytes_moved) == (3, 24e6)
    assert phase.time_s == pytest.approx(483e-6)


def test_small_messages_take_recursive_doubling_large_ones_the_ring():
    # 8 kB: ring 14 us + 14e3/5e10 = 14.28 us; recursive doubling 3 us + 24e3/5e10 = 3.48 us
    small = collective_cost("all_reduce", 8e3, 8, (BOARD,), OP_COST)
    assert small.algorithm == "recursive_doubling"
    assert small.time_s == pytest.approx(3.48e-6 + OP_COST)
    assert small.candidates["ring"] == pytest.approx(14.28e-6)
    large = collective_cost("all_reduce", S, 8, (BOARD,), OP_COST)
    assert large.algorithm == "ring" and large.time_s == pytest.approx(294e-6 + OP_COST)
    assert large.candidates["recursive_doubling"] == pytest.approx(483e-6)
    # direct on a switch sends to one peer at a time: the ring's cost, and the tie goes to the ring
    assert large.candidates["direct"] == pytest.approx(294e-6)


def test_a_reducing_switch_all_reduces_large_messages_in_the_network():
    # NVLS-like: 20 us start-up, then each rank sends and receives S once at 1e11 * 0.4 = 4e10 B/s.
    sharp = Interconnect(name="nvswitch", devices=8, bandwidth=1e11, latency_s=1e-6, efficiency=0.5,
                         topology="switch", reduction_efficiency=0.4, reduction_latency_s=2e-5)
    phase = flat("all_reduce", "in_switch", S, 8, sharp)
    assert (phase.steps, phase.bytes_moved) == (2, S)
    assert phase.time_s == pytest.approx(2e-5 + S / 4e10)  # 220 us, against the ring's 294 us
    large = collective_cost("all_reduce", S, 8, (sharp,), OP_COST)
    assert large.algorithm == "in_switch" and large.time_s == pytest.approx(220e-6 + OP_COST)
    assert large.candidates["ring"] == pytest.approx(294e-6)
    # 8 kB: the start-up loses to recursive doubling (3.48 us)
    assert collective_cost("all_reduce", 8e3, 8, (sharp,), OP_COST).algorithm == "recursive_doubling"
    # only all-reduce is summed in the switch, and only where the level says it can
    assert flat("all_gather", "in_switch", S, 8, sharp) is None
    assert flat("all_reduce", "in_switch", S, 8, BOARD) is None
    assert "in_switch" not in collective_cost("all_reduce", S, 8, (BOARD,), OP_COST).candidates


def test_direct_on_a_full_mesh_uses_every_link_at_once():
    # all_gather of 8: one step; 7e6 B over 7 links of 1e10 B/s = 100 us; + 2 us
    direct = collective_cost("all_gather", S, 8, (MESH,))
    assert direct.algorithm == "direct" and direct.steps == 1
    assert direct.time_s == pytest.approx(102e-6)
    # the ring uses one 1e10 B/s link a step: 7 * 2 us + 7e6 / 1e10 = 714 us
    assert direct.candidates["ring"] == pytest.approx(714e-6)
    # 4 of the 8 use 3 links: 2 us + (3/4)*8e6 / 3e10 = 202 us
    assert collective_cost("all_gather", S, 4, (MESH,)).time_s == pytest.approx(202e-6)
    # all_reduce = reduce_scatter + all_gather: 2 * 2 us + 14e6 / 7e10 = 204 us
    assert collective_cost("all_reduce", S, 8, (MESH,)).time_s == pytest.approx(204e-6)


def test_a_ring_topology_offers_only_the_ring():
    assert flat("all_reduce", "recursive_doubling", S, 8, RING) is None
    assert flat("all_reduce", "direct", S, 8, RING) is None
    cost = collective_cost("all_reduce", 8e3, 8, (RING,))
    assert cost.algorithm == "ring" and set(cost.candidates) == {"ring"}


@pytest.mark.parametrize("collective", ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast"])
@pytest.mark.parametrize("level", [BOARD, MESH, NET, RING], ids=lambda level: level.topology)
def test_every_collective_runs_on_every_topology(collective, level):
    cost = collective_cost(collective, S, 8, (level,))
    assert cost.time_s > 0 and cost.algorithm in cost.candidates


def test_all_to_all_on_a_ring_forwards_each_block_its_distance():
    # 8 ranks, blocks of 1e6 B: rank r's block for r + d crosses d links, 8 x (1 + ... + 7) = 224 crossings over
    # 8 links, so each carries 28 blocks, forwarded in 7 steps: 7 x 1 us + 28e6 / 5e10 = 567 us
    a2a = collective_cost("all_to_all", S, 8, (RING,))
    assert a2a.algorithm == "ring" and a2a.time_s == pytest.approx(567e-6)


def test_all_to_all_and_broadcast():
    # all_to_all has no ring; on the mesh, direct: 2 us + 7e6 / 7e10 = 102 us
    a2a = collective_cost("all_to_all", S, 8, (MESH,))
    assert a2a.algorithm == "direct" and "ring" not in a2a.candidates
    assert a2a.time_s == pytest.approx(102e-6)
    # Bruck on the switch: 3 rounds of half the buffer: 3 us + 3 * 4e6 / 5e10 = 243 us
    assert flat("all_to_all", "recursive_doubling", S, 8, BOARD).time_s == pytest.approx(243e-6)
    # broadcast, pipelined ring: 7 us + 8e6 / 5e10 = 167 us; binomial tree: 3 * (1 us + 160 us) = 483 us
    bcast = collective_cost("broadcast", S, 8, (BOARD,))
    assert bcast.algorithm == "ring" and bcast.time_s == pytest.approx(167e-6)
    assert bcast.candidates["recursive_doubling"] == pytest.approx(483e-6)


def test_hierarchical_all_reduce_across_two_levels():
    # 16 ranks = 2 boards of 8. Inside: reduce_scatter of 8e6 B, recursive halving 3 us + 7e6/5e10 = 143 us
    # (ring 147 us). Across: all_reduce of 8e6/8 = 1e6 B between 2 ranks on the net, recursive doubling
    # 10 us + 1e6/1e10 = 110 us (ring 120 us). Inside: all_gather, 143 us. Total 396 us.
    cost = collective_cost("all_reduce", S, 16, (BOARD, NET), OP_COST)
    assert cost.algorithm == "hierarchical" and cost.levels == ("board", "net")
    assert [(p.collective, p.algorithm, p.level.name, p.ranks) for p in cost.phases] == [
        ("reduce_scatter", "recursive_doubling", "board", 8), ("all_reduce", "recursive_doubling", "net", 2),
        ("all_gather", "recursive_doubling", "board", 8)]
    assert cost.time_s == pytest.approx(396e-6 + OP_COST)
    # flat on the net: the ring, 30 * 10 us + 2*(15/16)*8e6 / 1e10 = 300 + 1500 us
    assert cost.candidates["ring"] == pytest.approx(1800e-6)


def test_group_larger_than_every_level_uses_the_outermost():
    assert pick_level((BOARD, NET), 8) == (BOARD, True)
    assert pick_level((BOARD, NET), 9) == (NET, True)
    assert pick_level((BOARD, NET), 65) == (NET, False)
    cost = collective_cost("all_reduce", S, 128, (BOARD, NET))
    assert not cost.fits and cost.levels[-1] == "net"


def test_bus_factors_are_nccl_tests_definitions():
    # nccl-tests doc/PERFORMANCE.md: busbw = algbw * factor
    assert bus_factor("all_reduce", 8) == pytest.approx(2 * 7 / 8)
    assert bus_factor("all_gather", 8) == pytest.approx(7 / 8)
    assert bus_factor("reduce_scatter", 8) == pytest.approx(7 / 8)
    assert bus_factor("all_to_all", 8) == pytest.approx(7 / 8)
    assert bus_factor("broadcast", 8) == 1.0
    # algbw = S / t: 8e6 B in 1 ms is 8e9 B/s; an 8-rank all_reduce at that speed is 14e9 B/s on the bus
    assert bus_bandwidth("all_reduce", 8e6, 8, 1e-3) == pytest.approx(14e9)


@pytest.mark.parametrize("n", [2, 4, 8])
@pytest.mark.parametrize("collective", COLLECTIVES)
def test_bandwidth_optimal_algorithms_reach_the_link_bandwidth_as_bus_bandwidth(collective, n):
    # With no latency, the bus bandwidth of the ring (switch) and of direct on a full mesh of n is the
    # level's bandwidth * efficiency, exactly as nccl-tests' busbw is meant to compare with the link.
    switch = Interconnect(name="sw", devices=8, bandwidth=1e11, latency_s=0.0, efficiency=0.5)
    mesh = Interconnect(name="mesh", devices=n, bandwidth=7e10, latency_s=0.0, efficiency=0.5, topology="full-mesh")
    if collective != "all_to_all":
        ring = flat(collective, "ring", S, n, switch)
        assert bus_bandwidth(collective, S, n, ring.time_s) == pytest.approx(5e10)
    if collective != "broadcast":  # a direct broadcast is bound by the root sending n-1 copies
        direct = flat(collective, "direct", S, n, mesh)
        assert bus_bandwidth(collective, S, n, direct.time_s) == pytest.approx(3.5e10)


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="unknown collective"):
        collective_cost("all_to_one", S, 8, (BOARD,))
    with pytest.raises(ValueError, match="no interconnect levels"):
        collective_cost("all_reduce", S, 8, ())
    with pytest.raises(ValueError, match="whole number"):
        collective_cost("all_reduce", S, 0, (BOARD,))
    with pytest.raises(ValueError, match="unknown algorithm"):
        collective_cost("all_reduce", S, 8, (BOARD,), algorithms=("butterfly",))
