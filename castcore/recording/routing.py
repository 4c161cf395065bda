"""How unevenly a mixture of experts routes its tokens, recorded with the ops that see it.

Real traffic does not spread tokens evenly over experts: a few experts take most of them. castcore models the
experts' loads as NVIDIA's AIConfigurator collectors draw them for their measured MoE tables: each expert's load
a draw from a power law of exponent ``skew`` on [1, 0.8 x tokens] (on [0.01, 2] when there are fewer routed rows
than experts), scaled to the routed rows; an expert whose share rounds to no row is not touched. castcore takes
the draws' expected order statistics (the power law's quantiles) instead of random ones. ``skew`` 0 is the
balanced ideal; the collectors' documentation fits 1.01 to DeepSeek-V3/R1 and 1.2 to Qwen3-235B serving CNN/Daily
Mail and OpenOrca prompts by latency matching.

``with expert_routing(skew=...)`` (castcore.deploy.pipeline, from ``--expert-skew``) and ``with
expert_routing(top_k=...)`` (the experts forwards, which know their top-k) nest; ops captured inside both carry
``attrs["expert_skew"]`` and ``attrs["top_k"]`` (``recorded``), which the grouped-GEMM formulas read.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_routing: ContextVar[tuple[float, int | None]] = ContextVar("castcore_expert_routing", default=(0.0, None))


@contextmanager
def expert_routing(skew: float | None = None, top_k: int | None = None) -> Iterator[None]:
    """Set the routing skew, the top-k, or both, for ops captured inside; None keeps the outer value."""
    if skew is not None and (isinstance(skew, bool) or not math.isfinite(skew) or skew < 0):
        raise ValueError(f"expert skew must be a finite number >= 0, not {skew!r}")
    outer_skew, outer_k = _routing.get()
    token = _routing.set((outer_skew if skew is None else float(skew), outer_k if top_k is None else top_k))
    try:
        yield
    finally:
        _routing.reset(token)


def recorded() -> dict:
    """The attrs an op captured now carries: the skew and top-k where both are known and the skew is not 0, and
    the adapters' popularity inside ``adapter_popularity``."""
    skew, top_k = _routing.get()
    popularity = _popularity.get()
    return {
        **({"expert_skew": skew, "top_k": top_k} if skew and top_k else {}),
        **({"adapter_skew": popularity} if popularity else {}),
    }


# Multi-LoRA (castcore.deploy.lora): how unevenly requests pick their adapters, a Zipf exponent.
_popularity: ContextVar[float] = ContextVar("castcore_adapter_popularity", default=0.0)


@contextmanager
def adapter_popularity(skew: float) -> Iterator[None]:
    """Ops captured inside group their rows by adapters whose popularity falls off as rank^-skew (0: even)."""
    token = _popularity.set(skew)
    try:
        yield
    finally:
        _popularity.reset(token)


def popular_touched(items: int, draws: float, skew: float) -> float:
    """The expected number of distinct items ``draws`` independent picks reach when item i (from 1) is picked with
    probability proportional to i^-skew (Zipf): the sum over items of 1 - (1 - p_i)^draws."""
    weights = [i**-skew for i in range(1, items + 1)]
    total = sum(weights)
    return sum(1 - (1 - w / total) ** draws for w in weights)


def expert_loads(experts: int, tokens: float, top_k: int, skew: float) -> list[float]:
    """The experts' expected loads in routed rows, largest first, summing to tokens x top_k."""
    rows = tokens * top_k
    if experts < 1:
        return []
    if not skew:
        return [rows / experts] * experts
    low, high = (1.0, 0.8 * tokens) if rows > experts else (0.01, 2.0)
    if high <= low:
        return [rows / experts] * experts
    draws = [_quantile((i + 0.5) / experts, low, high, skew) for i in range(experts)]
    total = sum(draws)
    return sorted((rows * d / total for d in draws), reverse=True)


def touched(experts: int, tokens: float, top_k: int, skew: float) -> int:
    """How many experts get at least one row: those whose expected load rounds to one or more."""
    return max(1, sum(load >= 0.5 for load in expert_loads(experts, tokens, top_k, skew)))


def busiest_share(experts: int, ranks: int, tokens: float, top_k: int, skew: float) -> float:
    """The share of all routed rows the busiest of ``ranks`` expert-parallel ranks receives: its experts are
    the hottest one and a typical rest (experts are placed on ranks regardless of their load)."""
    if ranks <= 1 or experts < ranks:
        return 1.0
    loads = expert_loads(experts, tokens, top_k, skew)
    total, per_rank = sum(loads), experts // ranks
    if not total:
        return 1 / ranks
    rest = (total - loads[0]) / max(1, experts - 1)
    return min(1.0, (loads[0] + (per_rank - 1) * rest) / total)


def busiest_rows(experts: int, ranks: int, tokens: float, top_k: int, skew: float) -> float:
    """The expected routed rows on the busiest of ``ranks`` expert-parallel ranks when ``tokens`` tokens (over the
    whole group) each pick ``top_k`` of ``experts``. Balanced routing still lands unevenly: a rank's rows are taken
    as Poisson with mean R / ranks (R = tokens x top_k), so the busiest holds sum over c of 1 - P(rows <= c)^ranks,
    1 token's 8 rows over 8 ranks about 2.6; under a skew, at least the hottest rank's share (busiest_share). At
    most every row a rank can take (each token sends a rank at most min(top_k, its experts) rows)."""
    rows = tokens * top_k
    if ranks <= 1 or rows <= 0:
        return rows
    most = tokens * min(top_k, max(1, experts // ranks))
    found = max(_poisson_max(rows / ranks, ranks), rows / ranks)
    if skew:
        found = max(found, busiest_share(experts, ranks, tokens, top_k, skew) * rows)
    return min(found, most)


def _poisson_max(mean: float, n: int) -> float:
    """E[max of n independent Poisson(mean) counts] = sum over c >= 0 of 1 - F(c)^n: each term is 1 well below
    the mean (started there), and the sum stops once the terms no longer count."""
    start = max(0, int(mean - 12 * math.sqrt(mean) - 12))
    log_mean = math.log(mean)
    cdf = sum(
        math.exp(c * log_mean - mean - math.lgamma(c + 1)) for c in range(max(0, start - 40), start + 1)
    )
    total, c = float(start), start
    while True:
        term = 1 - cdf**n
        total += term
        if c > mean and term < 1e-9:
            return total
        c += 1
        cdf += math.exp(c * log_mean - mean - math.lgamma(c + 1))


def _quantile(q: float, low: float, high: float, skew: float) -> float:
    """The power law's inverse CDF on [low, high] with exponent ``skew`` (log-uniform at exactly 1)."""
    if abs(skew - 1) < 1e-9:
        return low * (high / low) ** q
    a = 1 - skew
    return ((high**a - low**a) * q + low**a) ** (1 / a)
