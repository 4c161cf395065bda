"""The per-layer section of an estimate's page: module rows summed per layer (identical consecutive layers folded
into one bar), added up per kind of module, and every module in a flat table."""

from __future__ import annotations

import math
import re
from collections import defaultdict
from typing import Any

from castcore.report.html.charts import COLOURS, figure, graph_objects, part
from castcore.report.html.document import count, paragraph, seconds, table

_LAYER = re.compile(r"^(.*?\.\d+)(?:\.|$)")  # a module path up to its first numbered part: model.layers.3
LAYER_NUMBER = re.compile(r"\.\d+(?=\.|$)")  # a numbered part of a module path, folded to .N to group alike


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
            LAYER_NUMBER.sub(".N", row["module"]),
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
