"""The sections of an estimate's page: the workload in words, totals with their error band, the per-op table, the
per-layer breakdown, the roofline and memory over the capture. A page made on the run (``--html``) has every call;
one made from ``--json`` later has what the file holds: op rows, module rows and the memory at the peak."""

from __future__ import annotations

import math
import re
from collections import defaultdict
from typing import Any

from castcore.report.html.charts import COLOURS, downsample, figure, graph_objects, part
from castcore.report.html.document import (
    binary,
    count,
    esc,
    fact,
    facts,
    notes,
    number,
    paragraph,
    seconds,
    section,
    table,
)

POINTS = 3000  # roofline points at most (the slowest groups of calls)
MEMORY_POINTS = 1500  # points of the memory curve at most; each the largest of the ops it stands for
_LAYER = re.compile(r"^(.*?\.\d+)(?:\.|$)")  # a module path up to its first numbered part: model.layers.3
_NUMBER = re.compile(r"\.\d+(?=\.|$)")


def estimate_data(report: Any, host: Any = None) -> dict[str, Any]:
    """What a page of ``report`` (a castcore Report) shows: its JSON, and what only the run has: calls grouped by
    op, input shapes and module (for the roofline), the device's roofs, the activations over the capture, and, with
    the plugin ``host``, the claims each op's answer shadowed."""
    from castcore.report.plot import _main_dtype  # the roof that matters: the dtype most matrix work ran in

    device = report.device
    rate, dtype = device.rate("mma", _main_dtype(report))
    detail: dict[str, Any] = {
        "roof": {
            "flops": rate * device.compute_efficiency,
            "bandwidth": device.memory_bandwidth * device.memory_efficiency,
            "dtype": str(dtype),
            "memory_bytes": device.memory_bytes,
        },
        "points": call_groups(report.records),
    }
    memory = report.memory
    if memory is not None and memory.timeline:
        buckets = downsample(len(memory.timeline), MEMORY_POINTS)
        detail["activations"] = [
            max(((i, memory.timeline[i]) for i in b), key=lambda p: p[1]) for b in buckets
        ]
    if host is not None:
        detail["shadowed"] = shadowed_claims(host, device.name, report.by_op())
    return {"kind": "estimate", "results": report.to_dict(), "detail": detail}


def call_groups(records: list[Any]) -> list[dict[str, Any]]:
    """Calls of one op on the same input shapes in the same module (layer numbers folded), slowest first."""
    groups: dict[tuple[str, str, str], dict[str, Any]] = {}
    for record in records:
        invoke = record.invoke
        shapes = ", ".join(
            "x".join(map(str, t.shape)) + f" {str(t.dtype).removeprefix('torch.')}" for t in invoke.inputs()
        )
        module = _NUMBER.sub(".N", invoke.module or "(top level)")
        group = groups.setdefault(
            (invoke.name, shapes, module),
            {
                "op": invoke.name,
                "shapes": shapes or "-",
                "module": module,
                "calls": 0,
                "time_s": 0.0,
                "flops": 0.0,
                "bytes": 0.0,
                "bound": record.estimate.bound,
            },
        )
        group["calls"] += 1
        group["time_s"] += record.estimate.time_s
        group["flops"] += record.flops
        group["bytes"] += record.bytes
    return sorted(groups.values(), key=lambda g: -g["time_s"])[:POINTS]


def shadowed_claims(host: Any, device: str, ops: list[Any]) -> dict[str, list[str]]:
    """op -> the declared claims that did not answer its calls, as castcore audit --model lists them."""
    from castcore.plugins.audit import candidates_for
    from castcore.recording.invoke import op_name

    claimed = {op_name(k): v for k, v in candidates_for(host, device).items()}
    found = {}
    for row in ops:
        answering = {source.rsplit(" (", 1)[0] for source in row.source.split(", ")}
        found[row.op] = [str(c) for c in claimed.get(row.op, []) if c.plugin not in answering]
    return found


def band(ops: list[dict[str, Any]]) -> tuple[float, float]:
    """(seconds either side of the total, share of the time that has a band): each op's time times its kernel
    family's held-out median |error| on this device, added up (castcore.report.bands)."""
    spread = covered = 0.0
    for row in ops:
        error = (row.get("error_band") or {}).get("held_out_median_abs_error")
        if number(error) is not None and number(row.get("time_s")) is not None:
            spread += row["time_s"] * error
            covered += row["time_s"]
    total = sum(number(r.get("time_s")) or 0.0 for r in ops)
    return spread, covered / total if total else 0.0


def banded(value: float, spread_share: float) -> str:
    return f"{seconds(value)} ± {seconds(value * spread_share)}" if spread_share else seconds(value)


def workload_words(results: dict[str, Any]) -> str:
    """The workload and deployment as a sentence: the report's description, the device, the parallel layout."""
    workload = results.get("workload") or {}
    layout = [
        f"{name} {workload[name]}"
        for name in ("tp", "ep", "pp", "dp", "attention_dp")
        if isinstance(workload.get(name), int) and workload[name] > 1
    ]
    extras = [
        f"{name} {workload[name]}" for name in ("weights", "activations", "kv_cache") if workload.get(name)
    ]
    text = f"{results.get('description') or 'a workload'} on {results.get('device')}"
    if layout:
        text += f", {' x '.join(layout)} (figures per device)"
    return text + (f"; {', '.join(extras)}" if extras else "")


def estimate_sections(results: dict[str, Any], detail: dict[str, Any] | None) -> tuple[str, str, list[str]]:
    detail = detail or {}
    totals, coverage, ops = results["totals"], results["coverage"], results["ops"]
    spread, covered = band(ops)
    share = spread / totals["time_s"] if totals["time_s"] else 0.0
    memory = results.get("memory") or {}
    summary = [
        fact(
            "estimated time",
            banded(totals["time_s"], share),
            f"band on {covered:.0%} of the time" if spread else "no error band for these kernels",
        ),
        fact("FLOPs", count(totals["flops"])),
        fact("bytes moved", count(totals["bytes"], "B")),
        fact("op calls", f"{totals['calls']:,}", f"{len(ops)} ops"),
        fact(
            "by formula or estimator",
            f"{coverage['ops'] - len(coverage['fallback_ops'])} of {coverage['ops']} ops",
            f"{coverage['fallback_time_share']:.1%} of time memory-only",
        ),
    ]
    if memory:
        summary.append(fact("peak memory", binary(memory["peak_bytes"]), f"at op {memory['peak_index']}"))
    parts = [
        section(
            "totals",
            "Totals",
            facts(summary),
            paragraph(
                "± is each op's time times the held-out median |error| castcore measured for its kernel family on this "
                "device (the fidelity report), added up; ops of other families carry no band."
                if spread
                else "The device profile gives no error band for the kernel families these ops belong to."
            ),
            notes(results.get("warnings") or [], "warn"),
            notes(results.get("notes") or []),
        )
    ]
    parts.append(
        section(
            "ops",
            "Operators",
            op_table("ops-table", ops, detail.get("shadowed")),
            paragraph(
                "Click a header to sort (again to reverse); type in the box to filter."
                + (
                    ""
                    if "shadowed" in detail
                    else " The claims each answer shadowed are listed on a page made with "
                    "--html on the run, which has the plugins at hand."
                )
            ),
        )
    )
    parts.append(section("layers", "Per layer", *layer_parts(results.get("modules") or [])))
    parts.append(section("roofline", "Roofline", roofline(ops, detail)))
    parts.append(section("memory", "Memory over the capture", memory_part(memory, detail)))
    return (
        f"castcore estimate: {results.get('description') or results.get('device')}",
        workload_words(results),
        parts,
    )


def op_table(name: str, ops: list[dict[str, Any]], shadowed: dict[str, list[str]] | None) -> str:
    headers = [
        "op",
        "calls",
        "time",
        "share",
        "bound",
        "FLOPs",
        "bytes",
        "answered by",
        "shadowed",
        "error band",
    ]
    rows = []
    for row in ops:
        error = (row.get("error_band") or {}).get("held_out_median_abs_error")
        hidden = "-" if shadowed is None else ", ".join(shadowed.get(row["op"], [])) or "none"
        rows.append(
            [
                row["op"],
                (f"{row['calls']:,}", row["calls"]),
                (seconds(row["time_s"]), row["time_s"]),
                (f"{row['share']:.1%}", row["share"]),
                row["bound"],
                (count(row["flops"]), row["flops"]),
                (count(row["bytes"], "B"), row["bytes"]),
                row["source"] + (" (memory-only fallback)" if row.get("fallback") else ""),
                hidden,
                (f"±{error:.0%}" if number(error) is not None else "-", error),
            ]
        )
    return table(name, headers, rows)


def natural(text: str) -> list[Any]:
    """A sort key that reads numbers as numbers: layers.2 before layers.10."""
    return [(0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", text) if part]


def _same(first: dict[str, float], second: dict[str, float]) -> bool:
    return first.keys() == second.keys() and all(
        math.isclose(first[k], second[k], rel_tol=1e-6, abs_tol=1e-15) for k in first
    )


def layer_groups(modules: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Module rows summed per layer (a numbered block and everything inside it; other modules alone), in numeric
    order, consecutive layers whose modules take the same times folded into one entry: {"name", "layers", "each_s"}
    (the time of one of them), e.g. model.layers.0-31 (x32)."""
    layers: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for row in modules:
        found = _LAYER.match(row["module"])
        key = found.group(1) if found else row["module"]
        layers[key][row["module"][len(key) :]] += row["time_s"]
    groups: list[dict[str, Any]] = []
    for key in sorted(layers, key=natural):
        stem, _, index = key.rpartition(".")
        last = groups[-1] if groups else None
        if (
            last
            and index.isdigit()
            and last["stem"] == stem
            and last["last"] == int(index) - 1
            and _same(last["parts"], layers[key])
        ):
            last["last"], last["layers"] = int(index), last["layers"] + 1
            continue
        groups.append(
            {
                "stem": stem,
                "first": index,
                "last": int(index) if index.isdigit() else None,
                "parts": layers[key],
                "layers": 1,
                "each_s": sum(layers[key].values()),
                "key": key,
            }
        )
    return [
        {
            "name": g["key"]
            if g["layers"] == 1
            else f"{g['stem']}.{g['first']}-{g['last']} (x{g['layers']})",
            "layers": g["layers"],
            "each_s": g["each_s"],
        }
        for g in groups
    ]


def module_kinds(modules: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Module rows of the same kind (layer numbers folded to N) added up, slowest first, with how many there are."""
    kinds: dict[str, dict[str, Any]] = {}
    for row in modules:
        kind = kinds.setdefault(
            _NUMBER.sub(".N", row["module"]),
            {"count": 0, "calls": 0, "time_s": 0.0, "share": 0.0, "flops": 0.0, "bytes": 0.0},
        )
        kind["count"] += 1
        for name in ("calls", "time_s", "share", "flops", "bytes"):
            kind[name] += row[name]
    return sorted(({"module": k, **v} for k, v in kinds.items()), key=lambda k: -k["time_s"])


def _module_rows(modules: list[dict[str, Any]], many: bool) -> list[list[Any]]:
    return [
        [
            m["module"],
            *([(f"{m['count']:,}", m["count"])] if many else []),
            (f"{m['calls']:,}", m["calls"]),
            (seconds(m["time_s"]), m["time_s"]),
            (f"{m['share']:.1%}", m["share"]),
            (count(m["flops"]), m["flops"]),
            (count(m["bytes"], "B"), m["bytes"]),
        ]
        for m in modules
    ]


def layer_parts(modules: list[dict[str, Any]]) -> list[str]:
    if not modules:
        return [paragraph("The report has no module rows.")]
    groups = layer_groups(modules)
    go = graph_objects()
    bars = go.Bar(
        x=[g["each_s"] * 1e3 for g in groups],
        y=[g["name"] for g in groups],
        orientation="h",
        marker_color=COLOURS[0],
        customdata=[[seconds(g["each_s"]), g["layers"], seconds(g["each_s"] * g["layers"])] for g in groups],
        hovertemplate="%{y}<br>%{customdata[0]} each, %{customdata[1]} in all: %{customdata[2]}"
        "<extra></extra>",
    )
    fig = figure(
        [bars],
        "time per layer (a numbered block and everything inside it), identical layers as one bar",
        "time per layer (ms)",
        "",
        height=max(260, 22 * len(groups) + 120),
    )
    fig.update_yaxes(autorange="reversed", automargin=True, type="category")
    headers = ["module", "calls", "time", "share", "FLOPs", "bytes"]
    kinds = module_kinds(modules)
    layer_rows = [
        [
            g["name"],
            (f"{g['layers']:,}", g["layers"]),
            (seconds(g["each_s"]), g["each_s"]),
            (seconds(g["each_s"] * g["layers"]), g["each_s"] * g["layers"]),
        ]
        for g in groups
    ]
    return [
        part(fig, "layers"),
        paragraph(
            f"{len(modules):,} modules of {len(kinds):,} kinds: each kind below is the modules of that name in every "
            "layer (layer numbers folded to N), added up; every module has its row in the flat table."
        ),
        table("module-kinds-table", [headers[0], "modules", *headers[1:]], _module_rows(kinds, True)),
        f"<details><summary>per layer ({len(groups):,} rows, identical layers as one)</summary>"
        f"{table('layers-table', ['layer', 'layers', 'time each', 'time in all'], layer_rows)}</details>"
        f"<details><summary>every module, one row each ({len(modules):,} rows)</summary>"
        f"{table('modules-table', headers, _module_rows(modules, False))}</details>",
    ]


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
