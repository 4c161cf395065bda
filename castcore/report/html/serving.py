"""The sections of serve's and simulate's pages: the deployment in words, the figures, the TTFT/TPOT/ITL
distributions, throughput and KV cache use over time, and the batch of each iteration. A simulate page made on the
run draws every request and iteration; one made from ``--json`` later draws the percentiles and KV use it holds."""

from __future__ import annotations

from typing import Any

from castcore.report.html.charts import COLOURS, downsample, figure, graph_objects, histogram, part
from castcore.report.html.document import (binary, fact, facts, notes, number, paragraph, seconds, section, table)
from castcore.report.html.estimate import band, banded, op_table
from castcore.simulation.metrics import percentile

METRICS = (("ttft", "time to first token"), ("tpot", "time per output token"), ("itl", "inter-token latency"),
           ("e2el", "end-to-end latency"))
STATS = ("mean", "median", "p90", "p95", "p99")
ITERATIONS = 1200  # bars of the batch chart at most; each the mean of the iterations it stands for
STEPS = 400  # points along a static batch's decode at most


def _money(results: dict[str, Any]) -> list[str]:
    """Energy and cost facts, those the results have (castcore.report.energy's figures)."""
    found = []
    if number(results.get("energy_j")) is not None:
        found.append(fact("energy", f"{results['energy_j']:,.1f} J",
                          f"{results['joules_per_output_token']:.3g} J per output token"))
    if number(results.get("usd_per_million_output_tokens")) is not None:
        found.append(fact("cost per million output tokens", f"${results['usd_per_million_output_tokens']:,.4g}",
                          f"${results['usd_per_hour']:,.2f}/hour"))
    return found


def _deployment(deployment: dict[str, Any]) -> str:
    layout = [f"{k} {deployment[k]}" for k in ("tp", "ep", "pp", "dp") if (number(deployment.get(k)) or 1) > 1]
    kinds = [f"{deployment[k]} {k.replace('_', ' ')}" for k in ("weights", "kv_cache") if deployment.get(k)]
    return ", ".join([str(deployment.get("dtype", "")), *kinds, " x ".join(layout) or "1 device per replica"])


def serve_data(report: Any) -> dict[str, Any]:
    """A ServeReport's JSON, and the op rows of its prefill and its last decode step (their error bands too)."""
    last = report.kv_points[-1]
    steps = [("prefill", report.prefill), (f"decode step at KV length {last}", report.decode[last])]
    return {"kind": "serve", "results": report.to_dict(),
            "detail": {"steps": [{"name": name, "ops": [s.to_dict() for s in step.by_op()]} for name, step in steps]}}


def serve_sections(results: dict[str, Any], detail: dict[str, Any] | None) -> tuple[str, str, list[str]]:
    detail = detail or {}
    steps = detail.get("steps") or []
    shares = [band(step["ops"])[0] / (sum(r["time_s"] for r in step["ops"]) or 1) for step in steps] or [0.0, 0.0]
    lede = (f"{results['model']} serving {results['batch']} requests of {results['input_tokens']} input + "
            f"{results['output_tokens']} output tokens at once on {results['device']} "
            f"({_deployment(results)}; {results['devices']} device(s))")
    items = [fact("TTFT", banded(results["ttft_s"], shares[0]), f"prefill of {results['batch']} requests"),
             fact("TPOT", banded(results["tpot_s"], shares[-1]), f"mean of {results['output_tokens']} steps"),
             fact("latency", seconds(results["latency_s"])),
             fact("throughput", f"{results['output_tokens_per_s']:,.1f} tokens/s",
                  f"{results['output_tokens_per_s_per_device']:,.1f} per device"),
             fact("peak memory", binary(results["peak_bytes"]),
                  f"of {binary(results['device_memory_bytes'])}: {'fits' if results['fits'] else 'does NOT fit'}"),
             *_money(results)]
    parts = [section("figures", "Figures", facts(items), paragraph(
        "± is each op's time times its kernel family's held-out median |error| on this device, added up." if any(
            shares) else "No error band: the device profile has none for these kernels." if steps else
        "No error band: a results file holds the figures, not the ops they are made of."),
        notes(results.get("notes") or []))]
    parts.append(section("request", "Token times, throughput and KV cache over the request", *_static_charts(results)))
    parts.append(section("memory", "Memory per device at the longest context", _memory_bar(results)))
    for n, step in enumerate(steps):
        parts.append(section(f"ops-{n}", f"Operators of the {step['name']}", op_table(f"ops-table-{n}", step["ops"],
                                                                                         None)))
    if not steps:
        parts.append(paragraph("The per-op tables of the prefill and decode steps are on a page made with --html on "
                               "the run."))
    return f"castcore serve: {results['model']} on {results['device']}", lede, parts


def _static_charts(results: dict[str, Any]) -> list[str]:
    """A static batch: every request has the same TTFT and the same token times, so its distributions are the
    decode step's time along the request (the fitted line through the captured steps), with throughput and KV
    cache growing as the context grows."""
    go = graph_objects()
    a, b = results["tpot_fit"]["a_s"], results["tpot_fit"]["b_s_per_token"]
    first, n = results["input_tokens"], results["output_tokens"]
    kept = sorted({int(i) for i in range(0, n, max(1, n // STEPS))} | {n - 1})
    step_ms = [(a + b * (first + k)) * 1e3 for k in kept]
    itl = figure([go.Scatter(x=[k + 2 for k in kept], y=step_ms, mode="lines", name="inter-token latency (fit)",
                             hovertemplate="token %{x}: %{y:.4g} ms<extra></extra>"),
                  go.Scatter(x=[p["kv_len"] - first + 2 for p in results["decode_points"]],
                             y=[p["time_s"] * 1e3 for p in results["decode_points"]], mode="markers",
                             name="captured steps", marker={"size": 10},
                             hovertemplate="captured at KV %{customdata}: %{y:.4g} ms<extra></extra>",
                             customdata=[p["kv_len"] for p in results["decode_points"]])],
                 f"inter-token latency along the request (TTFT {seconds(results['ttft_s'])} for every request)",
                 "output token", "ms", height=360)
    clock, times, rates, kv = results["ttft_s"], [], [], []
    replicas = number(results.get("dp")) or 1
    for k in kept:  # the clock after step k, summed in closed form: a saved file's output may be long
        step = a + b * (first + k)
        times.append(clock + (k + 1) * (a + b * first) + b * k * (k + 1) / 2)
        rates.append(replicas * results["batch"] / step)
        kv.append(results["kv_cache_bytes"] * (first + k + 1) / (first + n) / 2**20)
    over = figure([go.Scatter(x=times, y=rates, name="output tokens/s", mode="lines"),
                   go.Scatter(x=times, y=kv, name="KV cache per device (MiB)", mode="lines", yaxis="y2")],
                  "throughput and KV cache over the request", "time (s)", "output tokens/s", height=360,
                  yaxis2={"title": "KV cache (MiB)", "overlaying": "y", "side": "right"})
    return [part(itl, "itl"), part(over, "throughput"), paragraph(
        "castcore serve prices one static batch: the requests start together, so TTFT, TPOT and ITL are one value "
        "each, and ITL follows the context length. castcore simulate gives distributions under traffic.")]


def _memory_bar(results: dict[str, Any]) -> str:
    go = graph_objects()
    held = {"weights": results["weight_bytes"], "KV cache": results["kv_cache_bytes"],
            "activations": results["activation_bytes"], "free": results["free_bytes"]}
    fig = figure([go.Bar(x=[v / 2**30], y=["memory"], name=k, orientation="h",
                         hovertemplate=f"{k}: %{{x:.4g}} GiB<extra></extra>") for k, v in held.items() if v],
                 f"peak {binary(results['peak_bytes'])} of {binary(results['device_memory_bytes'])}", "GiB", "",
                 height=240, barmode="stack")
    return part(fig, "memory")


def simulate_data(report: Any, figures: dict[str, Any] | None = None) -> dict[str, Any]:
    """A SimulationReport's JSON (with ``figures``: its energy and cost), and what only the run has: the requests'
    TTFT, TPOT and ITL binned, output tokens/s over time, and each iteration's batch."""
    finished = report.finished
    values = {"ttft": [(r.first_token_s - r.arrival_s) * 1e3 for r in finished],
              "tpot": [(r.finish_s - r.first_token_s) / (r.output_tokens - 1) * 1e3 for r in finished
                       if r.output_tokens > 1],
              "itl": [(b - a) * 1e3 for r in finished for a, b in zip(r.token_times, r.token_times[1:])]}
    detail: dict[str, Any] = {"histograms": {}}
    for name, found in values.items():
        if found:
            centres, counts, width = histogram(found)
            detail["histograms"][name] = {"centres": centres, "counts": counts, "width": width,
                                          "median": percentile(found, 50), "p99": percentile(found, 99)}
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
        detail["iterations"] = {"per_bar": len(buckets[0]), "rows": [
            [b.start, trace.time[b.start], *(sum(column[i] for i in b) / len(b) for column in
                                             (trace.prefill_tokens, trace.decode_tokens, trace.running))]
            for b in buckets]}
    return {"kind": "simulate", "results": {**report.to_dict(), **(figures or {})}, "detail": detail}


def simulate_sections(results: dict[str, Any], detail: dict[str, Any] | None) -> tuple[str, str, list[str]]:
    detail = detail or {}
    peak_kv = max((u for _, u in results.get("kv_usage") or []), default=0.0)
    lede = (f"{results['model']} on {results['device']} under the {results['engine']} engine's scheduler "
            f"({_deployment(results.get('deployment') or {})}): {results['completed']:,} requests served in "
            f"{results['duration']:.3g} s")
    goodput = results.get("request_goodput")
    items = [fact("requests", f"{results['completed']:,}", f"in {results['duration']:.3g} s"),
             fact("request throughput", f"{results['request_throughput']:,.3g}/s",
                  f"goodput {goodput:,.3g}/s" if number(goodput) is not None else "no SLO given"),
             fact("output throughput", f"{results['output_throughput']:,.1f} tokens/s"),
             fact("median TTFT", f"{results['median_ttft_ms']:.4g} ms", f"p99 {results['p99_ttft_ms']:.4g} ms"),
             fact("median TPOT", f"{results['median_tpot_ms']:.4g} ms", f"p99 {results['p99_tpot_ms']:.4g} ms"),
             fact("iterations", f"{results['iterations']:,}", f"mean batch {results['mean_running_batch']:.1f}"),
             fact("KV cache", f"{results['kv_blocks']:,} blocks", f"peak use {peak_kv:.0%}, "
                  f"{results['preemptions']} preemptions"), *_money(results)]
    warned = [f"PARTIAL: interrupted; the figures are of the {results['completed']} requests finished by then"] \
        if results.get("partial") else []
    warned += [f"request {r['index']} never fit: {r['why']}" for r in (results.get("never_fit") or [])[:5]]
    rows = [[label, *((f"{results.get(f'{s}_{key}_ms', 0):.4g} ms", results.get(f"{s}_{key}_ms")) for s in STATS)]
            for key, label in METRICS]
    parts = [section("figures", "Figures", facts(items), notes(warned, "warn"), notes(results.get("notes") or []),
                     table("latency-table", ["metric", *STATS], rows))]
    parts.append(section("distributions", "TTFT, TPOT and ITL distributions", *_distributions(results, detail)))
    parts.append(section("over-time", "Throughput and KV cache over time", *_over_time(results, detail)))
    parts.append(section("batches", "Batch composition per iteration", _batches(detail)))
    return f"castcore simulate: {results['model']} on {results['device']}", lede, parts


def _distributions(results: dict[str, Any], detail: dict[str, Any]) -> list[str]:
    go = graph_objects()
    drawn = detail.get("histograms")
    if not drawn:
        fig = figure([go.Bar(x=[label for _, label in METRICS[:3]], y=[results.get(f"{s}_{k}_ms") for k, _ in
                                                                       METRICS[:3]], name=s,
                             marker_color=COLOURS[n]) for n, s in enumerate(STATS)],
                     "the statistics the results file holds", "", "ms", height=380, barmode="group")
        return [part(fig, "distributions"), paragraph("A file holds the statistics; a page made with --html on the run "
                                                      "draws every request's TTFT, TPOT and ITL.")]
    out = []
    for key, label in METRICS[:3]:
        found = drawn.get(key)
        if not found:
            out.append(paragraph(f"No {label}: no request generated more than one token."))
            continue
        fig = figure([go.Bar(x=found["centres"], y=found["counts"], width=found["width"], name=label,
                             marker_color=COLOURS[0], hovertemplate="%{x:.4g} ms: %{y} <extra></extra>")],
                     f"{label}: median {found['median']:.4g} ms, p99 {found['p99']:.4g} ms", f"{label} (ms)",
                     "count", height=320)
        for at, dash in ((found["median"], "dash"), (found["p99"], "dot")):
            fig.add_vline(x=at, line_dash=dash, line_color="black")
        out.append(part(fig, key))
    return out


def _over_time(results: dict[str, Any], detail: dict[str, Any]) -> list[str]:
    go = graph_objects()
    out = []
    if detail.get("throughput"):
        points = detail["throughput"]
        out.append(part(figure([go.Bar(x=[t for t, _ in points], y=[r for _, r in points], name="output tokens/s",
                                       marker_color=COLOURS[2])], "output tokens/s over the run", "time (s)",
                               "output tokens/s", height=320), "throughput"))
    else:
        out.append(paragraph(f"Mean output throughput {results['output_throughput']:,.1f} tokens/s; the file has no "
                             "tokens over time (a page made with --html on the run draws them)."))
    usage = results.get("kv_usage") or []
    if usage:
        out.append(part(figure([go.Scatter(x=[t for t, _ in usage], y=[u * 100 for _, u in usage], mode="lines",
                                           name="KV cache in use", line={"color": COLOURS[4]})],
                               "KV cache blocks in use", "time (s)", "% of blocks", height=300), "kv"))
    return out


def _batches(detail: dict[str, Any]) -> str:
    found = detail.get("iterations")
    if not found:
        return paragraph("The batch of each iteration is drawn on a page made with --html on the run; a results file "
                         "holds the mean running batch only.")
    go = graph_objects()
    rows = found["rows"]
    x = [r[0] for r in rows]
    fig = figure([go.Bar(x=x, y=[r[2] for r in rows], name="prefill tokens", marker_color=COLOURS[1]),
                  go.Bar(x=x, y=[r[3] for r in rows], name="decode tokens", marker_color=COLOURS[0]),
                  go.Scatter(x=x, y=[r[4] for r in rows], name="running requests", yaxis="y2", mode="lines",
                             line={"color": "black"})],
                 "tokens each iteration ran, and the requests in its batch", "iteration", "tokens", height=380,
                 barmode="stack", bargap=0, yaxis2={"title": "requests", "overlaying": "y", "side": "right"})
    per = found["per_bar"]
    return part(fig, "batches") + paragraph("Each bar is one iteration." if per == 1 else
                                            f"Each bar is the mean of {per} consecutive iterations.")
