"""The sections of plan's page: what was planned, in words; the Pareto front of the candidates it evaluated, the
chosen deployment starred and the objective a line; the candidates and the fewest devices that fit."""

from __future__ import annotations

from typing import Any

from castcore.report.html.document import (
    decimal,
    fact,
    facts,
    millis,
    notes,
    paragraph,
    plain,
    section,
    table,
)
from castcore.report.html.pareto_front import LABELS, cell, front_chart

LAYOUT = (
    "device",
    "devices",
    "tp",
    "pp",
    "ep",
    "dp",
    "weights",
    "activations",
    "kv_cache",
    "max_batched_tokens",
    "max_running_requests",
    "prefill_instances",
    "decode_instances",
    "decode_deployment",
    "served_batch",
    "rate",
    "max_rate",
    "requests",  # under traffic: the search's simulations and the longer ones that confirm the best
)


def plan_data(result: Any, summary: dict[str, Any] | None = None) -> dict[str, Any]:
    """A PlanResult's page data: ``summary`` (castcore plan --json's object, when the command has it) or the
    request's own figures, and every point evaluated as the candidates."""
    request = result.request
    found = dict(
        summary
        or {
            "model": request.model,
            "input_tokens": request.input_tokens,
            "output_tokens": request.output_tokens,
            "objective": request.objective,
            "ttft_s": request.ttft_s,
            "tpot_s": request.tpot_s,
            "objectives": {
                name: None if o is None else {"statistic": o.statistic, "s": o.seconds}
                for name, o in (("ttft", request.ttft), ("tpot", request.tpot))
            },
            "devices": request.devices,
            "layouts": result.layouts,
            "points": len(result.rows),
            "best": result.best,
            "fewest": result.fewest,
            "missed": result.missed,
            **(
                {
                    "rate": request.rate,
                    "concurrency": request.concurrency,
                    "max_rate": request.max_rate,
                    **request.shared,
                }
                if request.traffic
                else {}
            ),
        }
    )
    candidates = [
        {**named(row, request.dtype), "meets": request.meets(row) if not row.get("error") else False}
        for row in result.rows
    ]
    for key in ("best", "fewest", "missed"):
        found[key] = [named(row, request.dtype) for row in found.get(key) or []]
    return {"kind": "plan", "results": {**found, "candidates": candidates}}


def named(row: dict[str, Any], dtype: str) -> dict[str, Any]:
    """``row`` with its weights named: the model's dtype where the row kept the model's weights (``plan --json``
    says the same)."""
    return {**row, "weights": row.get("weights") or dtype}


def _same(row: dict[str, Any], chosen: dict[str, Any]) -> bool:
    return all(row.get(k) == chosen.get(k) for k in LAYOUT if k in row and k in chosen)


def plan_sections(results: dict[str, Any], detail: Any = None) -> tuple[str, str, list[str]]:
    best, fewest = results.get("best") or [], results.get("fewest") or []
    candidates = results.get("candidates")
    saved = candidates is None
    if saved:  # a --json file holds the best, the fewest and the missed, not every point
        candidates = []
        for row in (*best, *fewest, *(results.get("missed") or [])):
            if not any(_same(row, c) and row.keys() == c.keys() for c in candidates):
                candidates.append({**row, "meets": any(row is b for b in best)})
    traffic = any(k in results for k in ("rate", "concurrency", "max_rate"))
    x_key = "output_tokens_per_s_per_device"
    y_key = "latency_s"
    if traffic:
        wanted = [f"{o['statistic']}_{name}_ms" for name, o in (results.get("objectives") or {}).items() if o]
        y_key = next(
            (k for k in (*wanted, "median_e2el_ms", "p99_ttft_ms") if any(k in c for c in candidates)),
            "p99_ttft_ms",
        )
    else:  # a static batch: the first objective's own figure, where the rows have it
        y_key = next(
            (
                f"{name}_s"
                for name, o in (results.get("objectives") or {}).items()
                if o and any(f"{name}_s" in c for c in candidates)
            ),
            y_key,
        )
    target = next(
        (
            (
                o["s"] * (1e3 if y_key.endswith("_ms") else 1),
                f"{name.upper()} {o['statistic']} objective {millis(o['s'] * 1e3)}",
            )
            for name, o in (results.get("objectives") or {}).items()
            if o and y_key in (f"{o['statistic']}_{name}_ms", f"{name}_s")
        ),
        None,
    )
    chosen = next((i for i, c in enumerate(candidates) if best and _same(c, best[0])), None)
    # a column where some candidate has a value (activations and KV cache only when plan searched them)
    keys = [k for k in (*LAYOUT, x_key, y_key, "meets") if any(c.get(k) is not None for c in candidates)]
    chart, front = front_chart(
        candidates,
        x_key,
        y_key,
        chosen,
        keys,
        "the candidates the plan evaluated",
        [c.get("fits") is not False and c.get("meets") is not False for c in candidates],
        "misses an objective or does not fit",
        LABELS.get(y_key, y_key.replace("_", " ")),
        target,
    )
    objectives = [
        f"{name.upper()} {o['statistic']} at most {millis(o['s'] * 1e3)}"
        for name, o in (results.get("objectives") or {}).items()
        if o
    ]
    lede = (
        f"castcore plan for {results['model']}: requests of "
        + (
            str(results["dataset"])
            if results.get("dataset")
            else f"{results['input_tokens']} input + {results['output_tokens']} output tokens"
        )
        + f", {', '.join(objectives) or 'no latency objective'}, "
        f"ranked by {results.get('objective', 'throughput')}, over {', '.join(results.get('devices') or [])}"
    )
    items = [
        fact("layouts searched", str(results.get("layouts", "-")), f"{results.get('points', '-')} points"),
        fact("meet the objectives", str(len(best)) if best else "none"),
    ]
    if best:
        top = best[0]
        items.append(
            fact(
                "chosen",
                f"{top['device']}",
                ", ".join(f"{k} {plain(top[k])}" for k in LAYOUT[1:] if k in top and top[k] not in (None, 1)),
            )
        )
        items.append(fact(LABELS[x_key], decimal(top.get(x_key) or 0)))
    verdict = results.get("verdict") or {}
    parts = [section("summary", "What was planned", facts(items), notes([verdict.get("why", "")]))]
    parts.append(
        section(
            "front",
            "Pareto front",
            chart,
            paragraph(
                "The star is the chosen deployment (the first of the best); the front is drawn through the candidates that "
                "fit and meet the objectives, and hollow points are the others."
                + (
                    " A --json file holds the best, the fewest and the missed layouts; a page made with --html on the run "
                    "shows every point evaluated."
                    if saved
                    else ""
                )
            ),
        )
    )
    cells = [
        [*(cell(c.get(k)) for k in keys), "yes" if i in front else "-"] for i, c in enumerate(candidates)
    ]
    parts.append(
        section(
            "candidates",
            "Candidates",
            table("candidates-table", [*keys, "on front"], cells, [] if chosen is None else [chosen]),
        )
    )
    if fewest:
        rows = [[cell(r.get(k)) for k in keys if k != "meets"] for r in fewest]
        parts.append(
            section(
                "fewest",
                "Fewest devices that fit",
                table("fewest-table", [k for k in keys if k != "meets"], rows),
            )
        )
    return f"castcore plan: {results['model']}", lede, parts
