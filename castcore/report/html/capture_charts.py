"""The charts of an estimate's capture: each group of calls (or each op, from a file) on the roofline, and the
memory held op by op over the capture (or at its peak, from a file)."""

from __future__ import annotations

from typing import Any

from castcore.report.html.charts import COLOURS, figure, graph_objects, part
from castcore.report.html.document import binary, esc, number, paragraph, seconds


def roofline(ops: list[dict[str, Any]], detail: dict[str, Any]) -> str:
    """Each group of calls (on the run) or each op (from a file) at its arithmetic intensity and achieved FLOP/s,
    under the device's roofs when the page was made on the run."""
    go = graph_objects()
    calls = detail.get("points")
    shown = [
        p
        for p in (calls if calls is not None else ops)
        if (number(p.get("flops")) or 0) > 0
        and (number(p.get("bytes")) or 0) > 0
        and (number(p.get("time_s")) or 0) > 0
    ]
    if not shown:
        return paragraph("No op has both FLOPs and bytes to place on a roofline.")
    traces = []
    for n, bound in enumerate(dict.fromkeys(p["bound"] for p in shown)):
        mine = [p for p in shown if p["bound"] == bound]
        traces.append(
            go.Scatter(
                x=[p["flops"] / p["bytes"] for p in mine],
                y=[p["flops"] / p["time_s"] for p in mine],
                mode="markers",
                name=f"{bound}-bound",
                marker={"color": COLOURS[n % len(COLOURS)], "opacity": 0.7, "size": 9},
                customdata=[
                    [
                        p["op"],
                        p.get("shapes", "not in the results file"),
                        p.get("module", "-"),
                        p["calls"],
                        seconds(p["time_s"]),
                    ]
                    for p in mine
                ],
                hovertemplate="<b>%{customdata[0]}</b><br>shapes: %{customdata[1]}<br>module: %{customdata[2]}<br>"
                "%{customdata[3]} calls, %{customdata[4]}<br>%{x:.3g} FLOP/byte, %{y:.3g} FLOP/s"
                "<extra></extra>",
            )
        )
    roof = detail.get("roof")
    said = "Hover a point for its op, input shapes and module (layer numbers folded to N)."
    if roof:
        low = min(p["flops"] / p["bytes"] for p in shown) / 4
        ridge = roof["flops"] / roof["bandwidth"]
        high = max(max(p["flops"] / p["bytes"] for p in shown) * 4, ridge * 4)
        traces.append(
            go.Scatter(
                x=[low, ridge, high],
                y=[low * roof["bandwidth"], roof["flops"], roof["flops"]],
                mode="lines",
                name=f"roof: {roof['bandwidth'] / 1e12:.2f} TB/s, "
                f"{roof['flops'] / 1e12:.0f} TFLOP/s {roof['dtype']}",
                line={"color": "black"},
                hoverinfo="skip",
            )
        )
    else:
        said = (
            "One point per op (the file has no calls). The device's roofs and each call's shapes and module are "
            "drawn on a page made with --html on the run."
        )
    fig = figure(
        traces,
        "achieved FLOP/s against arithmetic intensity",
        "arithmetic intensity (FLOP per byte)",
        "achieved FLOP/s (estimated)",
        height=480,
    )
    fig.update_xaxes(type="log")
    fig.update_yaxes(type="log")
    return part(fig, "roofline") + paragraph(said)


def memory_part(memory: dict[str, Any], detail: dict[str, Any]) -> str:
    if not memory:
        return paragraph("The report has no memory analysis.")
    go = graph_objects()
    held = {
        "weights": memory["weight_bytes"],
        "inputs": memory["input_bytes"],
        "KV cache": memory["kv_cache_bytes"],
    }
    activations = detail.get("activations")
    peak = f"peak {binary(memory['peak_bytes'])} at op {memory['peak_index']} {memory['peak_op']}"
    if activations:
        x = [i for i, _ in activations]
        traces = [
            go.Scatter(
                x=x,
                y=[value / 2**20] * len(x),
                name=name,
                stackgroup="memory",
                mode="lines",
                hovertemplate=f"{name}: %{{y:.4g}} MiB<extra></extra>",
            )
            for name, value in held.items()
            if value
        ]
        traces.append(
            go.Scatter(
                x=x,
                y=[b / 2**20 for _, b in activations],
                name="activations",
                mode="lines",
                stackgroup="memory",
                hovertemplate="op %{x}: activations %{y:.4g} MiB<extra></extra>",
            )
        )
        traces.append(
            go.Scatter(
                x=[memory["peak_index"]],
                y=[memory["peak_bytes"] / 2**20],
                mode="markers+text",
                name="peak",
                text=[peak],
                textposition="top center",
                marker={"color": "#d62728", "size": 12, "symbol": "x"},
                hovertemplate=esc(peak) + f" in {esc(memory['peak_module'])}<extra></extra>",
            )
        )
        fig = figure(
            traces,
            "memory held over the capture, op by op",
            "op (in the order the capture ran them)",
            "MiB per device",
            height=420,
        )
        said = (
            "Weights, inputs and KV cache are held throughout; activations live from the op that makes them "
            "to the last that reads them."
        )
    else:
        parts = {**held, "activations at the peak": memory["activation_peak_bytes"]}
        fig = figure(
            [
                go.Bar(
                    x=[v / 2**20],
                    y=["peak"],
                    name=k,
                    orientation="h",
                    hovertemplate=f"{k}: %{{x:.4g}} MiB<extra></extra>",
                )
                for k, v in parts.items()
            ],
            f"memory at the peak: {peak}",
            "MiB per device",
            "",
            height=260,
            barmode="stack",
        )
        said = (
            "The file holds the memory at the peak; the curve over the capture is drawn on a page made with "
            "--html on the run."
        )
    return part(fig, "memory") + paragraph(said)
