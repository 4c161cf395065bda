"""The sections of serve's and simulate's pages: the deployment in words, the figures, the TTFT/TPOT/ITL
distributions, throughput and KV cache use over time, and the batch of each iteration. A simulate page made on the
run draws every request and iteration; one made from ``--json`` later draws the percentiles and KV use it holds."""

from __future__ import annotations

from typing import Any

from castcore.report.html.charts import (
    COLOURS,
    count_axis,
    downsample,
    figure,
    graph_objects,
    histogram,
    part,
)
from castcore.report.html.document import (
    binary,
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
from castcore.report.html.estimate import band, banded, op_table
from castcore.simulation.metrics import percentile

METRICS = (
    ("ttft", "time to first token"),
    ("tpot", "time per output token"),
    ("itl", "inter-token latency"),
    ("e2el", "end-to-end latency"),
)
STATS = ("mean", "median", "p90", "p95", "p99")
ITERATIONS = 1200  # bars of the batch chart at most; each the mean of the iterations it stands for
STEPS = 400  # points along a static batch's decode at most
SLOS = ("ttft", "tpot")  # the targets simulate takes (--slo-ttft, --slo-tpot)
SLO = "#d62728"  # the colour of an SLO target's line


def _money(results: dict[str, Any]) -> list[str]:
    """Energy and cost facts, those the results have (castcore.report.energy's figures)."""
    found = []
    if number(results.get("energy_j")) is not None:
        found.append(
            fact(
                "energy",
                f"{decimal(results['energy_j'])} J",
                f"{decimal(results['joules_per_output_token'], 3)} J per output token",
            )
        )
    if number(results.get("usd_per_million_output_tokens")) is not None:
        found.append(
            fact(
                "cost per million output tokens",
                f"${decimal(results['usd_per_million_output_tokens'])}",
                f"${results['usd_per_hour']:,.2f}/hour",
            )
        )
    return found


def _deployment(deployment: dict[str, Any]) -> str:
    """The layout and the dtypes as run: weights, activations and KV cache each (the model's dtype where not set)."""
    layout = [
        f"{k} {deployment[k]}" for k in ("tp", "ep", "pp", "dp") if (number(deployment.get(k)) or 1) > 1
    ]
    base = deployment.get("dtype") or "the model's dtype"
    kinds = [
        f"{name} {deployment.get(k) or base}"
        for k, name in (("weights", "weights"), ("activations", "activations"), ("kv_cache", "KV cache"))
    ]
    return ", ".join([*kinds, " x ".join(layout) or "1 device per replica"])


def serve_data(report: Any) -> dict[str, Any]:
    """A ServeReport's JSON, and the op rows of its prefill and its last decode step (their error bands too)."""
    last = report.kv_points[-1]
    steps = [("prefill", report.prefill), (f"decode step at KV length {last}", report.decode[last])]
    return {
        "kind": "serve",
        "results": report.to_dict(),
        "detail": {
            "steps": [{"name": name, "ops": [s.to_dict() for s in step.by_op()]} for name, step in steps]
        },
    }


def serve_sections(results: dict[str, Any], detail: dict[str, Any] | None) -> tuple[str, str, list[str]]:
    detail = detail or {}
    steps = detail.get("steps") or []
    shares = [band(step["ops"])[0] / (sum(r["time_s"] for r in step["ops"]) or 1) for step in steps] or [
        0.0,
        0.0,
    ]
    lede = (
        f"{results['model']} serving {results['batch']} requests of {results['input_tokens']} input + "
        f"{results['output_tokens']} output tokens at once on {results['device']} "
        f"({_deployment(results)}; {results['devices']} device(s))"
    )
    items = [
        fact("TTFT", banded(results["ttft_s"], shares[0]), f"prefill of {results['batch']} requests"),
        fact("TPOT", banded(results["tpot_s"], shares[-1]), f"mean of {results['output_tokens']} steps"),
        fact("latency", seconds(results["latency_s"])),
        fact(
            "throughput",
            f"{decimal(results['output_tokens_per_s'])} tokens/s",
            f"{decimal(results['output_tokens_per_s_per_device'])} per device",
        ),
        fact(
            "peak memory",
            binary(results["peak_bytes"]),
            f"of {binary(results['device_memory_bytes'])}: {'fits' if results['fits'] else 'does NOT fit'}",
        ),
        *_money(results),
    ]
    parts = [
        section(
            "figures",
            "Figures",
            facts(items),
            paragraph(
                "± is each op's time times its kernel family's held-out median |error| on this device, added up."
                if any(shares)
                else "No error band: the device profile has none for these kernels."
                if steps
                else "No error band: a results file holds the figures, not the ops they are made of."
            ),
            notes(results.get("notes") or []),
        )
    ]
    parts.append(
        section("request", "Token times, throughput and KV cache over the request", *_static_charts(results))
    )
    parts.append(section("memory", "Memory per device at the longest context", _memory_bar(results)))
    for n, step in enumerate(steps):
        parts.append(
            section(
                f"ops-{n}", f"Operators of the {step['name']}", op_table(f"ops-table-{n}", step["ops"], None)
            )
        )
    if not steps:
        parts.append(
            paragraph(
                "The per-op tables of the prefill and decode steps are on a page made with --html on the run."
            )
        )
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
    itl = figure(
        [
            go.Scatter(
                x=[k + 2 for k in kept],
                y=step_ms,
                mode="lines",
                name="inter-token latency (fit)",
                hovertemplate="token %{x}: %{y:.4g} ms<extra></extra>",
            ),
            go.Scatter(
                x=[p["kv_len"] - first + 2 for p in results["decode_points"]],
                y=[p["time_s"] * 1e3 for p in results["decode_points"]],
                mode="markers",
                name="captured steps",
                marker={"size": 10},
                hovertemplate="captured at KV %{customdata}: %{y:.4g} ms<extra></extra>",
                customdata=[p["kv_len"] for p in results["decode_points"]],
            ),
        ],
        f"inter-token latency along the request (TTFT {seconds(results['ttft_s'])} for every request)",
        "output token",
        "ms",
        height=360,
    )
    clock, times, rates, kv = results["ttft_s"], [], [], []
    replicas = number(results.get("dp")) or 1
    for k in kept:  # the clock after step k, summed in closed form: a saved file's output may be long
        step = a + b * (first + k)
        times.append(clock + (k + 1) * (a + b * first) + b * k * (k + 1) / 2)
        rates.append(replicas * results["batch"] / step)
        kv.append(results["kv_cache_bytes"] * (first + k + 1) / (first + n) / 2**20)
    over = figure(
        [
            go.Scatter(x=times, y=rates, name="output tokens/s", mode="lines"),
            go.Scatter(x=times, y=kv, name="KV cache per device (MiB)", mode="lines", yaxis="y2"),
        ],
        "throughput and KV cache over the request",
        "time (s)",
        "output tokens/s",
        height=360,
        yaxis2={"title": "KV cache (MiB)", "overlaying": "y", "side": "right"},
    )
    return [
        part(itl, "itl"),
        part(over, "throughput"),
        paragraph(
            "castcore serve prices one static batch: the requests start together, so TTFT, TPOT and ITL are one value "
            "each, and ITL follows the context length. castcore simulate gives distributions under traffic."
        ),
    ]


def _memory_bar(results: dict[str, Any]) -> str:
    go = graph_objects()
    held = {
        "weights": results["weight_bytes"],
        "KV cache": results["kv_cache_bytes"],
        "activations": results["activation_bytes"],
        "free": results["free_bytes"],
    }
    fig = figure(
        [
            go.Bar(
                x=[v / 2**30],
                y=["memory"],
                name=k,
                orientation="h",
                hovertemplate=f"{k}: %{{x:.4g}} GiB<extra></extra>",
            )
            for k, v in held.items()
            if v
        ],
        f"peak {binary(results['peak_bytes'])} of {binary(results['device_memory_bytes'])}",
        "GiB",
        "",
        height=240,
        barmode="stack",
    )
    return part(fig, "memory")


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


def targets(results: dict[str, Any]) -> dict[str, float]:
    """The SLO targets the run was given (--slo-ttft, --slo-tpot), in ms, by metric."""
    return {k: results[f"slo_{k}_ms"] for k in SLOS if number(results.get(f"slo_{k}_ms")) is not None}


def simulate_sections(results: dict[str, Any], detail: dict[str, Any] | None) -> tuple[str, str, list[str]]:
    detail = detail or {}
    peak_kv = max((u for _, u in results.get("kv_usage") or []), default=0.0)
    lede = (
        f"{results['model']} on {results['device']} under the {results['engine']} engine's scheduler "
        f"({_deployment(results.get('deployment') or {})}): {results['completed']:,} requests served in "
        f"{seconds(results['duration'])}"
    )
    goodput, slo = results.get("request_goodput"), targets(results)
    said = ", ".join(f"{k.upper()} at most {millis(v)}" for k, v in slo.items())
    items = [
        fact("requests", f"{results['completed']:,}", f"in {seconds(results['duration'])}"),
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
        fact(
            "KV cache",
            f"{results['kv_blocks']:,} blocks",
            f"peak use {peak_kv:.0%}, {results['preemptions']:,} preemptions",
        ),
        *_money(results),
    ]
    warned = (
        [f"PARTIAL: interrupted; the figures are of the {results['completed']} requests finished by then"]
        if results.get("partial")
        else []
    )
    warned += [f"request {r['index']} never fit: {r['why']}" for r in (results.get("never_fit") or [])[:5]]
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
            *_distributions(results, detail),
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
    parts.append(section("over-time", "Throughput and KV cache over time", *_over_time(results, detail)))
    parts.append(section("batches", "Batch composition per iteration", _batches(detail)))
    return f"castcore simulate: {results['model']} on {results['device']}", lede, parts


def _distributions(results: dict[str, Any], detail: dict[str, Any]) -> list[str]:
    go = graph_objects()
    drawn, slo = detail.get("histograms"), targets(results)
    if not drawn:
        labels = [label for _, label in METRICS[:3]]
        traces = [
            go.Bar(
                x=labels,
                y=[results.get(f"{s}_{k}_ms") for k, _ in METRICS[:3]],
                name=s,
                marker_color=COLOURS[n],
            )
            for n, s in enumerate(STATS)
        ]
        traces += [
            go.Scatter(
                x=[label],
                y=[slo[k]],
                mode="markers",
                name=f"{k.upper()} SLO target",
                marker={"symbol": "line-ew-open", "size": 120, "line": {"width": 3, "color": SLO}},
                hovertemplate=f"{k.upper()} SLO target {millis(slo[k])}<extra></extra>",
            )
            for k, label in METRICS[:3]
            if k in slo
        ]
        fig = figure(traces, "the statistics the results file holds", "", "ms", height=380, barmode="group")
        fig.update_yaxes(rangemode="tozero")
        return [
            part(fig, "distributions"),
            paragraph(
                "A file holds the statistics; a page made with --html on the run "
                "draws every request's TTFT, TPOT and ITL."
            ),
        ]
    out = []
    for key, label in METRICS[:3]:
        found = drawn.get(key)
        if not found:
            out.append(paragraph(f"No {label}: no request generated more than one token."))
            continue
        out.append(part(_histogram_chart(found, label, slo.get(key)), key))
    return out


def _histogram_chart(found: dict[str, Any], label: str, slo: float | None) -> Any:
    go = graph_objects()
    edges = found["edges"]
    fig = figure(
        [
            go.Bar(
                x=[(a + b) / 2 for a, b in zip(edges, edges[1:])],
                y=found["counts"],
                width=[b - a for a, b in zip(edges, edges[1:])],
                name=label,
                marker_color=COLOURS[0],
                marker_line_width=0,
                customdata=[[millis(a), millis(b)] for a, b in zip(edges, edges[1:])],
                hovertemplate="%{customdata[0]} to %{customdata[1]}: %{y:,d}<extra></extra>",
            )
        ],
        f"{label}: median {millis(found['median'])}, p99 {millis(found['p99'])}",
        f"{label} (ms)",
        "requests" if label != "inter-token latency" else "token gaps",
        height=320,
        showlegend=False,
    )
    fig.update_yaxes(**count_axis(max(found["counts"])))
    if found["log"]:
        fig.update_xaxes(type="log")
    low, high = edges[0], edges[-1]
    near = [
        at is not None and low - (high - low) <= at <= high + (high - low)
        for at in (found["median"], found["p99"], slo)
    ]
    for at, dash, colour, shown in zip(
        (found["median"], found["p99"], slo), ("dash", "dot", "solid"), ("black", "black", SLO), near
    ):
        if shown:
            fig.add_vline(x=at, line_dash=dash, line_color=colour, line_width=2 if colour == SLO else 1)
    if slo is not None and not near[2]:  # far off the values: a line at the edge it lies beyond, so the bars
        # keep their width
        edge = 1 if slo > high else 0
        fig.add_shape(
            type="line",
            xref="paper",
            yref="paper",
            x0=edge,
            x1=edge,
            y0=0,
            y1=1,
            line={"color": SLO, "width": 2, "dash": "dash"},
        )
        fig.add_annotation(
            text=f"SLO target {millis(slo)} {'beyond →' if edge else '← beyond'}",
            xref="paper",
            yref="paper",
            x=edge,
            y=0.95,
            showarrow=False,
            xanchor="right" if edge else "left",
            font={"size": 12, "color": SLO},
            bgcolor="rgba(255,255,255,0.8)",
        )
    left = [
        f"{found['below']:,} below the range, from {millis(found['smallest'])}" if found["below"] else "",
        f"{found['above']:,} above it, up to {millis(found['largest'])}" if found["above"] else "",
        "log axis: the values span 20x or more" if found["log"] else "",
    ]
    if any(left):
        fig.add_annotation(
            text="; ".join(t for t in left if t),
            xref="paper",
            yref="paper",
            x=1,
            y=1.02,
            showarrow=False,
            xanchor="right",
            yanchor="bottom",
            font={"size": 11, "color": "#5b6573"},
        )
    return fig


def _over_time(results: dict[str, Any], detail: dict[str, Any]) -> list[str]:
    go = graph_objects()
    out = []
    if detail.get("throughput"):
        points = detail["throughput"]
        out.append(
            part(
                figure(
                    [
                        go.Bar(
                            x=[t for t, _ in points],
                            y=[r for _, r in points],
                            name="output tokens/s",
                            marker_color=COLOURS[2],
                        )
                    ],
                    "output tokens/s over the run",
                    "time (s)",
                    "output tokens/s",
                    height=320,
                ),
                "throughput",
            )
        )
    else:
        out.append(
            paragraph(
                f"Mean output throughput {decimal(results['output_throughput'])} tokens/s; the file has "
                "no tokens over time (a page made with --html on the run draws them)."
            )
        )
    usage = results.get("kv_usage") or []
    if usage:
        out.append(
            part(
                figure(
                    [
                        go.Scatter(
                            x=[t for t, _ in usage],
                            y=[u * 100 for _, u in usage],
                            mode="lines",
                            name="KV cache in use",
                            line={"color": COLOURS[4]},
                        )
                    ],
                    "KV cache blocks in use",
                    "time (s)",
                    "% of blocks",
                    height=300,
                ),
                "kv",
            )
        )
    return out


def _batches(detail: dict[str, Any]) -> str:
    """Two panels over the iterations, each from 0 on its own scale: the prefill tokens above, the decode tokens and
    the running requests below (a few decode tokens beside a prompt's thousands would not show in one stack)."""
    found = detail.get("iterations")
    if not found:
        return paragraph(
            "The batch of each iteration is drawn on a page made with --html on the run; a results file "
            "holds the mean running batch only."
        )
    go = graph_objects()
    from plotly.subplots import make_subplots

    rows = found["rows"]
    x = [r[0] for r in rows]
    fig = figure(
        [],
        "tokens each iteration ran, and the requests in its batch",
        "",
        "",
        height=460,
        bargap=0,
        grid=make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.1),
    )
    fig.add_trace(
        go.Bar(
            x=x, y=[r[2] for r in rows], name="prefill tokens", marker_color=COLOURS[1], marker_line_width=0
        ),
        row=1,
        col=1,
    )
    fig.add_trace(
        go.Bar(
            x=x, y=[r[3] for r in rows], name="decode tokens", marker_color=COLOURS[0], marker_line_width=0
        ),
        row=2,
        col=1,
    )
    fig.add_trace(
        go.Scatter(
            x=x,
            y=[r[4] for r in rows],
            name="running requests",
            mode="lines",
            line={"color": "black", "width": 1.5},
        ),
        row=2,
        col=1,
    )
    fig.update_yaxes(title_text="prefill tokens", row=1, col=1, **count_axis(max(r[2] for r in rows)))
    fig.update_yaxes(
        title_text="decode tokens, requests", row=2, col=1, **count_axis(max(max(r[3], r[4]) for r in rows))
    )
    fig.update_xaxes(title_text="iteration", row=2, col=1)
    per = found["per_bar"]
    return part(fig, "batches") + paragraph(
        "Each bar is one iteration." if per == 1 else f"Each bar is the mean of {per} consecutive iterations."
    )
