"""The sections of simulate's page: the run in words, its figures and latency table, and the charts of
castcore.report.html.simulate_charts. A page made on the run draws every request and iteration; one made from
``--json`` later draws the percentiles and KV use it holds."""

from __future__ import annotations

from typing import Any

from castcore.report.html.charts import downsample, histogram
from castcore.report.html.document import (
    decimal,
    fact,
    facts,
    millis,
    notes,
    number,
    paragraph,
    seconds,
    section,
    table,
)
from castcore.report.html.serve import deployment_words, money_facts
from castcore.report.html.simulate_charts import (
    METRICS,
    STATS,
    batches,
    distributions,
    over_time,
    targets,
)
from castcore.simulation.metrics import percentile

ITERATIONS = 1200  # bars of the batch chart at most; each the mean of the iterations it stands for


def simulate_data(report: Any, figures: dict[str, Any] | None = None) -> dict[str, Any]:
    """A SimulationReport's JSON (with ``figures``: its energy and cost) and its SLO targets, and what only the run
    has: the requests' TTFT, TPOT and ITL binned, output tokens/s over time, and each iteration's batch."""
    finished = report.finished
    values = {
        "ttft": [(r.first_token_s - r.arrival_s) * 1e3 for r in finished],
        "tpot": [
            (r.finish_s - r.first_token_s) / (r.output_tokens - 1) * 1e3
            for r in finished
            if r.output_tokens > 1
        ],
        "itl": [(b - a) * 1e3 for r in finished for a, b in zip(r.token_times, r.token_times[1:])],
    }
    detail: dict[str, Any] = {"histograms": {}}
    for name, found in values.items():
        if found:
            detail["histograms"][name] = {
                **histogram(found),
                "median": percentile(found, 50),
                "p99": percentile(found, 99),
            }
    tokens = [t for r in finished for t in r.token_times]
    if tokens:
        end = max(tokens) or 1.0
        width = end / 120
        counts = [0] * 120
        for t in tokens:
            counts[min(int(t / width), 119)] += 1
        detail["throughput"] = [[width * (i + 0.5), c / width] for i, c in enumerate(counts)]
    trace = report.iterations_trace
    if trace is not None and len(trace.time):
        buckets = downsample(len(trace.time), ITERATIONS)
        detail["iterations"] = {
            "per_bar": len(buckets[0]),
            "rows": [
                [
                    b.start,
                    trace.time[b.start],
                    *(
                        sum(column[i] for i in b) / len(b)
                        for column in (trace.prefill_tokens, trace.decode_tokens, trace.running)
                    ),
                ]
                for b in buckets
            ],
        }
    return {"kind": "simulate", "results": {**report.to_dict(), **(figures or {})}, "detail": detail}


def simulate_sections(results: dict[str, Any], detail: dict[str, Any] | None) -> tuple[str, str, list[str]]:
    detail = detail or {}
    peak_kv = max((u for _, u in results.get("kv_usage") or []), default=0.0)
    lede = (
        f"{results['model']} on {results['device']} under the {results['engine']} engine's scheduler "
        f"({deployment_words(results.get('deployment') or {})}): {results['completed']:,} requests served in "
        f"{seconds(results['duration'])}"
    )
    goodput, slo = results.get("request_goodput"), targets(results)
    said = ", ".join(f"{k.upper()} at most {millis(v)}" for k, v in slo.items())
    items = [
        fact(
            "requests",
            f"{results['completed']:,}",
            f"in {seconds(results['duration'])}"
            + (f"; {results['failed']:,} failed (rejected)" if results.get("failed") else ""),
        ),
        fact(
            "request throughput",
            f"{decimal(results['request_throughput'])}/s",
            f"goodput {decimal(goodput)}/s" if number(goodput) is not None else "no SLO given",
        ),
        fact("output throughput", f"{decimal(results['output_throughput'])} tokens/s"),
        fact("median TTFT", millis(results["median_ttft_ms"]), f"p99 {millis(results['p99_ttft_ms'])}"),
        fact("median TPOT", millis(results["median_tpot_ms"]), f"p99 {millis(results['p99_tpot_ms'])}"),
        fact(
            "median end-to-end latency",
            millis(results.get("median_e2el_ms")),
            f"p99 {millis(results.get('p99_e2el_ms'))}",
        ),
        *([fact("SLO targets", said, "goodput counts the requests that meet them")] if slo else []),
        fact(
            "iterations", f"{results['iterations']:,}", f"mean batch {decimal(results['mean_running_batch'])}"
        ),
        fact("KV cache", f"{results['kv_blocks']:,} blocks", kv_detail(results, peak_kv)),
        *money_facts(results),
    ]
    warned = (
        [f"PARTIAL: interrupted; the figures are of the {results['completed']} requests finished by then"]
        if results.get("partial")
        else []
    )
    warned += [f"request {r['index']} never fit: {r['why']}" for r in (results.get("never_fit") or [])[:5]]
    warned += [f"request {r['index']} rejected: {r['why']}" for r in (results.get("rejected") or [])[:5]]
    rows = [
        [
            label,
            *((millis(results.get(f"{s}_{key}_ms")), results.get(f"{s}_{key}_ms")) for s in STATS),
            (millis(slo[key]), slo[key]) if key in slo else "-",
        ]
        for key, label in METRICS
    ]
    parts = [
        section(
            "figures",
            "Figures",
            facts(items),
            notes(warned, "warn"),
            notes(results.get("notes") or []),
            table("latency-table", ["metric", *STATS, "SLO target"], rows),
        )
    ]
    parts.append(
        section(
            "distributions",
            "TTFT, TPOT and ITL distributions",
            *distributions(results, detail),
            paragraph(
                f"Red lines: the SLO targets ({said})."
                if slo
                else "No SLO target was given (--slo-ttft, --slo-tpot), so none is drawn."
                if "slo_ttft_ms" in results
                else "This results file, saved by an earlier castcore, does not record the SLO targets "
                "(--slo-ttft, --slo-tpot)."
            ),
        )
    )
    parts.append(section("over-time", "Throughput and KV cache over time", *over_time(results, detail)))
    parts.append(section("batches", "Batch composition per iteration", batches(detail)))
    return f"castcore simulate: {results['model']} on {results['device']}", lede, parts


def kv_detail(results: dict[str, Any], peak_kv: float) -> str:
    """The KV cache's use, and the engine's rule for it with the requests it holds at once (a JSON from before
    simulate said it has none)."""
    said = f"peak use {peak_kv:.0%}, {results['preemptions']:,} preemptions"
    kv = results.get("kv_capacity")
    kv = kv if isinstance(kv, dict) else {}
    gib, held, mean = (
        number(kv.get(k)) for k in ("kv_cache_gib", "concurrent_requests", "mean_request_tokens")
    )
    if gib is None or held is None or mean is None or not isinstance(kv.get("rule"), str):
        return said
    return (
        f"{said}; {decimal(gib)} GiB by {kv['rule']}, {decimal(held)} requests at once at the mean "
        f"{decimal(mean)} tokens"
    )
