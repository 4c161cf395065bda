"""A roofline chart of a report: each op as a point (arithmetic intensity, achieved FLOP/s) under the
device's compute and bandwidth roofs. Needs matplotlib (pip install 'castcore[plot]')."""

from __future__ import annotations

from pathlib import Path

from castcore.errors import CastcoreError
from castcore.options.catalog import say
from castcore.report.records import Report


class PlotError(CastcoreError, RuntimeError):
    """The chart cannot be drawn; the message says why and how to fix it."""


def pyplot():
    """matplotlib's pyplot drawing to files only (no screen needed); PlotError saying how to install it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotError(f"{say('plot')} needs matplotlib: pip install 'castcore[plot]'") from None
    return plt


def save(fig, path: str | Path, fmt: str | None = None) -> Path:
    """Write ``fig`` to ``path`` (its suffix, or ``fmt``, the format) and close it."""
    path = Path(path)
    try:
        fig.savefig(path, dpi=120, bbox_inches="tight", format=(fmt or path.suffix).lstrip(".") or "png")
    finally:
        pyplot().close(fig)
    return path


def plot_roofline(report: Report, path: str | Path) -> Path:
    plt = pyplot()
    device = report.device
    peak_rate, dtype = device.rate("mma", _main_dtype(report))
    peak = peak_rate * device.compute_efficiency
    bandwidth = device.memory_bandwidth * device.memory_efficiency
    points = [
        (s.flops / s.bytes, s.flops / s.time_s, s.share, s.op)
        for s in report.by_op()
        if s.flops > 0 and s.bytes > 0 and s.time_s > 0
    ]
    if not points:
        raise PlotError("nothing to plot: no op in the report has both FLOPs and bytes")
    fig, ax = plt.subplots(figsize=(8, 5.5))
    low = min(p[0] for p in points) / 4
    high = max(max(p[0] for p in points) * 4, 4 * peak / bandwidth)
    ridge = peak / bandwidth
    ax.plot(
        [low, ridge, high],
        [low * bandwidth, peak, peak],
        color="black",
        linewidth=1.5,
        label=f"roof: {bandwidth / 1e12:.2f} TB/s, {peak / 1e12:.0f} TFLOP/s {dtype} (after efficiencies)",
    )
    for intensity, achieved, share, name in points:
        ax.scatter(intensity, achieved, s=20 + 400 * share, alpha=0.6)
        if share >= 0.02:
            ax.annotate(
                name.removeprefix("aten::"),
                (intensity, achieved),
                fontsize=7,
                xytext=(4, 2),
                textcoords="offset points",
            )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP per byte)")
    ax.set_ylabel("achieved FLOP/s (estimated)")
    ax.set_title(
        f"{report.description or 'castcore'} on {device.name}\n(point size: share of time)", fontsize=9
    )
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(True, which="both", alpha=0.2)
    return save(fig, path)


def _main_dtype(report: Report):
    """The dtype most matrix work ran in: the roof that matters for this report."""
    work: dict = {}
    for record in report.records:
        for dtype, ops in record.properties.compute_ops.items() if record.properties else ():
            work[dtype] = work.get(dtype, 0) + ops.mma_ops
    return max(work, key=work.__getitem__) if work else "bfloat16"
