"""Plotly, the one charting library of the HTML page: its figures are interactive (hover, zoom, legend toggles) and
its whole JavaScript bundle comes with the Python package, so a page carries it inline and needs no network."""

from __future__ import annotations

from typing import Any

from castcore.errors import CastcoreError

INSTALL = "pip install 'castcore[html]'"
# No logo link to Plotly's site, and no button that would send the chart anywhere: the page stays offline.
CONFIG = {"displaylogo": False, "responsive": True, "showSendToCloud": False,
          "modeBarButtonsToRemove": ["sendDataToCloud", "select2d", "lasso2d"]}
COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf")


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


def figure(data: list[Any], title: str, x: str, y: str, height: int = 420, **layout: Any) -> Any:
    """A figure of ``data`` (traces) with the page's layout: titled axes, hover on the nearest point."""
    go = graph_objects()
    fig = go.Figure(data=data)
    fig.update_layout(title={"text": title, "x": 0.01, "font": {"size": 15}}, height=height, template="plotly_white",
                      margin={"l": 70, "r": 30, "t": 50, "b": 60}, hovermode="closest",
                      legend={"orientation": "h", "y": -0.2}, **layout)
    fig.update_layout(xaxis_title=x, yaxis_title=y)  # the first axes only: a second y axis keeps its own title
    return fig


def part(fig: Any, name: str) -> str:
    """The figure as a ``<div>`` and the script that draws it; plotly.js itself is in the page's head."""
    return fig.to_html(full_html=False, include_plotlyjs=False, config=CONFIG, div_id=f"chart-{name}")


def histogram(values: list[float], bins: int = 50) -> tuple[list[float], list[int], float]:
    """Counts of ``values`` in ``bins`` equal bins: (bin centres, counts, width). Binned here, so a page holds the
    counts, not every value (a simulation has a hundred thousand inter-token gaps)."""
    low, high = min(values), max(values)
    width = (high - low) / bins or max(abs(high), 1e-12) * 1e-3
    counts = [0] * bins
    for value in values:
        counts[min(int((value - low) / width), bins - 1)] += 1
    return [low + width * (i + 0.5) for i in range(bins)], counts, width


def downsample(count: int, limit: int) -> list[range]:
    """``count`` items in at most ``limit`` consecutive buckets of equal size (the last shorter)."""
    size = max(1, -(-count // limit))
    return [range(start, min(start + size, count)) for start in range(0, count, size)]
