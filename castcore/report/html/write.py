"""The page of a result, written whole: ``write_html(result, path)`` (``castcore.write_html``) for what estimate,
serve, simulate, sweep and plan return, and ``write_page`` for the page data the commands and ``castcore report``
build. The path and plotly are checked before any work; the page goes to a temporary file that is renamed into
place, so a failure leaves no half-written page."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from castcore.report.output_files import check_output, write_whole
from castcore.report.html.charts import PageError, graph_objects
from castcore.report.html.document import render

KINDS = ("estimate", "serve", "simulate", "sweep", "plan")


def check_html(path: str | Path) -> Path:
    """The page's path, when it can be written and plotly is installed; else one line saying the fix."""
    target = check_output(path, "html")
    graph_objects()
    return target


def page_html(data: dict[str, Any]) -> str:
    """The whole page of ``data`` ({"kind", "results", "detail", "source"}) as text."""
    from castcore.report.html import estimate, plan, serve, simulate, sweep

    kind = data.get("kind")
    builders = {
        "estimate": estimate.estimate_sections,
        "serve": serve.serve_sections,
        "simulate": simulate.simulate_sections,
        "sweep": sweep.sweep_sections,
        "plan": plan.plan_sections,
    }
    if kind not in builders:
        raise PageError(f"no page for results of kind {kind!r}; castcore makes pages of {', '.join(KINDS)}")
    title, lede, sections = builders[kind](data["results"], data.get("detail"))
    return render(title, lede, sections, data.get("source") or f"castcore {kind}")


def write_page(data: dict[str, Any], path: str | Path) -> Path:
    """Write the page of ``data`` to ``path`` whole (made in memory first, then a temporary file renamed)."""
    target = check_html(path)
    text = page_html(data)
    write_whole(target, "html", lambda p: p.write_text(text, encoding="utf-8"))
    return target


def page_data(result: Any, session: Any = None) -> dict[str, Any]:
    """The page data of what castcore.estimate, serve, simulate, sweep or plan returned (told apart by what each
    holds, since those types live in layers above this one); ``session`` names each op's shadowed claims."""
    from castcore.report.html import estimate, plan, serve, simulate, sweep

    if hasattr(result, "records") and hasattr(result, "by_op"):
        return estimate.estimate_data(result, session)
    if hasattr(result, "prefill") and hasattr(result, "decode"):
        return serve.serve_data(result)
    if hasattr(result, "kv_usage") and hasattr(result, "summary"):
        return simulate.simulate_data(result)
    if hasattr(result, "request") and hasattr(result, "best"):
        return plan.plan_data(result)
    if hasattr(result, "rows") and hasattr(result, "columns"):
        return sweep.sweep_data(result.rows, result.columns, getattr(result, "command", ""))
    raise PageError(
        f"no page for a {type(result).__name__}: give what castcore.estimate, serve, simulate, sweep or "
        "plan returned, or a results file to castcore report"
    )


def write_html(result: Any, path: str | Path, session: Any = None) -> Path:
    """Write one self-contained HTML page of ``result`` (what castcore.estimate, serve, simulate, sweep or plan
    returned) to ``path``, as ``--html`` does; ``session`` (the one that made an estimate) lets the op table name
    the claims each answer shadowed. Needs plotly (pip install 'castcore[html]')."""
    target = check_html(path)
    data = page_data(result, session)
    return write_page({**data, "source": data.get("source") or "castcore's Python API"}, target)
