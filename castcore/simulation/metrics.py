"""Per-request results summed up as ``vllm bench serve --save-result`` does, so a simulation diffs against a real
benchmark file field by field.

The definitions follow ``calculate_metrics`` and ``benchmark`` in vLLM's vllm/benchmarks/serve.py (checked at
vllm-project/vllm commit 009e6d4a1cd6): a request's TTFT is from its sending to its first token, E2EL from its
sending to its last token, TPOT is (E2EL - TTFT) / (output tokens - 1) over the requests with more than one output
token, ITL the gaps between successive tokens of every request pooled together; each is reported in milliseconds as
its mean, median, standard deviation (numpy's default, the population one) and percentiles (numpy's default, linear
interpolation), all 0 when there is no value (vLLM's ``np.mean(x or 0)``). Goodput counts the requests whose TTFT
and TPOT (0 for a one-token output) are each at most its SLO, per second of the run.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from castcore.errors import ModelError
from castcore.options.catalog import say

PERCENTILES = (90, 95, 99)
METRICS = (
    ("ttft", "TTFT", "Time to First Token"),
    ("tpot", "TPOT", "Time per Output Token (excl. 1st token)"),
    ("itl", "ITL", "Inter-token Latency"),
    ("e2el", "E2EL", "End-to-end Latency"),
)


@dataclass
class Finished:
    """One request as the simulator served it, times in seconds from the start of the run (t = 0): ``arrival_s``
    when the client sent it (in a closed loop, when a slot freed), ``first_token_s`` and ``finish_s`` when its first
    and last output tokens came, ``token_times`` when each of its output tokens came (first to last), and how many
    times it was preempted."""

    index: int
    input_tokens: int
    output_tokens: int
    arrival_s: float
    first_token_s: float
    finish_s: float
    token_times: list[float] = field(default_factory=list)
    preemptions: int = 0


def percentile(values: list[float], p: float) -> float:
    """The ``p``-th percentile (0 to 100) of ``values`` by linear interpolation between the two nearest ranks,
    numpy's default method: rank p / 100 * (n - 1) in the sorted values. 0 for no values, as vLLM reports."""
    return _of_sorted(sorted(values), p)


def _of_sorted(data: list[float], p: float) -> float:
    """``percentile`` of values already sorted (a long run's token gaps are sorted once for all its statistics)."""
    if not 0 <= p <= 100:
        raise ValueError(f"percentile {p} is outside 0 to 100")
    if not data:
        return 0.0
    rank = p / 100 * (len(data) - 1)
    low = math.floor(rank)
    high = min(low + 1, len(data) - 1)
    weight = rank - low
    a, b = data[low], data[high]
    # numpy's _lerp: from the nearer end, so that the ends are exact.
    return b - (b - a) * (1 - weight) if weight >= 0.5 else a + (b - a) * weight


def _pstdev(values: list[float]) -> float:
    """The population standard deviation in floats (statistics.pstdev's exact fractions take seconds on a long
    run's token gaps)."""
    if not values:
        return 0.0
    mean = statistics.fmean(values)
    return math.sqrt(statistics.fmean([(v - mean) ** 2 for v in values]))


def _stats(name: str, seconds: list[float]) -> dict[str, float]:
    """mean/median/std/p90/p95/p99 of ``seconds`` in milliseconds under vLLM's keys (``mean_ttft_ms`` ...)."""
    ms = sorted([s * 1000 for s in seconds])
    stats = {
        f"mean_{name}_ms": statistics.fmean(ms) if ms else 0.0,
        f"median_{name}_ms": _of_sorted(ms, 50),
        f"std_{name}_ms": _pstdev(ms),
    }
    stats.update({f"p{p}_{name}_ms": _of_sorted(ms, p) for p in PERCENTILES})
    return stats


def _check_slo(value: float | None, name: str) -> None:
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or value < 0
    ):
        raise ModelError(f"{say(name, value)} (milliseconds here): give a latency objective of at least 0.")


def summarize(
    finished: list[Finished], slo_ttft_ms: float | None = None, slo_tpot_ms: float | None = None
) -> dict[str, float | int | None]:
    """The summary of a run under ``vllm bench serve --save-result``'s field names, plus ``preemptions`` (their
    total) and ``output_tokens_per_s_per_user`` (1000 / mean TPOT in ms; None without a TPOT). ``duration`` runs from t = 0 (vLLM's clock starts before the first request is sent) to the last token;
    ``request_goodput`` is None unless an SLO is given, as in vLLM."""
    _check_slo(slo_ttft_ms, "slo_ttft")
    _check_slo(slo_tpot_ms, "slo_tpot")
    if not finished:
        raise ValueError("no finished request to summarize")
    duration = max(request.finish_s for request in finished)
    if duration <= 0:
        raise ValueError(f"a run of {duration} s: the last token must come after t = 0")
    ttfts, tpots, itls, e2els, good = [], [], [], [], 0
    for request in finished:
        ttft, e2el = request.first_token_s - request.arrival_s, request.finish_s - request.arrival_s
        tpot = (e2el - ttft) / (request.output_tokens - 1) if request.output_tokens > 1 else 0.0
        if request.output_tokens > 1:
            tpots.append(tpot)
        ttfts.append(ttft)
        e2els.append(e2el)
        itls += [b - a for a, b in zip(request.token_times, request.token_times[1:])]
        good += (slo_ttft_ms is None or ttft * 1000 <= slo_ttft_ms) and (
            slo_tpot_ms is None or tpot * 1000 <= slo_tpot_ms
        )
    total_input = sum(request.input_tokens for request in finished)
    total_output = sum(request.output_tokens for request in finished)
    summary: dict[str, float | int | None] = {
        "duration": duration,
        "completed": len(finished),
        "total_input_tokens": total_input,
        "total_output_tokens": total_output,
        "request_throughput": len(finished) / duration,
        "request_goodput": None if slo_ttft_ms is None and slo_tpot_ms is None else good / duration,
        "output_throughput": total_output / duration,
        "total_token_throughput": (total_input + total_output) / duration,
    }
    for (name, _, _), values in zip(METRICS, (ttfts, tpots, itls, e2els)):
        summary.update(_stats(name, values))
    # the interactivity the run served at, as cost dashboards state it beside $ per million tokens
    mean_tpot = summary["mean_tpot_ms"]
    summary["output_tokens_per_s_per_user"] = 1000 / mean_tpot if mean_tpot else None
    summary["preemptions"] = sum(request.preemptions for request in finished)
    return summary


def format_ms(ms: float) -> str:
    """Milliseconds with three significant digits and no exponent (0.162 ms, 30.0 ms, 19,150 ms): a latency
    under a millisecond keeps its digits."""
    if not ms or not math.isfinite(ms):
        return f"{ms:g} ms"
    return f"{ms:,.{max(0, 2 - math.floor(math.log10(abs(ms))))}f} ms"


def format_table(summary: dict[str, float | int | None]) -> str:
    """The summary as text, laid out like ``vllm bench serve``'s printout."""

    def row(label: str, value: object) -> str:
        if isinstance(value, float) and label.endswith("(ms):") and 0 < value < 1:  # 0.162, not 0.16
            return f"{label:<40} {format_ms(value).removesuffix(' ms'):<10}"
        return f"{label:<40} {value:<10.2f}" if isinstance(value, float) else f"{label:<40} {value:<10}"

    lines = [
        f"{' Serving Simulation Result ':=^50}",
        row("Successful requests:", summary["completed"]),
        *([row("Failed requests:", summary["failed"])] if "failed" in summary else []),
        row("Benchmark duration (s):", summary["duration"]),
        row("Total input tokens:", summary["total_input_tokens"]),
        row("Total generated tokens:", summary["total_output_tokens"]),
        row("Request throughput (req/s):", summary["request_throughput"]),
    ]
    if summary.get("request_goodput") is not None:
        lines.append(row("Request goodput (req/s):", summary["request_goodput"]))
    lines += [
        row("Output token throughput (tok/s):", summary["output_throughput"]),
        *(
            [row("Output tokens/s per user:", summary["output_tokens_per_s_per_user"])]
            if summary.get("output_tokens_per_s_per_user") is not None
            else []
        ),
        row("Total token throughput (tok/s):", summary["total_token_throughput"]),
        row("Preemptions:", summary["preemptions"]),
    ]
    for name, short, header in METRICS:
        lines.append(f"{header:-^50}")
        lines += [
            row(f"Mean {short} (ms):", summary[f"mean_{name}_ms"]),
            row(f"Median {short} (ms):", summary[f"median_{name}_ms"]),
        ]
        lines += [row(f"P{p} {short} (ms):", summary[f"p{p}_{name}_ms"]) for p in PERCENTILES]
    lines.append("=" * 50)
    return "\n".join(lines)
