"""``castcore plan`` under traffic: the recommendation confirmed by longer simulations before it is printed.

The search ranks layouts on short simulations (``--requests``, 500 by default), which a deployment near saturation
can pass: its queue has not had the time to grow. So the best ``--validate`` candidates are simulated again with
``--validate-requests`` (4,000 by default) and judged on their steady state (castcore.simulation.steady: warm-up
and drain excluded, saturation detected, each statistic with a 95% confidence interval). A candidate meets only when
it is not saturated and the upper end of every objective's interval is within the objective; the margin to each
objective is kept with the row. A round's worker slots that its candidates would leave idle confirm the next ones
in rank too (more than ``--validate`` may be confirmed, at no cost in time). A replicated candidate that misses is tried again with one more replica while
``--max-devices`` holds it (under ``--max-rate``, at 90% of its rate instead); the next candidates in rank take
the places of the others, round after round, until ``--validate`` are confirmed or none is left. With
disaggregated layouts searched, the best of each kind (aggregated, disaggregated) is confirmed too, the next of
its kind taking its place when it misses, so the verdict that compares them compares confirmed layouts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from castcore.simulation.metrics import format_ms
from castcore.sweeps.plan_disaggregated import pooled

MOST_ROUNDS = 4
BACK_OFF = 0.9  # under --max-rate, the share of a rate that missed tried next
PlanRequest = Any  # castcore.sweeps.plan's, which imports this module's importer


def margins(request: PlanRequest, row: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per objective given: its statistic, the steady value with its interval (the whole run's value when the run
    has no steady window: ``low`` and ``high`` are then the value), the objective and the margin, the share of the
    objective left above the interval's upper end (negative: missed by that share)."""
    found = {}
    for metric in ("ttft", "tpot"):
        objective = getattr(request, metric)
        if objective is None:
            continue
        name = f"steady_{objective.statistic}_{metric}_ms"
        value = row.get(name)
        low, high = (row.get(name + "_low"), row.get(name + "_high")) if value is not None else (None, None)
        if value is None:
            value = low = high = row[objective.field(metric)]
        limit = objective.seconds * 1e3
        found[metric] = {
            "statistic": objective.statistic,
            "value_ms": value,
            "low_ms": low,
            "high_ms": high,
            "objective_ms": limit,
            "margin": (limit - high) / limit if limit else float("-inf"),
        }
    return found


def saturation(row: dict[str, Any]) -> str:
    return f"saturated: {row['steady_requests']:,} steady requests arrived faster than they were served"


def misses(request: PlanRequest, row: dict[str, Any]) -> list[str]:
    """Why a validation run does not confirm its layout: a failure, requests never served, saturation, or an
    interval reaching past an objective."""
    if row.get("error"):
        return [row["error"]]
    why = [f"{row['never_fit']} request(s) never fit the KV cache"] if row.get("never_fit") else []
    if row.get("saturated"):
        why.append(saturation(row))
    for metric, found in margins(request, row).items():
        if found["margin"] < 0:
            why.append(
                f"{found['statistic']} {metric.upper()} up to {format_ms(found['high_ms'])} (95% CI) over "
                f"{format_ms(found['objective_ms'])}"
            )
    return why


def confirm(
    request: PlanRequest,
    ranked: list[dict[str, Any]],
    again: Callable[..., dict[str, Any]],
    round_of: Callable[[list[dict[str, Any]]], list[dict[str, Any]]],
    rank: Callable[[list[dict[str, Any]]], None],
    slots: int = 1,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """The candidates confirmed (their validation rows, with ``margins``, ranked by ``rank``), those that were
    not (their last validation row, with ``missed``), and those never tried (their search rows, in rank), from
    ``ranked``, the search's rows that met, best first.
    ``again(row, **changes)`` gives a row's point values with changes; ``round_of`` runs a round of them on
    ``slots`` workers."""
    if not request.validate:
        return ranked, [], []
    waiting = list(ranked)
    confirmed: list[dict[str, Any]] = []
    failed: dict[tuple, dict[str, Any]] = {}  # per layout, its last validation row that missed
    retries: list[dict[str, Any]] = []  # point values of layouts tried again with one more replica
    for _ in range(MOST_ROUNDS):
        wanted = max(0, request.validate - len(confirmed) - len(retries))
        fresh, waiting = waiting[:wanted], waiting[wanted:]
        # the verdict compares the best of each kind: a kind none of whose rows is confirmed or on trial takes its next
        for kind in dict.fromkeys(pooled(row) for row in waiting):
            if not any(pooled(row) == kind for row in [*confirmed, *fresh, *retries]):
                following = next(row for row in waiting if pooled(row) == kind)
                fresh.append(following)
                waiting.remove(following)
        # a round lasts as long as its busiest worker: slots it would leave idle confirm the next in rank
        spare = (-(len(retries) + len(fresh))) % max(1, slots)
        fresh, waiting = fresh + waiting[:spare], waiting[spare:]
        chosen = retries + [again(row, requests=request.validate_requests) for row in fresh]
        if not chosen:
            break
        retries = []
        for values, row in zip(chosen, round_of(chosen)):
            why = misses(request, row)
            if not why:
                rate = {"max_rate": values["rate"]} if request.max_rate else {}
                confirmed.append({**row, **rate, "margins": margins(request, row)})
                failed.pop(_layout(values), None)
                continue
            failed[_layout(values)] = {
                **row,
                "missed": f"with {request.validate_requests:,} requests: " + "; ".join(why),
            }
            replicas = row.get("dp") or 1
            per_replica = row.get("devices", 0) // replicas
            if row.get("error"):
                continue
            if request.max_rate:  # the search's rate was its edge: a lower one may hold over more requests
                retries.append({**values, "rate": float(f"{values['rate'] * BACK_OFF:.4g}")})
            elif not pooled(row) and per_replica * (replicas + 1) <= request.max_devices:
                retries.append({**values, "dp": replicas + 1})
    rank(confirmed)
    return confirmed, list(failed.values()), waiting


def _layout(values: dict[str, Any]) -> tuple:
    """A validation point's layout: its values but the replicas, the request count and the rate."""
    return tuple(sorted((k, str(v)) for k, v in values.items() if k not in ("dp", "requests", "rate")))


def describe(found: dict[str, dict[str, Any]]) -> str:
    """The margins in words: 'p99 TTFT 773 ms (95% CI 741 ms to 802 ms), 20% under 1,000 ms'."""
    parts = []
    for metric, f in found.items():
        side = "under" if f["margin"] >= 0 else "over"
        parts.append(
            f"{f['statistic']} {metric.upper()} {format_ms(f['value_ms'])} (95% CI {format_ms(f['low_ms'])} to "
            f"{format_ms(f['high_ms'])}), {abs(f['margin']):.0%} {side} {format_ms(f['objective_ms'])}"
        )
    return "; ".join(parts)
