"""How unevenly a mixture of experts routes its tokens, recorded with the ops that see it.

Real traffic does not spread tokens evenly over experts: a few experts take most of them. castcore models the
experts' loads as NVIDIA's AIConfigurator collectors draw them for their measured MoE tables: each expert's load
a draw from a power law of exponent ``skew`` on [1, 0.8 x tokens] (on [0.01, 2] when there are no more routed
rows than experts), scaled to the routed rows and rounded to whole rows, the rows rounding loses going one each to
the most loaded experts; an expert left with no row is not touched. castcore takes the draws' expected order
statistics (the power law's quantiles) instead of random ones; experts sit on expert-parallel ranks regardless of
their load, so the busiest rank is averaged over seeded random placements. ``skew`` 0 is balanced (each row an
independent, even pick). The collectors' documentation fits 1.01 to DeepSeek-V3/R1 and 1.2 to Qwen3-235B serving
CNN/Daily Mail and OpenOrca prompts by latency matching, and AIConfigurator applies 1.2 to every other MoE model:
``model_skew`` gives those as castcore's defaults.

``with expert_routing(skew=...)`` (castcore.deploy.pipeline, from ``--expert-skew``) and ``with
expert_routing(top_k=...)`` (the experts forwards, which know their top-k) nest; ops captured inside both carry
``attrs["expert_skew"]`` and ``attrs["top_k"]`` (``recorded``), which the grouped-GEMM formulas read. An
expert-parallel forward adds ``touched=``: how many of its experts the busiest rank runs (``busiest_rank``), which
its grouped products carry as ``attrs["experts_touched"]``. ``fused=True`` marks the ops an engine's fused MoE
kernel runs as one (the sort by expert, the two grouped products with the activation between them, the weighted
combine: ``attrs["fused_moe"]``); a dispatch over expert parallelism marks only the local experts' part, since its
sort and combine move rows over the network. The core prices the parts as they are; a pack whose engines fuse them
(castpack-amd, for AITER's fused MoE) reads the mark.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

# (skew, top-k, experts the busiest rank touches, inside an engine's fused MoE kernel)
_routing: ContextVar[tuple[float, int | None, float | None, bool]] = ContextVar(
    "castcore_expert_routing", default=(0.0, None, None, False)
)

# The collectors' fits: DeepSeek-V3's architecture (DeepSeek-V3/R1/V3.x, Kimi K2) 1.01, every other MoE model 1.2.
_FITTED = {"deepseek_v3": 1.01, "deepseek_v32": 1.01}
TYPICAL_SKEW = 1.2


def model_skew(config) -> float:
    """The routing skew castcore assumes for a model (its config.json dict or transformers config) when none is
    given: the collectors' fit for its family."""
    kind = config.get("model_type") if isinstance(config, dict) else getattr(config, "model_type", None)
    return _FITTED.get(kind, TYPICAL_SKEW)


@contextmanager
def expert_routing(
    skew: float | None = None,
    top_k: int | None = None,
    touched: float | None = None,
    fused: bool | None = None,
) -> Iterator[None]:
    """Set the routing skew, the top-k, the experts the busiest rank touches, whether the ops are one fused MoE
    kernel's parts, or any of them, for ops captured inside; None keeps the outer value."""
    if skew is not None and (isinstance(skew, bool) or not math.isfinite(skew) or skew < 0):
        raise ValueError(f"expert skew must be a finite number >= 0, not {skew!r}")
    outer_skew, outer_k, outer_touched, outer_fused = _routing.get()
    token = _routing.set(
        (
            outer_skew if skew is None else float(skew),
            outer_k if top_k is None else top_k,
            outer_touched if touched is None else touched,
            outer_fused if fused is None else fused,
        )
    )
    try:
        yield
    finally:
        _routing.reset(token)


def recorded() -> dict:
    """The attrs an op captured now carries: the skew and top-k where both are known and the skew is not 0, the
    experts the busiest rank touches inside an expert-parallel forward, the fused-MoE mark, and the adapters'
    popularity inside ``adapter_popularity``."""
    skew, top_k, touched, fused = _routing.get()
    popularity = _popularity.get()
    return {
        **({"expert_skew": skew, "top_k": top_k} if skew and top_k else {}),
        **({"experts_touched": touched} if touched else {}),
        **({"fused_moe": True} if fused else {}),
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


@functools.lru_cache(maxsize=1024)
def whole_loads(experts: int, tokens: float, top_k: int, skew: float) -> tuple[int, ...]:
    """The loads in whole rows, largest first, as the collectors round them: the rows rounding loses go one each
    to the most loaded experts in turn, the rows it adds come off the least loaded expert in turn, or off the most
    loaded one when that has none."""
    rows = round(tokens * top_k)
    loads = [round(load) for load in expert_loads(experts, tokens, top_k, skew)]
    missing = rows - sum(loads)
    for i in range(max(0, missing)):
        loads[i % experts] += 1
    for i in range(max(0, -missing)):
        least = experts - 1 - i % experts
        loads[least if loads[least] else loads.index(max(loads))] -= 1
    return tuple(loads)


def touched(experts: int, tokens: float, top_k: int, skew: float) -> int:
    """How many experts get at least one row: those left a whole row, and at least a token's top-k (distinct)."""
    return max(min(top_k, experts), sum(load > 0 for load in whole_loads(experts, tokens, top_k, skew)))


_PLACEMENTS = 256  # seeded random placements of the experts on ranks the busiest rank is averaged over


@functools.lru_cache(maxsize=1024)
def busiest_rank(experts: int, ranks: int, tokens: float, top_k: int, skew: float) -> tuple[float, float]:
    """The routed rows and the touched experts of the busiest of ``ranks`` expert-parallel ranks under a skew, each
    rank holding experts // ranks experts placed regardless of their load: averaged over seeded random placements
    of ``whole_loads``, the rank with the most rows in each."""
    loads = list(whole_loads(experts, tokens, top_k, skew))
    per_rank = experts // ranks
    shuffle = random.Random(0).shuffle
    rows = hit = 0
    for _ in range(_PLACEMENTS):
        shuffle(loads)
        busiest = max((loads[r * per_rank : (r + 1) * per_rank] for r in range(ranks)), key=sum)
        rows += sum(busiest)
        hit += sum(load > 0 for load in busiest)
    return rows / _PLACEMENTS, hit / _PLACEMENTS


def busiest_rows(experts: int, ranks: int, tokens: float, top_k: int, skew: float) -> float:
    """The expected routed rows on the busiest of ``ranks`` expert-parallel ranks when ``tokens`` tokens (over the
    whole group) each pick ``top_k`` of ``experts``. Balanced routing still lands unevenly: a rank's rows are taken
    as Poisson with mean R / ranks (R = tokens x top_k), so the busiest holds sum over c of 1 - P(rows <= c)^ranks,
    1 token's 8 rows over 8 ranks about 2.6; under a skew, at least the busiest rank's rows (busiest_rank). At most
    every row a rank can take (each token sends a rank at most min(top_k, its experts) rows)."""
    rows = tokens * top_k
    if ranks <= 1 or rows <= 0:
        return rows
    most = tokens * min(top_k, max(1, experts // ranks))
    found = max(_poisson_max(rows / ranks, ranks), rows / ranks)
    if skew and experts >= ranks:
        found = max(found, busiest_rank(experts, ranks, tokens, top_k, skew)[0])
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
