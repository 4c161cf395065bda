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


def decimal(value: Any, digits: int = 4) -> str:
    """``value`` as a person reads it: ``digits`` significant figures, thousands separators, never e-notation,
    no trailing zeros (19,150 and 0.2391, not 1.915e+04 and 2.391e-01)."""
    found = number(value)
    if found is None:
        return "-"
    if not found:
        return "0"
    places = max(0, digits - 1 - math.floor(math.log10(abs(found))))
    text = f"{round(found, places):,.{places}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text == "-0" else text


def seconds(value: Any) -> str:
    """A duration in the largest unit that keeps it at or above 1: 19.15 s, 239.1 us, 1,234 s."""
    found = number(value)
    if found is None:
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if abs(found) >= scale:
            return f"{decimal(found / scale)} {unit}"
    return f"{decimal(found / 1e-9)} ns" if found else "0 s"


def millis(value: Any) -> str:
    """A figure given in milliseconds (simulate's ``*_ms``) in the unit that reads best."""
    found = number(value)
    return "-" if found is None else seconds(found / 1e3)


def count(value: Any, unit: str = "") -> str:
    found = number(value)
    if found is None:
        return "-"
    for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(found) >= scale:
            return f"{decimal(found / scale)} {prefix}{unit}"
    return f"{decimal(found)} {unit}".rstrip()


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
        return decimal(value)
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


def _kind(cell: Cell) -> bool | None:
    """True for a figure, None for a blank (no figure), False for text."""
    if isinstance(cell, tuple) or number(cell) is not None:
        return True
    return None if cell is None or cell == "" or cell == "-" else False


def _cell(cell: Cell, figures: bool) -> str:
    """The cell's ``<td>``: figures align right and sort by the number behind them (data-v)."""
    text, value = cell if isinstance(cell, tuple) else (plain(cell), cell)
    found = number(value)
    if not figures:
        return f"<td>{esc(text)}</td>"
    return f'<td class="num" data-v="{"" if found is None else repr(found)}">{esc(text)}</td>'


def table(
    name: str, headers: Sequence[str], rows: Iterable[Sequence[Cell]], chosen: Iterable[int] = ()
) -> str:
    """A table the page's script sorts (click a header; again to reverse) and filters (the box above it). Rows whose
    index is in ``chosen`` are highlighted. A column of figures (blanks aside) is right-aligned, its header too."""
    marked, rows = set(chosen), [list(row) for row in rows]
    kinds = [{_kind(row[n]) for row in rows if n < len(row)} for n in range(len(headers))]
    figures = [True in found and False not in found for found in kinds]
    body = []
    for index, row in enumerate(rows):
        mark = ' class="chosen"' if index in marked else ""
        body.append(f"<tr{mark}>{''.join(_cell(cell, figures[n]) for n, cell in enumerate(row))}</tr>")
    head = "".join(
        f'<th class="num">{esc(h)}</th>' if figures[n] else f"<th>{esc(h)}</th>"
        for n, h in enumerate(headers)
    )
    return (
        f'<div class="table-tools"><input class="cc-filter" type="search" data-table="{esc(name)}" '
        f'placeholder="filter rows (every word must match)" aria-label="filter {esc(name)}">'
        f'<span class="note" id="{esc(name)}-count">{len(body)} rows</span></div>'
        f'<div class="table-wrap"><table class="cc-table" id="{esc(name)}"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table></div>"
    )


def render(title: str, lede: str, sections: Sequence[str], source: str) -> str:
    """The whole page: plotly.js, the style and the table script inline, nothing fetched when it opens."""
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<meta name="generator" content="castcore"><title>{esc(title)}</title>'
        f"<style>{STYLE}</style><script>{plotly_js()}</script></head><body>"
        f'<header><h1>{esc(title)}</h1><p class="lede">{esc(lede)}</p></header><main>{"".join(sections)}'
        f"<footer>made by castcore from {esc(source)}; estimates, not measurements. Every chart is Plotly's: "
        f"hover for the figures, drag to zoom, double-click to reset, click a legend entry to hide it.</footer>"
        f"</main><script>{SCRIPT}</script></body></html>\n"
    )
