"""The page around the sections: its head (style, plotly.js inlined), a header in words, the sections, and the
pieces sections are made of: facts, notes and sortable, filterable tables."""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Sequence
from typing import Any

from castcore.report.html.assets import SCRIPT, STYLE
from castcore.report.html.charts import plotly_js

Cell = Any  # text, a number, None, or (text, number): shown as the text, sorted by the number


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def number(value: Any) -> float | None:
    """``value`` as a finite number, or None (a missing figure, a bool, a string)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def seconds(value: Any) -> str:
    found = number(value)
    if found is None:
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if abs(found) >= scale:
            return f"{found / scale:.3f} {unit}"
    return f"{found / 1e-9:.1f} ns" if found else "0 s"


def count(value: Any, unit: str = "") -> str:
    found = number(value)
    if found is None:
        return "-"
    for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(found) >= scale:
            return f"{found / scale:.3f} {prefix}{unit}"
    return f"{found:.4g} {unit}".rstrip()


def binary(value: Any) -> str:
    found = number(value)
    if found is None:
        return "-"
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(found) >= scale:
            return f"{found / scale:.2f} {unit}"
    return f"{found:.0f} B"


def plain(value: Any) -> str:
    """A value of a row as a cell's text: numbers short, lists joined, None as a dash."""
    if value is None or value == "":
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(map(str, value)) or "-"
    if isinstance(value, dict):
        return ", ".join(f"{k} {v}" for k, v in value.items()) or "-"
    return str(value)


def fact(label: str, value: str, detail: str = "") -> str:
    return f'<div class="fact"><b>{esc(value)}</b><span>{esc(label)}{" · " + esc(detail) if detail else ""}</span></div>'


def facts(items: Iterable[str]) -> str:
    return f'<div class="facts">{"".join(items)}</div>'


def notes(lines: Iterable[str], kind: str = "note") -> str:
    shown = [f"<li>{esc(line)}</li>" for line in lines if line]
    return f'<ul class="{kind}">{"".join(shown)}</ul>' if shown else ""


def paragraph(text: str, kind: str = "note") -> str:
    return f'<p class="{kind}">{esc(text)}</p>'


def section(name: str, title: str, *parts: str) -> str:
    return f'<section id="{esc(name)}"><h2>{esc(title)}</h2>{"".join(parts)}</section>'


def table(name: str, headers: Sequence[str], rows: Iterable[Sequence[Cell]], chosen: Iterable[int] = ()) -> str:
    """A table the page's script sorts (click a header; again to reverse) and filters (the box above it). Rows whose
    index is in ``chosen`` are highlighted."""
    marked = set(chosen)
    body = []
    for index, row in enumerate(rows):
        cells = []
        for cell in row:
            if isinstance(cell, tuple):
                text, value = cell
                found = number(value)
                data = f' data-v="{found!r}"' if found is not None else ' data-v=""'
                cells.append(f'<td class="num"{data}>{esc(text)}</td>')
            elif number(cell) is not None:
                cells.append(f'<td class="num" data-v="{float(cell)!r}">{esc(plain(cell))}</td>')
            else:
                cells.append(f"<td>{esc(plain(cell))}</td>")
        mark = ' class="chosen"' if index in marked else ""
        body.append(f'<tr{mark}>{"".join(cells)}</tr>')
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    return (f'<div class="table-tools"><input class="cc-filter" type="search" data-table="{esc(name)}" '
            f'placeholder="filter rows (every word must match)" aria-label="filter {esc(name)}">'
            f'<span class="note" id="{esc(name)}-count">{len(body)} rows</span></div>'
            f'<div class="table-wrap"><table class="cc-table" id="{esc(name)}"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table></div>')


def render(title: str, lede: str, sections: Sequence[str], source: str) -> str:
    """The whole page: plotly.js, the style and the table script inline, nothing fetched when it opens."""
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f'<meta name="generator" content="castcore"><title>{esc(title)}</title>'
            f"<style>{STYLE}</style><script>{plotly_js()}</script></head><body>"
            f'<header><h1>{esc(title)}</h1><p class="lede">{esc(lede)}</p></header><main>{"".join(sections)}'
            f"<footer>made by castcore from {esc(source)}; estimates, not measurements. Every chart is Plotly's: "
            f"hover for the figures, drag to zoom, double-click to reset, click a legend entry to hide it.</footer>"
            f"</main><script>{SCRIPT}</script></body></html>\n")
