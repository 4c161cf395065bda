"""A simulated run's steady state: the latencies of the requests that met a full system, with confidence intervals,
and whether the deployment kept up with its arrivals.

A run starts empty (the first requests meet idle devices and an empty queue) and ends draining (the last ones share
the devices with fewer and fewer others), so both ends flatter a deployment. The steady window drops the first
``WARMUP`` and the last ``DRAIN`` of the requests by arrival; its percentiles are what the deployment holds for as
long as the traffic lasts.

Saturation. A deployment whose service rate is below the arrival rate builds a queue that grows for as long as
requests keep coming: its percentiles only measure how long the run was. It is called saturated when, over the
window, it gave a first token to fewer than ``KEPT_UP`` of the requests that arrived (the requests waiting for one
grew by more than 5% of the window's arrivals); a saturated run never meets an objective. The waiting requests are
counted, not those in the system, because a run shorter than a request's life is still filling its batch: that
growth is not a queue.

Confidence intervals. Successive requests share a queue, so their latencies are correlated and the usual
independent-sample intervals are too narrow. The interval is a circular block bootstrap: the window, in arrival
order, is resampled as ``BLOCKS`` blocks of consecutive requests drawn with replacement, ``RESAMPLES`` times with a
fixed seed (the same run gives the same interval), and the 2.5th and 97.5th percentiles of the statistic over the
resamples bound it.
"""

from __future__ import annotations

import bisect
import random
import statistics
from typing import Any

from castcore.simulation.metrics import Finished, format_ms, percentile

WARMUP = 0.1
DRAIN = 0.1
KEPT_UP = 0.95
BLOCKS = 20
RESAMPLES = 200
MIN_REQUESTS = 100  # fewer in the window: no steady state is claimed
STATISTICS = ("mean", "median", "p90", "p95", "p99")


def _statistic(name: str, sorted_ms: list[float]) -> float:
    if name == "mean":
        return statistics.fmean(sorted_ms) if sorted_ms else 0.0
    return percentile(sorted_ms, 50 if name == "median" else float(name[1:]))


def _interval(values_ms: list[float], rng: random.Random) -> dict[str, list[float]]:
    """Each statistic's [value, low, high] in milliseconds: the window's own value and its 95% interval from a
    circular block bootstrap over ``values_ms`` in arrival order."""
    n = len(values_ms)
    own = sorted(values_ms)
    size = max(1, -(-n // BLOCKS))
    drawn: dict[str, list[float]] = {name: [] for name in STATISTICS}
    doubled = values_ms + values_ms  # a block may wrap past the end
    for _ in range(RESAMPLES):
        sample: list[float] = []
        while len(sample) < n:
            start = rng.randrange(n)
            sample += doubled[start : start + size]
        sample = sorted(sample[:n])
        for name in STATISTICS:
            drawn[name].append(_statistic(name, sample))
    return {
        name: [_statistic(name, own), percentile(drawn[name], 2.5), percentile(drawn[name], 97.5)]
        for name in STATISTICS
    }


def window(arrivals: list[float]) -> tuple[float, float] | None:
    """The steady window's first and last arrival, of ``arrivals`` sorted; None when it holds fewer than
    ``MIN_REQUESTS`` or no time passes in it."""
    n = len(arrivals)
    inside = arrivals[int(n * WARMUP) : n - int(n * DRAIN)]
    if len(inside) < MIN_REQUESTS or inside[-1] <= inside[0]:
        return None
    return inside[0], inside[-1]


def rates(arrivals: list[float], first_tokens: list[float], start: float, end: float) -> dict[str, Any]:
    """Over the window [start, end]: the requests a second that arrived and that were served (a first token), and
    ``saturated``; both lists sorted. Only first tokens up to ``end`` count, so a run can be judged at ``end``."""

    def waiting(t: float) -> int:
        return bisect.bisect_right(arrivals, t) - bisect.bisect_right(first_tokens, t)

    arrived = bisect.bisect_right(arrivals, end) - bisect.bisect_right(arrivals, start)
    served = arrived - (waiting(end) - waiting(start))
    return {
        "offered_rate": arrived / (end - start),
        "served_rate": served / (end - start),
        "saturated": served < KEPT_UP * arrived,
    }


def steady_state(finished: list[Finished]) -> dict[str, Any] | None:
    """The run's steady window (see the module docstring): how many requests it holds and their arrival span, the
    offered request rate over it and the served one (first tokens a second), ``saturated``, and for ``ttft`` and ``tpot`` each statistic as
    [value, low, high] in milliseconds. None when the requests did not arrive over time (offline, all at t = 0) or
    the window holds fewer than ``MIN_REQUESTS``."""
    by_arrival = sorted(finished, key=lambda r: (r.arrival_s, r.index))
    arrivals = [r.arrival_s for r in by_arrival]
    bounds = window(arrivals)
    if bounds is None:
        return None
    n = len(by_arrival)
    inside = by_arrival[int(n * WARMUP) : n - int(n * DRAIN)]
    rng = random.Random(0)
    ttft = [(r.first_token_s - r.arrival_s) * 1e3 for r in inside]
    tpot = [
        (r.finish_s - r.first_token_s) / (r.output_tokens - 1) * 1e3 for r in inside if r.output_tokens > 1
    ]
    return {
        "requests": len(inside),
        "window_s": list(bounds),
        **rates(arrivals, sorted(r.first_token_s for r in by_arrival), *bounds),
        "ttft": _interval(ttft, rng),
        "tpot": _interval(tpot, rng) if len(tpot) >= MIN_REQUESTS else None,
    }


def format_line(steady: dict[str, Any] | None) -> str | None:
    """One line for a simulation's text: the window and its p99s with their intervals, or saturation."""
    if steady is None:
        return None

    def p99(metric: str) -> str:
        figures = steady[metric]
        if figures is None:
            return ""
        value, low, high = figures["p99"]
        return f", p99 {metric.upper()} {format_ms(value)} (95% CI {format_ms(low)} to {format_ms(high)})"

    head = (
        f"steady state ({steady['requests']:,} requests, warm-up and drain excluded): "
        f"{steady['offered_rate']:.3g} requests/s arrived, {steady['served_rate']:.3g} served (first tokens)"
    )
    if steady["saturated"]:
        return head + ": SATURATED, the queue grows for as long as requests arrive"
    return head + p99("ttft") + p99("tpot")
