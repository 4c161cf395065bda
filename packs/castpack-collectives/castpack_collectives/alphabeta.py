"""The alpha-beta ring model as pure functions of bytes, group size and interconnect levels.

Kept free of torch and of OpInvoke so the numbers can be checked by hand.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from castcore import Interconnect

# Ring traffic per device, as a multiple of (n-1)/n of the collective's full size S.
# nccl-tests' doc/PERFORMANCE.md derives the same factors for its "bus bandwidth":
# all-reduce needs 2(n-1)/n * S per rank (a reduce pass then a broadcast pass), while
# all-gather and reduce-scatter each need (n-1)/n * S, S being the whole array (the
# gathered output, or the un-scattered input), i.e. per-rank count * element size * n.
PASSES = {"all_reduce": 2, "all_gather": 1, "reduce_scatter": 1}


@dataclass(frozen=True, slots=True)
class RingCost:
    """One collective's ring cost; ``level`` is None when nothing moves (a group of one)."""

    time_s: float
    comm_s: float
    overhead_s: float
    steps: int
    bytes_moved: float
    level: Interconnect | None
    fits: bool  # False: the group is larger than every level and the outermost was used


def pick_level(levels: Sequence[Interconnect], n: int) -> tuple[Interconnect, bool]:
    """The innermost level spanning ``n`` devices, else the outermost (second element False)."""
    if not levels:
        raise ValueError("no interconnect levels to choose from")
    for level in levels:
        if level.devices >= n:
            return level, True
    return levels[-1], False


def ring_cost(collective: str, nbytes: float, n: int, levels: Sequence[Interconnect],
              op_cost_s: float = 0.0) -> RingCost:
    """op_cost + steps * latency + moved / (bandwidth * efficiency) for a ring of ``n`` ranks.

    ``nbytes`` is S: the tensor for all_reduce, the gathered output for all_gather, the
    input for reduce_scatter. Steps are 2(n-1) for all_reduce and n-1 for the others.
    """
    if collective not in PASSES:
        raise ValueError(f"unknown collective {collective!r}; known: {', '.join(PASSES)}")
    if n < 1:
        raise ValueError(f"group size must be >= 1, not {n}")
    if n == 1:  # nothing leaves the device, and NCCL-style libraries skip the launch
        return RingCost(0.0, 0.0, 0.0, 0, 0.0, None, True)
    level, fits = pick_level(levels, n)
    passes = PASSES[collective]
    steps = passes * (n - 1)
    moved = passes * (n - 1) / n * nbytes
    comm_s = steps * level.latency_s + moved / (level.bandwidth * level.efficiency)
    return RingCost(comm_s + op_cost_s, comm_s, op_cost_s, steps, moved, level, fits)
