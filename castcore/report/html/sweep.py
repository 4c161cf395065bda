"""The sections of sweep's page: what was swept, in words; the Pareto front of its rows, the fitting row of highest
throughput per device starred; the table of its rows."""

from __future__ import annotations

from typing import Any

from castcore.report.html.charts import PageError
from castcore.report.html.document import decimal, fact, facts, notes, paragraph, plain, section, table
from castcore.report.html.pareto_front import cell, drawable, front_chart

# Throughput per device (higher is better) and latency (lower is better) of each command's rows, as castcore sweep
# --plot draws them (castcore.sweeps.rows.THROUGHPUT and LATENCY, a layer above this one).
AXES = {
    "estimate": ("tokens_per_s_per_device", "step_s"),
    "serve": ("output_tokens_per_s_per_device", "latency_s"),
    "simulate": ("output_tokens_per_s_per_device", "median_e2el_s"),
}
# the first figure of an estimate's, a serve's, a simulate's row
FIRST_FIGURES = ("time_s", "devices", "duration")


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
    ok = [i for i in drawable(rows, x_key, y_key) if rows[i].get("fits") is not False]
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
    cells = [[*(cell(r.get(k)) for k in shown), "yes" if i in front else "-"] for i, r in enumerate(rows)]
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
