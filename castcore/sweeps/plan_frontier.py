"""``castcore plan --frontier``: for each of a traffic plan's best deployments, the curve buyers compare hardware on,
output tokens/s per device against output tokens/s per user.

One replica of the row's layout serves a closed loop of 1, 2, 4, ... requests in flight (castcore simulate
``--concurrency``), every best row's next concurrency in one round of the plan's sweep runner, until the engine's
running limit, until the throughput per device rises by less than ``RISE`` over the point before, or after
``MOST_POINTS`` points. Each point: the concurrency, the output tokens/s per user (1000 / mean TPOT in ms), the
output tokens/s per device, the p99 TPOT, and where the plan is priced the $ per million output tokens there.
A disaggregated row has no curve: castcore does not simulate a closed loop over pools.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from castcore.errors import ModelError
from castcore.options.catalog import say
from castcore.options.option import Placeholder
from castcore.simulation.presets import limits
from castcore.sweeps import plan_disaggregated, plan_traffic
from castcore.sweeps.capacity import LAYOUT_KEYS

PlanRequest = Any  # castcore.sweeps.plan's, which imports this module

MOST_POINTS = 8
RISE = 1.05  # a concurrency whose throughput per device is not 5% above the one before ends the curve
# requests per point: WAVES times the concurrency and at least FLOOR, for a loop that runs steady (--requests
# is for the plan's own traffic)
WAVES = 8
FLOOR = 32
FIGURES = (
    "output_tokens_per_s_per_user",
    "output_tokens_per_s_per_device",
    "p99_tpot_ms",
    "usd_per_million_output_tokens",
)


def check(request: PlanRequest, frontier: bool) -> None:
    """--frontier needs a plan under traffic: its best rows are the layouts the curves are drawn for."""
    if frontier and not request.traffic:
        raise ModelError(
            f"{say('frontier', True)} simulates the best layouts of a plan under traffic: give "
            f"{say('rate', Placeholder('QPS'))}, {say('concurrency', Placeholder('C'))} or {say('max_rate', True)}"
        )


def frontier(
    request: PlanRequest,
    best: list[dict[str, Any]],
    round_of: Callable[[list[dict[str, Any]]], list[dict[str, Any]]],
) -> list[list[dict[str, Any]]]:
    """Each of ``best``'s points in order of concurrency (see the module docstring); ``round_of`` runs simulate
    points' values and returns their rows in order. An empty list for a disaggregated row."""
    curves: list[list[dict[str, Any]]] = [[] for _ in best]
    shared = plan_traffic.point_values(request, False)  # a closed loop: no burstiness
    growing = {
        i: row for i, row in enumerate(best) if not plan_disaggregated.pooled(row) and not row.get("error")
    }
    concurrency = 1
    while growing and concurrency <= limits(request.engine).max_running_requests:
        values = [
            {
                **{k: row[k] for k in LAYOUT_KEYS},
                **shared,
                "dp": 1,
                "concurrency": concurrency,
                "requests": max(FLOOR, WAVES * concurrency),
            }
            for row in growing.values()
        ]
        for i, found in zip(list(growing), round_of(values)):
            if found.get("error") or found.get("never_fit"):
                del growing[i]  # this concurrency does not run: the curve ends before it
                continue
            curve = curves[i]
            point = {"concurrency": concurrency, **{k: found[k] for k in FIGURES if k in found}}
            flat = bool(curve) and point[FIGURES[1]] < RISE * curve[-1][FIGURES[1]]
            curve.append(point)
            if flat or len(curve) == MOST_POINTS:
                del growing[i]
        concurrency *= 2
    return curves
