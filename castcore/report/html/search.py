"""The sections of sweep's and plan's pages: what was searched, in words; the Pareto front of throughput per
device against latency, hover naming each point; the table of candidates, the chosen one highlighted."""

from __future__ import annotations

import math
from typing import Any

from castcore.report.output_files import pareto
from castcore.report.html.charts import COLOURS, PageError, figure, graph_objects, part
from castcore.report.html.document import (
    decimal,
    fact,
    facts,
    millis,
    notes,
    number,
    paragraph,
    plain,
    section,
    table,
)

# Throughput per device (higher is better) and latency (lower is better) of each command's rows, as castcore sweep
# --plot draws them (castcore.sweeps.rows.THROUGHPUT and LATENCY, a layer above this one).
AXES = {
    "estimate": ("tokens_per_s_per_device", "step_s"),
    "serve": ("output_tokens_per_s_per_device", "latency_s"),
    "simulate": ("output_tokens_per_s_per_device", "median_e2el_s"),
}
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
FIRST_FIGURES = (
    "time_s",
    "devices",
    "duration",
)  # the first figure of an estimate's, a serve's, a simulate's row
LAYOUT = (
    "device",
    "devices",
    "tp",
    "pp",
    "ep",
    "dp",
    "weights",
    "prefill_instances",
    "decode_instances",
    "served_batch",
    "rate",
    "max_rate",
)


def command_of(columns: list[str]) -> str:
    """Which command a sweep's rows are of, from their figures."""
    for command in ("serve", "simulate", "estimate"):
        if AXES[command][1] in columns or (command == "simulate" and "completed" in columns):
            return command
    raise PageError(
        "the rows hold none of the figures of an estimate, serve or simulate sweep (step_s, latency_s, "
        "median_e2el_s)"
    )


def sweep_data(rows: list[dict[str, Any]], columns: list[str], command: str = "") -> dict[str, Any]:
    if not rows:
        raise PageError("an empty sweep: there are no rows to show")
    return {
        "kind": "sweep",
        "results": {"command": command or command_of(columns), "columns": list(columns), "rows": rows},
    }


def _drawn(rows: list[dict[str, Any]], x_key: str, y_key: str) -> list[int]:
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
    drawn = _drawn(rows, x_key, y_key)
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


def sweep_sections(results: dict[str, Any], detail: Any = None) -> tuple[str, str, list[str]]:
    rows, columns, command = results["rows"], results["columns"], results["command"]
    if not rows:
        raise PageError("an empty sweep: there are no rows to show")
    x_key, y_key = AXES.get(command, AXES["estimate"])
    first = min((columns.index(k) for k in FIRST_FIGURES if k in columns), default=len(columns))
    figures = set(columns[first:])  # a row holds its parameters, then its figures (castcore.sweeps.rows)
    varied = [
        c
        for c in columns
        if c not in figures and c not in ("error", "seconds") and len({repr(r.get(c)) for r in rows}) > 1
    ]
    ok = [i for i in _drawn(rows, x_key, y_key) if rows[i].get("fits") is not False]
    chosen = max(ok, key=lambda i: (rows[i][x_key], -rows[i][y_key]), default=None)
    keys = [c for c in ("model", "device", *varied) if c in columns] + [x_key, y_key]
    keys = list(dict.fromkeys(keys))
    chart, front = front_chart(
        rows,
        x_key,
        y_key,
        chosen,
        keys,
        f"{len(rows)} {command} points",
        [r.get("fits") is not False for r in rows],
        "does not fit",
    )
    failed = [r for r in rows if r.get("error")]
    lede = f"castcore sweep of {len(rows)} {command} points, varying {', '.join(varied) or 'nothing'}" + (
        f"; {len(failed)} with an error" if failed else ""
    )
    items = [
        fact("points", f"{len(rows):,}", f"{len(failed)} with an error"),
        fact("on the Pareto front", str(len(front)), "fitting rows no other beats on both axes"),
    ]
    if chosen is not None:
        items.append(
            fact(
                "highest throughput per device",
                decimal(rows[chosen][x_key]),
                ", ".join(f"{k} {plain(rows[chosen].get(k))}" for k in keys[:-2]),
            )
        )
    shown = [*keys, *(c for c in ("fits", "error") if c in columns)]
    cells = [[*(_cell(r.get(k)) for k in shown), "yes" if i in front else "-"] for i, r in enumerate(rows)]
    parts = [
        section(
            "summary",
            "What was swept",
            facts(items),
            notes(f"{r.get('model', '')} on {r.get('device')}: {r['error']}" for r in failed[:5]),
        )
    ]
    parts.append(
        section(
            "front",
            "Pareto front",
            chart,
            paragraph(
                "Hollow points do not fit in memory and are left off the front; the star is the fitting point of highest "
                "throughput per device."
            ),
        )
    )
    parts.append(
        section(
            "candidates",
            "Candidates",
            table("candidates-table", [*shown, "on front"], cells, [] if chosen is None else [chosen]),
        )
    )
    return f"castcore sweep: {len(rows)} {command} points", lede, parts


def _cell(value: Any) -> Any:
    return (decimal(value), value) if isinstance(value, float) else value


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
                {"rate": request.rate, "concurrency": request.concurrency, "max_rate": request.max_rate}
                if request.traffic
                else {}
            ),
        }
    )
    candidates = [
        {**row, "meets": request.meets(row) if not row.get("error") else False} for row in result.rows
    ]
    return {"kind": "plan", "results": {**found, "candidates": candidates}}


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
    keys = [k for k in (*LAYOUT, x_key, y_key, "meets") if any(k in c for c in candidates)]
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
        f"castcore plan for {results['model']}: requests of {results['input_tokens']} input + "
        f"{results['output_tokens']} output tokens, {', '.join(objectives) or 'no latency objective'}, "
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
        [*(_cell(c.get(k)) for k in keys), "yes" if i in front else "-"] for i, c in enumerate(candidates)
    ]
    parts.append(
        section(
            "candidates",
            "Candidates",
            table("candidates-table", [*keys, "on front"], cells, [] if chosen is None else [chosen]),
        )
    )
    if fewest:
        rows = [[_cell(r.get(k)) for k in keys if k != "meets"] for r in fewest]
        parts.append(
            section(
                "fewest",
                "Fewest devices that fit",
                table("fewest-table", [k for k in keys if k != "meets"], rows),
            )
        )
    return f"castcore plan: {results['model']}", lede, parts
