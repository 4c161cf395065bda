"""The pure ring formula against numbers worked out by hand."""

from __future__ import annotations

import pytest

from castcore import Interconnect
from castpack_collectives.alphabeta import pick_level, ring_cost

# 8 devices at 100 GB/s (half of it usable) and 1 us a hop, then 64 at 10 GB/s and 10 us.
BOARD = Interconnect(name="board", devices=8, bandwidth=1e11, latency_s=1e-6, efficiency=0.5)
NET = Interconnect(name="net", devices=64, bandwidth=1e10, latency_s=1e-5, efficiency=1.0)
LEVELS = (BOARD, NET)
S = 8e6  # bytes
OP_COST = 1e-5


def test_group_of_one_costs_nothing_even_without_levels():
    cost = ring_cost("all_reduce", S, 1, (), OP_COST)
    assert (cost.time_s, cost.steps, cost.bytes_moved, cost.level) == (0.0, 0, 0.0, None)


def test_all_reduce_two_ranks():
    # 2 steps; 2*(1/2)*8e6 = 8e6 B at 5e10 B/s = 160 us; + 2 us latency + 10 us launch
    cost = ring_cost("all_reduce", S, 2, LEVELS, OP_COST)
    assert cost.steps == 2 and cost.bytes_moved == 8e6 and cost.level is BOARD
    assert cost.comm_s == pytest.approx(162e-6)
    assert cost.time_s == pytest.approx(172e-6)
    assert cost.overhead_s == OP_COST


def test_all_reduce_eight_ranks():
    # 14 steps; 2*(7/8)*8e6 = 14e6 B at 5e10 B/s = 280 us; + 14 us + 10 us
    cost = ring_cost("all_reduce", S, 8, LEVELS, OP_COST)
    assert cost.steps == 14 and cost.bytes_moved == 14e6 and cost.level is BOARD and cost.fits
    assert cost.time_s == pytest.approx(304e-6)


@pytest.mark.parametrize("collective", ["all_gather", "reduce_scatter"])
def test_gather_and_scatter_eight_ranks(collective):
    # 7 steps; (7/8)*8e6 = 7e6 B at 5e10 B/s = 140 us; + 7 us + 10 us
    cost = ring_cost(collective, S, 8, LEVELS, OP_COST)
    assert cost.steps == 7 and cost.bytes_moved == 7e6
    assert cost.time_s == pytest.approx(157e-6)


def test_group_larger_than_first_level_uses_the_next():
    # 16 ranks > 8 on the board: 30 steps at 10 us; 2*(15/16)*8e6 = 15e6 B at 1e10 B/s = 1500 us
    cost = ring_cost("all_reduce", S, 16, LEVELS, OP_COST)
    assert cost.level is NET and cost.fits
    assert cost.time_s == pytest.approx(300e-6 + 1500e-6 + 10e-6)


def test_group_larger_than_every_level_uses_the_outermost():
    # 128 > 64: 254 steps at 10 us = 2540 us; 2*(127/128)*8e6 = 15.875e6 B at 1e10 B/s = 1587.5 us
    cost = ring_cost("all_reduce", S, 128, LEVELS, OP_COST)
    assert cost.level is NET and not cost.fits
    assert cost.time_s == pytest.approx(2540e-6 + 1587.5e-6 + 10e-6)


def test_level_choice_is_innermost_that_fits():
    assert pick_level(LEVELS, 8) == (BOARD, True)
    assert pick_level(LEVELS, 9) == (NET, True)
    assert pick_level(LEVELS, 65) == (NET, False)


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="unknown collective"):
        ring_cost("all_to_all", S, 8, LEVELS)
    with pytest.raises(ValueError, match="no interconnect levels"):
        ring_cost("all_reduce", S, 8, ())
