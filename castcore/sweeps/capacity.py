"""``castcore plan`` under traffic: deployments simulated serving requests (``castcore simulate``) instead of priced
as one static batch, judged by statistics of the requests' latencies.

The layouts are plan's (castcore.sweeps.plan_space.layouts), each with every weight dtype asked, each run as a
sweep of simulate points through the same backend, round after round:

- at ``--rate`` or ``--concurrency``: every layout with one replica; a layout that serves every request but misses an
  objective is tried again with twice the replicas (dp), the traffic split among them, up to as many as
  ``--max-devices`` holds; once a count meets, a bisection finds the fewest that do (3, 5 or 7 as well). The best meet the objectives with the most output tokens/s per device;
- with ``--max-rate``: every layout's offline throughput (every request at once) bounds its rate; a bisection
  between 0 and that bound finds the highest rate it serves within the objectives, to 5%. The best sustain the
  highest rate per device (a replica; n replicas take n times it).

Then the best are confirmed by longer simulations judged on their steady state (castcore.sweeps.plan_validation);
the rows printed are the confirming ones. Either way, per device, the fewest devices that meet the objectives.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from castcore.options.catalog import say
from castcore.simulation.metrics import format_ms
from castcore.sweeps import plan_disaggregated, plan_traffic, plan_validation
from castcore.sweeps.plan_objective import OBJECTIVES, by_device, objective_key
from castcore.sweeps.plan_space import ENGINE_LIMITS, LAYOUT_NAMES
from castcore.sweeps.spec import Command, Point, make_points

if TYPE_CHECKING:
    from castcore.sweeps.run import SweepResult

PlanRequest = Any  # castcore.sweeps.plan's, which imports this module

# What names a plan's point: its model, lengths and layout (castcore.sweeps.plan's static points)
PLAN_KEYS = ("model", "input", "output", "dtype", *LAYOUT_NAMES, "price_per_device_hour")
# and a point under traffic: the simulation's requests and engine, and the disaggregated pools
LAYOUT_KEYS = (
    *PLAN_KEYS[:-1],
    "requests",
    "engine",
    "price_per_device_hour",
    *ENGINE_LIMITS,
    *plan_disaggregated.POOLS,
)
PRECISION = (
    0.05  # the bisection stops when the rate it has not settled is within 5% of the lowest that misses
)
MOST_ROUNDS = 8


def misses(request: PlanRequest, row: dict[str, Any]) -> list[str]:
    """Why a simulated row does not meet the request: a failure, requests left unserved, an objective missed."""
    if row.get("error"):
        return [row["error"]]
    why = [f"{row['never_fit']} request(s) never fit the KV cache"] if row.get("never_fit") else []
    if row.get("stopped_saturated_s") is not None:  # stopped: its latencies only measured the queue's growth
        return [*why, plan_validation.saturation(row)]
    for metric, objective in (("ttft", request.ttft), ("tpot", request.tpot)):
        if objective is not None and row[objective.field(metric)] > objective.seconds * 1e3:
            why.append(
                f"{objective.statistic} {metric.upper()} {format_ms(row[objective.field(metric)])} over "
                f"{format_ms(objective.seconds * 1e3)}"
            )
    return why


def _rate(value: float) -> float:
    return float(f"{value:.4g}")


def search(
    request: PlanRequest,
    command: Command,
    chosen: list[dict[str, Any]],
    run: Callable[[list[Point]], SweepResult],
    slots: int = 1,
) -> dict[str, Any]:
    """The traffic search (see the module docstring) over ``chosen``, every layout's simulate values without the
    traffic; ``command`` is castcore simulate's, ``slots`` the workers ``run`` has. The fields of the plan's
    result."""
    started = time.perf_counter()
    everything: list[dict[str, Any]] = []

    def round_of(values: list[dict[str, Any]]) -> list[dict[str, Any]]:
        rows = run(make_points(command, values, values[0]["device"])).rows
        everything.extend(rows)
        return rows

    if request.max_rate:
        first, met, missed = _max_rates(request, chosen, round_of)
    else:
        first, met, missed = _replicas(request, chosen, round_of)

    def rank(rows: list[dict[str, Any]]) -> None:
        if request.max_rate:
            rows.sort(key=lambda r: (objective_key(request, r, r["max_rate"] / r["devices"]), r["devices"]))
        else:
            rows.sort(
                key=lambda r: (
                    objective_key(request, r, r["output_tokens_per_s_per_device"]),
                    r["devices"],
                    r["median_e2el_s"],
                )
            )

    def again(row: dict[str, Any], **changes: Any) -> dict[str, Any]:
        """A row's point values again: its layout, replicas and traffic, with ``changes``."""
        at_rate = request.rate is not None or request.max_rate
        traffic = {
            **plan_traffic.point_values(request, at_rate),
            **({"rate": row["max_rate"]} if request.max_rate else {}),
            **({"rate": request.rate} if request.rate is not None else {}),
            **({"concurrency": request.concurrency} if request.concurrency is not None else {}),
        }
        return {**_layout(row), **traffic, "dp": row.get("dp") or 1, **changes}

    rank(met)
    met, failed, untried = plan_validation.confirm(request, met, again, round_of, rank, slots)
    missed += failed
    missed = [r for r in missed if not plan_disaggregated.pooled(r)] + plan_disaggregated.last_tries(
        [r for r in missed if plan_disaggregated.pooled(r)], met
    )
    fewest = [
        min(mine, key=lambda r: (r["devices"], -r["output_tokens_per_s_per_device"]))
        for name in request.devices
        if (mine := [r for r in met if r["device"] == name])
    ]
    figure, _, words = OBJECTIVES.get(request.objective) or (
        ("max_rate", True, "requests/s per device")
        if request.max_rate
        else ("output_tokens_per_s_per_device", True, "output tokens/s per device")
    )
    return {
        "rows": everything,
        # the confirmed first; then, up to --top, those that met the search but were not confirmed (no margins)
        "best": (met + untried)[: request.top],
        "fewest": fewest,
        "layouts": len(chosen),
        "refused": [r for r in first if r.get("error")],
        "seconds": time.perf_counter() - started,
        "missed": missed,
        "verdict": plan_disaggregated.verdict(request, met, figure, words),
        "by_device": by_device(request, met + untried),
    }


def _layout(row: dict[str, Any]) -> dict[str, Any]:
    return {k: row[k] for k in LAYOUT_KEYS}


def _replicas(
    request: PlanRequest,
    chosen: list[dict[str, Any]],
    round_of: Callable[[list[dict[str, Any]]], list[dict[str, Any]]],
) -> tuple[list, list]:
    at_rate = request.rate is not None
    # the user's traffic beyond the lengths (castcore.sweeps.plan_traffic) in every round
    traffic = {
        **plan_traffic.point_values(request, at_rate),
        **(
            {"rate": request.rate, "stop_saturated": True}
            if at_rate
            else {"concurrency": request.concurrency}
        ),
    }
    first = round_of([{**values, **traffic, "dp": 1} for values in chosen])
    met, missed = [], []
    # Per layout still searched: [the most replicas missed, its row, the fewest met, its row].
    searched: dict[int, list[Any]] = {}
    for i, row in enumerate(first):
        why = misses(request, row)
        if not why:
            met.append(row)
        # a disaggregated layout scales by its ratios
        elif not row.get("error") and not row.get("never_fit") and not plan_disaggregated.pooled(row):
            searched[i] = [1, row, None, None]
        elif not row.get("error"):
            missed.append({**row, "missed": "; ".join(why)})
    while tried := {
        i: n for i, (low, _, high, _) in searched.items() if (n := _next_count(request, first[i], low, high))
    }:
        rows = round_of([{**_layout(first[i]), **traffic, "dp": n} for i, n in tried.items()])
        for (i, n), row in zip(tried.items(), rows):
            searched[i][slice(0, 2) if misses(request, row) else slice(2, 4)] = [n, row]
    for _, last, _, fewest in searched.values():
        if fewest:
            met.append(fewest)
        else:  # the last try of this layout
            missed.append({**last, "missed": "; ".join(misses(request, last))})
    return first, met, missed


def _next_count(request: PlanRequest, one: dict[str, Any], low: int, high: int | None) -> int | None:
    """The replica count to try next: twice the most that missed until one meets (as many as
    ``--max-devices`` holds at most), then a bisection down to the fewest that meet; None when settled. ``one`` is
    the layout's row with one replica."""
    if high is None:
        most = request.max_devices // one["devices"]
        return min(low * 2, most) if low < most else None
    return (low + high) // 2 if high - low > 1 else None


def _max_rates(
    request: PlanRequest,
    chosen: list[dict[str, Any]],
    round_of: Callable[[list[dict[str, Any]]], list[dict[str, Any]]],
) -> tuple[list, list]:
    first = round_of([{**values, "dp": 1} for values in chosen])  # all at once: the most it can serve
    # Per layout still searched: [the highest rate met and its row, the lowest rate missed].
    bounds = {
        i: [0.0, None, row["request_throughput"]]
        for i, row in enumerate(first)
        if not row.get("error") and not row.get("never_fit")
    }
    for _ in range(MOST_ROUNDS):
        open_ = [i for i, (low, _, high) in bounds.items() if high - low > PRECISION * high]
        if not open_:
            break
        tried = {i: _rate((bounds[i][0] + bounds[i][2]) / 2) for i in open_}
        at_rate = plan_traffic.point_values(request, True)
        rows = round_of(
            [
                {**_layout(first[i]), **at_rate, "dp": 1, "rate": rate, "stop_saturated": True}
                for i, rate in tried.items()
            ]
        )
        for i, row in zip(open_, rows):
            if misses(request, row):
                bounds[i][2] = tried[i]
            else:
                bounds[i][:2] = [tried[i], row]
    met = [{**row, "max_rate": low} for low, row, _ in bounds.values() if row is not None]
    missed = [
        {**first[i], "missed": f"misses the objectives even at {high:g} requests/s"}
        for i, (_, row, high) in bounds.items()
        if row is None
    ]
    missed += [
        {**row, "missed": "; ".join(misses(request, row))}
        for i, row in enumerate(first)
        if not row.get("error") and i not in bounds
    ]
    return first, met, missed


def device_prices(given: list[str] | None) -> dict[str, float]:
    """``--device-price NAME=USD ...`` as {name: dollars a device-hour}; ModelError naming a malformed one."""
    from castcore.errors import ModelError

    found: dict[str, float] = {}
    for text in given or ():
        name, _, price = text.rpartition("=")
        try:
            value = float(price)
        except ValueError:
            value = float("nan")
        if not name or not 0 < value < float("inf"):
            raise ModelError(
                f"{say('device_prices', [text])}: give NAME=USD with a price above zero, such as b200=6"
            )
        found[name] = value
    return found


def check_prices(request: PlanRequest, devices: dict[str, Any]) -> None:
    """Every --device-price names an installed device, and the cost objective has a price for each one searched."""
    from castcore.errors import ModelError

    unknown = [name for name in request.device_prices if name not in devices]
    if unknown:
        raise ModelError(
            f"{say('device_prices', [f'{unknown[0]}=...'])}: no such device; installed: {', '.join(devices)}"
        )
    unpriced = [name for name in request.devices if request.price(name) is None]
    if request.objective == "cost" and unpriced:
        raise ModelError(
            f"{say('objective', 'cost')} ranks by dollars per million output tokens: give "
            f"{say('price_per_device_hour')}, or {say('device_prices')} for {', '.join(unpriced)}"
        )


def check(request: PlanRequest) -> None:
    """What a traffic plan needs beyond the options' own checks."""
    from castcore.errors import ModelError

    if request.objective == "cost" and request.price_per_device_hour is None and not request.device_prices:
        raise ModelError(
            f"{say('objective', 'cost')} ranks by dollars per million output tokens: give "
            f"{say('price_per_device_hour')} (or {say('device_prices')} per device)"
        )
    plan_disaggregated.check(request)
    if request.max_rate and request.ttft is None and request.tpot is None:
        raise ModelError(
            f"{say('max_rate', True)} finds the highest rate that meets the objectives: give "
            f"{say('ttft')} or {say('tpot')}"
        )
