"""The sections of an estimate's page: the workload in words, totals with their error band and the per-op table;
the per-layer breakdown (castcore.report.html.layers), the roofline and memory over the capture
(castcore.report.html.capture_charts). A page made on the run (``--html``) has every call; one made from ``--json``
later has what the file holds: op rows, module rows and the memory at the peak."""

from __future__ import annotations

from typing import Any

from castcore.report.html.capture_charts import memory_part, roofline
from castcore.report.html.charts import downsample
from castcore.report.html.document import (
    binary,
    count,
    fact,
    facts,
    notes,
    number,
    paragraph,
    seconds,
    section,
    table,
)
from castcore.report.html.layers import LAYER_NUMBER, layer_parts

POINTS = 3000  # roofline points at most (the slowest groups of calls)
MEMORY_POINTS = 1500  # points of the memory curve at most; each the largest of the ops it stands for


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
        module = LAYER_NUMBER.sub(".N", invoke.module or "(top level)")
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
