"""The charts of simulate's page: the TTFT, TPOT and ITL distributions with their SLO targets, throughput and KV
cache over time, and the batch of each iteration; from a results file, what it holds instead."""

from __future__ import annotations

from typing import Any

from castcore.report.html.charts import COLOURS, count_axis, figure, graph_objects, part
from castcore.report.html.document import decimal, millis, number, paragraph

METRICS = (
    ("ttft", "time to first token"),
    ("tpot", "time per output token"),
    ("itl", "inter-token latency"),
    ("e2el", "end-to-end latency"),
)
STATS = ("mean", "median", "p90", "p95", "p99")
SLOS = ("ttft", "tpot")  # the targets simulate takes (--slo-ttft, --slo-tpot)
SLO = "#d62728"  # the colour of an SLO target's line


def targets(results: dict[str, Any]) -> dict[str, float]:
    """The SLO targets the run was given (--slo-ttft, --slo-tpot), in ms, by metric."""
    return {k: results[f"slo_{k}_ms"] for k in SLOS if number(results.get(f"slo_{k}_ms")) is not None}


def distributions(results: dict[str, Any], detail: dict[str, Any]) -> list[str]:
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


def over_time(results: dict[str, Any], detail: dict[str, Any]) -> list[str]:
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


def batches(detail: dict[str, Any]) -> str:
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
