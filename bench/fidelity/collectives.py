"""Collective points: a functional collective of the source's size under a fake process group, priced by the
collectives pack, then turned into the source's metric with nccl-tests' definitions.

nccl-tests counts a collective by its size S: the tensor for all-reduce and broadcast, the gathered output for
all-gather, the input before scattering for reduce-scatter. algbw = S / time; busbw = algbw x a factor that makes
it comparable with the link rate (doc/PERFORMANCE.md): all-reduce 2(n-1)/n, all-gather and reduce-scatter (n-1)/n,
broadcast 1.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import torch

from fidelity.ops import NotExpressible, parse_dtype

FUNCTIONAL = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")


def in_metric(metric: str, unit: str, collective: str, nbytes: float, ranks: int, time_s: float) -> float:
    """One collective of S = ``nbytes`` taking ``time_s``, in the source's metric and unit."""
    if metric == "time":
        return time_s * {"s": 1.0, "ms": 1e3, "us": 1e6}[unit]
    algbw = nbytes / time_s / 1e9  # GB/s
    if metric == "algbw":
        return algbw
    if metric == "busbw":
        # nccl-tests' factors, the pack's own (the published points need the pack to be priced anyway)
        from castpack_collectives.alphabeta import bus_factor

        return algbw * bus_factor(collective, ranks)
    raise ValueError(f"unknown collective metric {metric!r}")


def plan_collective(point: dict[str, Any]) -> dict[str, Any] | NotExpressible:
    w = point["workload"]
    if w["op"] not in FUNCTIONAL:
        return NotExpressible(f"no functional collective for {w['op']!r}")
    if w.get("nodes", 1) != 1:
        return NotExpressible("a multi-node run: the published points here are one node each")
    sizes = w["bytes"] if isinstance(w["bytes"], list) else [w["bytes"]]
    algorithm = str(w.get("algorithm", ""))
    return {
        "op": w["op"],
        "ranks": w["ranks"],
        "sizes": sizes,
        "dtype": parse_dtype(w.get("dtype", "float32")),
        # The source turned NCCL's in-switch reduction off (or forced another algorithm): so does the estimate.
        "no_switch_reduction": bool(re.search(r"NVLS_ENABLE=0|NCCL_ALGO=(RING|TREE)", algorithm, re.I)),
        "describe": f"{w['op']} of {', '.join(f'{s / 2**20:g} MiB' for s in sizes)} over {w['ranks']} ranks",
    }


def without_switch_reduction(profile):
    """The profile with every interconnect level's in-network reduction turned off."""
    links = tuple(dataclasses.replace(level, reduction_efficiency=0.0) for level in profile.interconnect)
    return dataclasses.replace(profile, interconnect=links)


def collective_seconds(
    session, profile, op: str, nbytes: int, ranks: int, dtype: torch.dtype
) -> tuple[float, dict]:
    """Seconds of one functional collective of nccl-tests size S = ``nbytes`` over a fake group of ``ranks``."""
    import torch.distributed as dist
    import torch.distributed._functional_collectives as fc
    from torch.testing._internal.distributed.fake_pg import FakeStore

    import castcore

    itemsize = torch.empty((), dtype=dtype).element_size()
    per_rank = nbytes // ranks if op == "all_gather" else nbytes  # all_gather's S is the gathered output
    calls = {
        "all_reduce": lambda t, g: fc.all_reduce(t, "sum", g),
        "all_gather": lambda t, g: fc.all_gather_single(t, 0, g),
        "reduce_scatter": lambda t, g: fc.reduce_scatter_single(t, "sum", 0, g),
        "broadcast": lambda t, g: fc.broadcast(t, 0, g),
    }
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=ranks)
    try:
        group = dist.group.WORLD
        tensor = torch.empty(per_rank // itemsize, dtype=dtype, device="meta")
        captured = castcore.capture(lambda t: calls[op](t, group), tensor)
        report = session.estimate_capture(captured, profile)
    finally:
        dist.destroy_process_group()
    (row,) = [
        r
        for r in report.records
        if r.invoke.name.startswith("_c10d_functional::") and "wait" not in r.invoke.name
    ]
    detail = row.estimate.detail or {}
    how = {k: detail[k] for k in ("algorithm", "level", "steps") if k in detail}
    return report.time_s, how


def estimate_collective(session, profile, point: dict[str, Any], plan: dict[str, Any]) -> dict[str, Any]:
    """The estimate in the source's metric (the mean over the sizes when the source gives a range)."""
    measured = point["measured"]
    figures, times, how = [], [], {}
    notes = []
    if plan["no_switch_reduction"]:
        profile = without_switch_reduction(profile)
        notes.append("the source turned NVLS off: estimated without the switch's in-network reduction")
    for nbytes in plan["sizes"]:
        seconds, how = collective_seconds(session, profile, plan["op"], nbytes, plan["ranks"], plan["dtype"])
        times.append(seconds)
        figures.append(
            in_metric(measured["metric"], measured["unit"], plan["op"], nbytes, plan["ranks"], seconds)
        )
    if len(plan["sizes"]) > 1:
        notes.append(
            f"the source gives one figure over {len(plan['sizes'])} sizes; the estimate is the mean of the "
            "estimates at each"
        )
    return {
        "estimated": sum(figures) / len(figures),
        "estimated_s": sum(times) / len(times),
        "how": how,
        "notes": notes,
    }
