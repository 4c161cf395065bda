"""Plotly, the one charting library of the HTML page: its figures are interactive (hover, zoom, legend toggles) and
its whole JavaScript bundle comes with the Python package, so a page carries it inline and needs no network."""

from __future__ import annotations

import math
from typing import Any

from castcore.errors import CastcoreError

INSTALL = "pip install 'castcore[html]'"
# No logo link to Plotly's site, and no button that would send the chart anywhere: the page stays offline.
CONFIG = {
    "displaylogo": False,
    "responsive": True,
    "showSendToCloud": False,
    "modeBarButtonsToRemove": ["sendDataToCloud", "select2d", "lasso2d"],
}
COLOURS = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)


class PageError(CastcoreError, ValueError):
    """A page that cannot be made (Plotly missing, a result with nothing to show); one line saying the fix."""


def graph_objects() -> Any:
    """plotly.graph_objects, or PageError naming the install command."""
    try:
        import plotly.graph_objects as go
    except ImportError:
        raise PageError(f"an HTML page needs plotly: {INSTALL}") from None
    return go


def plotly_js() -> str:
    """The whole plotly.js bundle the installed plotly ships, to inline in the page's head."""
    graph_objects()
    from plotly.offline import get_plotlyjs

    return get_plotlyjs()


def figure(
    data: list[Any], title: str, x: str, y: str, height: int = 420, grid: Any = None, **layout: Any
) -> Any:
    """A figure of ``data`` (traces) with the page's layout: titled axes, hover on the nearest point; on ``grid``
    (plotly's make_subplots) when given."""
    go = graph_objects()
    fig = go.Figure(data=data) if grid is None else grid
    fig.update_layout(
        title={"text": title, "x": 0.01, "font": {"size": 15}},
        height=height,
        template="plotly_white",
        margin={"l": 70, "r": 30, "t": 50, "b": 60},
        hovermode="closest",
        legend={"orientation": "h", "y": -0.2},
        **layout,
    )
    fig.update_layout(
        xaxis_title=x, yaxis_title=y
    )  # the first axes only: a second y axis keeps its own title
    return fig


def part(fig: Any, name: str) -> str:
    """The figure as a ``<div>`` and the script that draws it; plotly.js itself is in the page's head."""
    return fig.to_html(full_html=False, include_plotlyjs=False, config=CONFIG, div_id=f"chart-{name}")


def _quantile(ordered: list[float], share: float) -> float:
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def histogram(values: list[float], most: int = 60) -> dict[str, Any]:
    """``values`` binned as a person reads them, binned here so a page holds counts, not every value (a simulation
    has a hundred thousand inter-token gaps). The range is the 1st to the 99th percentile, widened to the smallest
    and largest value when they lie near it, so that a few stragglers do not squeeze the rest into one bar; the
    bins are Freedman-Diaconis wide (twice the interquartile range over the cube root of the count; between 5 and
    ``most`` of them), in log10 of the values when the range spans 20x or more. Returns {"edges", "counts", "log",
    "below", "above" (values outside the range), "smallest", "largest"}."""
    ordered = sorted(values)
    low, high = _quantile(ordered, 0.01), _quantile(ordered, 0.99)
    if high <= low:
        low, high = ordered[0], ordered[-1]
    spread = high - low
    low = ordered[0] if ordered[0] >= low - spread / 4 else low
    high = ordered[-1] if ordered[-1] <= high + spread / 4 else high
    log = low > 0 and high >= 20 * low
    scale = math.log10 if log else float
    start, stop = scale(low), scale(high)
    if stop <= start:  # one value: one bar around it
        edges = [low - (abs(low) * 1e-3 or 1e-12), high + (abs(high) * 1e-3 or 1e-12)]
        return {
            "edges": edges,
            "counts": [len(ordered)],
            "log": False,
            "below": 0,
            "above": 0,
            "smallest": ordered[0],
            "largest": ordered[-1],
        }
    width = 2 * (scale(_quantile(ordered, 0.75)) - scale(_quantile(ordered, 0.25))) / len(ordered) ** (1 / 3)
    bins = max(5, min(most, math.ceil((stop - start) / width) if width > 0 else most // 3))
    step = (stop - start) / bins
    edges = [10 ** (start + step * i) if log else start + step * i for i in range(bins)] + [high]
    counts, below, above = [0] * bins, 0, 0
    for value in ordered:
        if value < low:
            below += 1
        elif value > high:
            above += 1
        else:
            counts[min(int((scale(value) - start) / step), bins - 1)] += 1
    return {
        "edges": edges,
        "counts": counts,
        "log": log,
        "below": below,
        "above": above,
        "smallest": ordered[0],
        "largest": ordered[-1],
    }


def count_axis(high: float, ticks: int = 5) -> dict[str, Any]:
    """A y axis of counts: from 0, whole-number ticks 1, 2 or 5 times a power of ten apart, ``high`` on it."""
    step = 1
    while step * ticks < high:  # 1, 2, 5, 10, 20, 50, ...
        step = step * 5 // 2 if str(step)[0] == "2" else step * 2
    return {
        "range": [0, step * max(1, math.ceil(high / step))],
        "dtick": step,
        "tickformat": ",d",
        "rangemode": "tozero",
    }


def downsample(count: int, limit: int) -> list[range]:
    """``count`` items in at most ``limit`` consecutive buckets of equal size (the last shorter)."""
    size = max(1, -(-count // limit))
    return [range(start, min(start + size, count)) for start in range(0, count, size)]
