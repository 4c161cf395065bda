"""The fidelity summary (median and worst |error| per category and split, the targets) and its Markdown."""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from typing import Any

from fidelity.published import CATEGORIES, OP_LEVEL
from fidelity.simulated import FAMILIES, MAX_REQUESTS
from fidelity.split import SAME_TABLE

SPLITS = ("held-out", "fitted")
# What the team is held to, on held-out points only.
TARGETS = {"op_level_median_pct": 12.0, "end_to_end_median_pct": 15.0, "worst_pct": 60.0}
# Continuous batching (castcore simulate), held-out points: median |error| per metric family.
CB_TARGETS = {"output throughput": 20.0, "TTFT": 30.0, "ITL/TPOT": 30.0}
# Ascend (castpack-ascend's profiles), held-out serving output throughput: median |error|.
ASCEND_TARGET_PCT = 20.0


def block(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Points, median |error| and the worst |error| with its point, over rows that have an error."""
    done = [r for r in rows if "error_pct" in r]
    if not done:
        return {"points": 0, "median_abs_error_pct": None, "worst_abs_error_pct": None, "worst_id": None}
    worst = max(done, key=lambda r: abs(r["error_pct"]))
    return {
        "points": len(done),
        "median_abs_error_pct": statistics.median(abs(r["error_pct"]) for r in done),
        "worst_abs_error_pct": abs(worst["error_pct"]),
        "worst_id": worst["id"],
    }


def on_ascend(row: dict[str, Any]) -> bool:
    """A point on castpack-ascend's profiles: scored in the Ascend section, apart from the other targets."""
    return str(row.get("device", "")).startswith("ascend-")


def summarize(rows: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Per category and split, then op-level (every category but end-to-end) and end-to-end, and the targets;
    the Ascend points on their own (``ascend``)."""
    every = list(rows)
    rows = [r for r in every if not on_ascend(r)]
    by = {
        split: {
            CATEGORIES[c]: block([r for r in rows if r["category"] == c and r.get("split") == split])
            for c in CATEGORIES
        }
        for split in SPLITS
    }
    for split in SPLITS:
        by[split]["op-level"] = block(
            [r for r in rows if r["category"] in OP_LEVEL and r.get("split") == split]
        )
    held = by["held-out"]
    # The worst-point target predates the continuous-batching points, which have their own summary.
    worst = block([r for r in rows if r.get("split") == "held-out" and r["category"] != "simulate"])
    checks = {
        "op_level_median_pct": held["op-level"]["median_abs_error_pct"],
        "end_to_end_median_pct": held["end-to-end"]["median_abs_error_pct"],
        "worst_pct": worst["worst_abs_error_pct"],
    }
    met = {k: v is not None and v <= TARGETS[k] for k, v in checks.items()}
    counted = [r for r in every if "error_pct" in r]
    return {
        "by_split": by,
        "targets": TARGETS,
        "held_out": checks,
        "targets_met": met,
        "continuous_batching": continuous_batching(rows),
        "ascend": ascend(every),
        "worst_held_out_id": worst["worst_id"],
        "counts": {
            "points": len(every),
            "estimated": len(counted),
            "op_level": sum(r["category"] in OP_LEVEL for r in counted),
            "end_to_end": sum(r["category"] == "serve" for r in counted),
            "continuous_batching": sum(r["category"] == "simulate" for r in counted),
            "not_expressible": sum("not_expressible" in r for r in every),
            "skipped": sum("skipped" in r for r in every),
        },
    }


def continuous_batching(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The simulate points: per metric family and split, median and worst |error|, and the held-out targets."""
    sim = [r for r in rows if r["category"] == "simulate"]
    by = {
        split: {
            f: block([r for r in sim if r.get("family") == f and r.get("split") == split]) for f in FAMILIES
        }
        for split in SPLITS
    }
    met = {
        f: by["held-out"][f]["median_abs_error_pct"] is not None
        and by["held-out"][f]["median_abs_error_pct"] <= CB_TARGETS[f]
        for f in FAMILIES
    }
    return {
        "by_split": by,
        "targets": CB_TARGETS,
        "targets_met": met,
        "counts": {
            "points": len(sim),
            "estimated": sum("error_pct" in r for r in sim),
            "not_expressible": sum("not_expressible" in r for r in sim),
            "skipped": sum("skipped" in r for r in sim),
        },
    }


def device_coverage(rows: Iterable[dict[str, Any]], profiles: dict[str, Any]) -> list[dict[str, Any]]:
    """Per installed device profile: its estimated held-out and fitted points, those kept as not expressible, the
    held-out median |error|, and whether the profile carries an [error_bands] table (what ``castcore estimate --json``
    prints as ``error_band``)."""
    every = list(rows)
    coverage = []
    for name in sorted(profiles):
        mine = [r for r in every if r.get("device") == name]
        held = [r for r in mine if r.get("split") == "held-out" and "error_pct" in r]
        coverage.append(
            {
                "device": name,
                "held_out": len(held),
                "fitted": sum(r.get("split") == "fitted" and "error_pct" in r for r in mine),
                "not_expressible": sum("not_expressible" in r for r in mine),
                "held_out_median_abs_error_pct": block(held)["median_abs_error_pct"],
                "error_bands": sorted(getattr(profiles[name], "error_bands", None) or {}),
            }
        )
    return coverage


def device_lines(report: dict[str, Any]) -> list[str]:
    """The per-device table, then the profiles with no held-out point said plainly."""
    coverage = report.get("devices")
    if not coverage:
        return []
    lines = [
        "",
        "## Points per device profile",
        "",
        "Every installed device profile, with the published points estimated on it (held out, fitted) and those kept "
        "as not expressible. A profile's `error_band` in `castcore estimate --json` comes only from an [error_bands] "
        "table in the profile (castcore/report/bands.py), set from held-out medians of an earlier report.",
        "",
        "| device | held-out | fitted | not expressible | held-out median \\|error\\| | [error_bands] |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for c in coverage:
        lines.append(
            f"| {c['device']} | {c['held_out']} | {c['fitted']} | {c['not_expressible']} | "
            f"{_pct(c['held_out_median_abs_error_pct'])} | {', '.join(c['error_bands']) or 'none'} |"
        )
    bare = [c["device"] for c in coverage if not c["held_out"]]
    if bare:
        lines += [
            "",
            f"No held-out point: {', '.join(bare)}. castcore's estimates on these profiles carry no error band "
            "measured here.",
        ]
    unsupported = [c["device"] for c in coverage if c["error_bands"] and not c["held_out"]]
    if unsupported:
        lines.append(
            f"Profiles with an [error_bands] table but no held-out point in this report: {', '.join(unsupported)} "
            "(their bands come from another report, see their [sources])."
        )
    return lines


def ascend_family(row: dict[str, Any]) -> str:
    """What an Ascend row measures: its op category, or serving and its metric family."""
    if row["category"] == "simulate":
        return f"serving {row.get('family', '')}"
    return "serving static batch" if row["category"] == "serve" else CATEGORIES[row["category"]]


def ascend(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The points on castpack-ascend's profiles: per family and split, and the held-out throughput target."""
    done = [r for r in rows if on_ascend(r) and "error_pct" in r]
    families = sorted({ascend_family(r) for r in done})
    by = {
        split: {
            f: block([r for r in done if ascend_family(r) == f and r["split"] == split]) for f in families
        }
        for split in SPLITS
    }
    held = [r for r in done if r["split"] == "held-out" and ascend_family(r) == "serving output throughput"]
    median = block(held)["median_abs_error_pct"]
    return {
        "by_split": by,
        "devices": sorted({r["device"] for r in done}),
        "throughput_median_pct": median,
        "throughput_bias_pct": statistics.median(r["error_pct"] for r in held) if held else None,
        "target_pct": ASCEND_TARGET_PCT,
        "target_met": median is not None and median <= ASCEND_TARGET_PCT,
    }


def ascend_lines(report: dict[str, Any]) -> list[str]:
    """The Ascend section: every family on castpack-ascend's profiles, fitted and held out apart, the serving
    target, then every serving point (the kernels are in the table of every point)."""
    a = report["summary"].get("ascend")
    if not a or not a["devices"]:
        return []
    lines = [
        "",
        "## Ascend",
        "",
        f"The points on castpack-ascend's profiles ({', '.join(a['devices'])}), kept out of the summaries "
        "above: torch_npu kernels (listed with every point) and vLLM-Ascend serving runs (below), each estimated "
        "as it ran. Fitted points set the profiles' constants (the documents their [sources] cite); held-out ones "
        "were never used for fitting.",
        "",
        "| family | split | points | median \\|error\\| | worst \\|error\\| | worst point |",
        "|---|---|---:|---:|---:|---|",
    ]
    for family in a["by_split"]["held-out"]:
        for split in SPLITS:
            b = a["by_split"][split][family]
            if b["points"]:
                lines.append(
                    f"| {family} | {split} | {b['points']} | {_pct(b['median_abs_error_pct'])} | "
                    f"{_pct(b['worst_abs_error_pct'])} | {b['worst_id']} |"
                )
    lines += [
        "",
        f"- held-out Ascend serving output throughput median |error| {_pct(a['throughput_median_pct'])} "
        f"(median signed {_pct(a['throughput_bias_pct'], True)}; target <= {a['target_pct']:g}%): "
        + ("met" if a["target_met"] else "**not met**"),
    ]
    return lines + point_lines([r for r in report["rows"] if r["category"] == "simulate" and on_ascend(r)])


def _pct(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value:+.1f}%" if signed else f"{value:.1f}%"


def _num(value: float) -> str:
    return f"{value:,.4g}" if abs(value) < 1e4 else f"{value:,.0f}"


def summary_table(summary: dict[str, Any]) -> list[str]:
    lines = [
        "| category | split | points | median \\|error\\| | worst \\|error\\| | worst point |",
        "|---|---|---:|---:|---:|---|",
    ]
    for name in (*CATEGORIES.values(), "op-level"):
        for split in SPLITS:
            b = summary["by_split"][split][name]
            label = f"**{name}**" if name in ("op-level", "end-to-end") else name
            lines.append(
                f"| {label} | {split} | {b['points']} | {_pct(b['median_abs_error_pct'])} | "
                f"{_pct(b['worst_abs_error_pct'])} | {b['worst_id'] or '-'} |"
            )
    return lines


def targets_lines(summary: dict[str, Any]) -> list[str]:
    held, met, t = summary["held_out"], summary["targets_met"], summary["targets"]

    def verdict(key: str) -> str:
        return "met" if met[key] else "**not met**"

    return [
        f"- held-out op-level median |error| {_pct(held['op_level_median_pct'])} (target <= "
        f"{t['op_level_median_pct']:g}%): {verdict('op_level_median_pct')}",
        f"- held-out end-to-end median |error| {_pct(held['end_to_end_median_pct'])} (target <= "
        f"{t['end_to_end_median_pct']:g}%, deployed view): {verdict('end_to_end_median_pct')}",
        f"- worst held-out point outside continuous batching {_pct(held['worst_pct'])} "
        f"({summary['worst_held_out_id']}; target: none worse "
        f"than {t['worst_pct']:g}%): {verdict('worst_pct')}",
    ]


def continuous_batching_lines(report: dict[str, Any]) -> list[str]:
    """The continuous-batching section: its summary against the targets, then every simulate point."""
    cb = report["summary"].get("continuous_batching")
    rows = [r for r in report["rows"] if r["category"] == "simulate" and not on_ascend(r)]
    if not cb or not rows:
        return []
    c = cb["counts"]
    lines = [
        "",
        "## Continuous batching (castcore simulate)",
        "",
        f"{c['points']} points measured under a scheduler (offline maximum throughput, a request rate or a "
        f"concurrency): {c['estimated']} estimated with `castcore.simulate` as each ran (model, device, TP/DP, "
        "dtypes, lengths, request count, arrivals, the engine preset of the source's framework and the engine "
        f"limits it states), {c['not_expressible']} not expressible (listed above). Request counts are capped "
        f"at {MAX_REQUESTS:,} per data-parallel replica. Errors are in the source's metric; for TTFT and "
        "ITL/TPOT + means castcore is slower, for throughput + means faster. No castcore constant is fitted to "
        "these points; a point would still count as fitted if a profile cited its document (split.py).",
        "",
        "| metric | split | points | median \\|error\\| | worst \\|error\\| | worst point | target (held-out) |",
        "|---|---|---:|---:|---:|---|---|",
    ]
    for f in FAMILIES:
        for split in SPLITS:
            b = cb["by_split"][split][f]
            if split == "fitted" and not b["points"]:
                continue
            verdict = (
                (f"<= {cb['targets'][f]:g}%: " + ("met" if cb["targets_met"][f] else "**not met**"))
                if split == "held-out"
                else "-"
            )
            lines.append(
                f"| {f} | {split} | {b['points']} | {_pct(b['median_abs_error_pct'])} | "
                f"{_pct(b['worst_abs_error_pct'])} | {b['worst_id'] or '-'} | {verdict} |"
            )
    return lines + point_lines(rows)


def point_lines(rows: list[dict[str, Any]]) -> list[str]:
    """A table of these points' figures and how each was estimated."""
    lines = [
        "",
        "| point | device | split | measured | estimated | error | how it was estimated |",
        "|---|---|---|---:|---:|---:|---|",
    ]
    for r in rows:
        if "error_pct" not in r:
            continue
        unit = r["unit"] + (f" ({r['metric']})" if r.get("metric") else "")
        notes = "; ".join([r.get("workload", ""), *r.get("notes", [])])
        lines.append(
            f"| {r['id']} | {r['device']} | {r['split']} | {_num(r['measured'])} {unit} | "
            f"{_num(r['estimated'])} | {_pct(r['error_pct'], True)} | {notes} |"
        )
    return lines


def markdown(report: dict[str, Any], machine: dict[str, Any]) -> str:
    """The whole report: summary and targets, the fitting documents, every point, the local machine."""
    summary, rows = report["summary"], report["rows"]
    counts = summary["counts"]
    lines = [
        "# castcore fidelity",
        "",
        f"{machine['date']}, {machine['machine']} ({machine['cpus']} CPUs), Python {machine['python']}; "
        f"whole run {report['wall_s']:.0f} s (published points {report['published_wall_s']:.0f} s"
        + (f", local machine {report['local']['wall_s']:.0f} s" if report.get("local") else "")
        + ").",
        "",
        "## Published measurements",
        "",
        f"{counts['points']} points from bench/fidelity/published.json: {counts['estimated']} estimated "
        f"({counts['op_level']} op-level, {counts['end_to_end']} end-to-end, "
        f"{counts.get('continuous_batching', 0)} continuous batching), {counts['not_expressible']} not "
        f"expressible as one castcore workload (listed below)"
        + (f", {counts['skipped']} skipped (device profile not installed)" if counts["skipped"] else "")
        + ". "
        "Each is estimated the way it ran (deployed fused kernels, the source's dtypes, batch, lengths and "
        "parallelism) on its device's profile; error = (estimated - measured) / measured in the source's own "
        "metric (TFLOPS by the source's work count, GB/s, time, tokens/s). For a time, + means castcore is "
        "slower than measured; for a rate or throughput, + means faster.",
        "",
        "A point is *fitted* when its document is cited in the [sources] of the profile it is estimated on "
        "(bench/fidelity/split.py: arXiv ids, owner/repo#issue, file paths; "
        + ", ".join(f"{k} stands for every {v}N" for k, v in SAME_TABLE.items())
        + "), else *held out*. The targets are judged on held-out points. Points on castpack-ascend's "
        "profiles are summarised in their own section (Ascend), not in the tables' medians.",
        "",
    ]
    lines += (
        summary_table(summary)
        + [""]
        + targets_lines(summary)
        + ["", "Documents used for fitting, per device (document: the constants citing it):", ""]
    )
    for device, docs in report["fitting_documents"].items():
        lines.append(
            f"- {device}: "
            + "; ".join(f"`{doc}` ({', '.join(constants)})" for doc, constants in docs.items())
        )
    lines += [
        "",
        "### Every point",
        "",
        "| point | category | device | split | measured | estimated | error | how it was estimated |",
        "|---|---|---|---|---:|---:|---:|---|",
    ]
    for r in rows:
        if "error_pct" not in r or r["category"] == "simulate":  # those have their own table below
            continue
        unit = r["unit"] + (f" ({r['metric']})" if r.get("metric") else "")
        unsure = (
            ["the source's data has a guess marked unsure (see its note)"]
            if "unsure" in r.get("source_note", "")
            else []
        )
        notes = "; ".join([r.get("workload", ""), *r.get("notes", []), *unsure])
        lines.append(
            f"| {r['id']} | {CATEGORIES[r['category']]} | {r['device']} | {r['split']} | "
            f"{_num(r['measured'])} {unit} | {_num(r['estimated'])} | {_pct(r['error_pct'], True)} | "
            f"{notes} |"
        )
    lines += ["", "### Not expressible", ""]
    lines += [
        f"- {r['id']} ({r['device']}): not expressible: {r['not_expressible']}"
        for r in rows
        if "not_expressible" in r
    ]
    lines += [f"- {r['id']} ({r['device']}): skipped: {r['skipped']}" for r in rows if "skipped" in r]
    lines += continuous_batching_lines(report)
    lines += ascend_lines(report)
    lines += device_lines(report)
    if report.get("local"):
        from fidelity.local import local_markdown

        lines += ["", *local_markdown(report["local"])]
    return "\n".join(lines) + "\n"
