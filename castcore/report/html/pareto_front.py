"""The Pareto front of sweep's and plan's pages: throughput per device against latency, hover naming each point,
the front of the eligible rows marked and the chosen one starred; and the cells of their candidates tables."""

from __future__ import annotations

import math
from typing import Any

from castcore.report.output_files import pareto
from castcore.report.html.charts import COLOURS, figure, graph_objects, part
from castcore.report.html.document import decimal, number, paragraph, plain

LABELS = {
    "tokens_per_s_per_device": "tokens/s per device",
    "output_tokens_per_s_per_device": "output tokens/s per device",
    "step_s": "step time (s)",
    "latency_s": "request latency (s)",
    "median_e2el_s": "median end-to-end latency (s)",
    "ttft_s": "time to first token (s)",
    "tpot_s": "time per output token (s)",
    "median_e2el_ms": "median end-to-end latency (ms)",
}


def drawable(rows: list[dict[str, Any]], x_key: str, y_key: str) -> list[int]:
    """The indexes of the rows without an error whose two figures are positive (the axes are logarithmic)."""
    return [
        i
        for i, row in enumerate(rows)
        if not row.get("error") and (number(row.get(x_key)) or 0) > 0 and (number(row.get(y_key)) or 0) > 0
    ]


def _hover(row: dict[str, Any], keys: list[str]) -> str:
    return "<br>".join(f"{k}: {plain(row.get(k))}" for k in keys if row.get(k) is not None)


def front_chart(
    rows: list[dict[str, Any]],
    x_key: str,
    y_key: str,
    chosen: int | None,
    keys: list[str],
    title: str,
    eligible: list[bool],
    left_out: str,
    y_label: str | None = None,
    target: tuple[float, str] | None = None,
) -> tuple[str, set[int]]:
    """The rows by device, the front of the ``eligible`` ones marked (the others hollow, named ``left_out``),
    ``chosen`` starred and the ``target`` (an objective on the y axis: its value and words) a red line; the chart and
    the front's row indexes."""
    go = graph_objects()
    drawn = drawable(rows, x_key, y_key)
    if not drawn:
        return paragraph(f"No row without an error has both {x_key} and {y_key} to draw."), set()
    fitting = [i for i in drawn if eligible[i]]
    front = {fitting[j] for j in pareto([(rows[i][x_key], rows[i][y_key]) for i in fitting])}
    traces = []
    for n, device in enumerate(dict.fromkeys(str(rows[i].get("device")) for i in drawn)):
        mine = [i for i in drawn if str(rows[i].get("device")) == device]
        for kept in (True, False):
            some = [i for i in mine if eligible[i] == kept]
            if some:
                traces.append(
                    go.Scatter(
                        x=[rows[i][x_key] for i in some],
                        y=[rows[i][y_key] for i in some],
                        mode="markers",
                        name=device if kept else f"{device} ({left_out})",
                        text=[_hover(rows[i], keys) for i in some],
                        hovertemplate="%{text}<extra></extra>",
                        marker={
                            "color": COLOURS[n % len(COLOURS)],
                            "size": 9,
                            "symbol": "circle" if kept else "circle-open",
                        },
                    )
                )
    line = sorted(front, key=lambda i: rows[i][x_key])
    traces.append(
        go.Scatter(
            x=[rows[i][x_key] for i in line],
            y=[rows[i][y_key] for i in line],
            name="Pareto front",
            mode="lines+markers",
            line={"color": "black", "shape": "hv", "width": 1},
            marker={"size": 15, "color": "rgba(0,0,0,0)", "line": {"color": "black", "width": 1.5}},
            hoverinfo="skip",
        )
    )
    if chosen is not None and chosen in drawn:
        traces.append(
            go.Scatter(
                x=[rows[chosen][x_key]],
                y=[rows[chosen][y_key]],
                name="chosen",
                mode="markers",
                text=[_hover(rows[chosen], keys)],
                hovertemplate="chosen<br>%{text}<extra></extra>",
                marker={
                    "symbol": "star",
                    "size": 20,
                    "color": "#f2b705",
                    "line": {"color": "black", "width": 1},
                },
            )
        )
    fig = figure(
        traces,
        title,
        f"{LABELS.get(x_key, x_key)} (higher is better)",
        f"{y_label or LABELS.get(y_key, y_key)} (lower is better)",
        height=500,
    )
    fig.update_xaxes(type="log")
    fig.update_yaxes(type="log")
    if target is not None:
        fig.add_hline(y=target[0], line_color="#d62728", line_width=2)
        # an annotation on a log axis is placed by the log10 of its value
        fig.add_annotation(
            x=0,
            xref="paper",
            y=math.log10(target[0]),
            yref="y",
            text=target[1],
            showarrow=False,
            xanchor="left",
            yanchor="bottom",
            font={"color": "#d62728"},
        )
    return part(fig, "pareto"), front


def cell(value: Any) -> Any:
    """A candidates table's cell: a float shown in short, sorted by its value."""
    return (decimal(value), value) if isinstance(value, float) else value
