"""``castcore sweep --plot``: latency against throughput per device, one colour per device, the Pareto front (no
other point is both faster per request and higher in throughput per device) marked. Points that do not fit in
memory are drawn hollow and left off the front. Needs matplotlib (pip install 'castcore[plot]')."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from castcore.options.catalog import say
from castcore.report.output_files import pareto
from castcore.report.plot import PlotError, pyplot, save
from castcore.sweeps.rows import LATENCY, THROUGHPUT

LABELS = {
    "step_s": "step time (s)",
    "latency_s": "request latency (s)",
    "tokens_per_s_per_device": "tokens/s per device",
    "output_tokens_per_s_per_device": "output tokens/s per device",
}


def _number(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if number > 0 else None


def plot_pareto(rows: list[dict[str, Any]], command: str, path: str | Path, fmt: str = ".png") -> str:
    """Draw the rows to ``path``; a line saying what was drawn."""
    plt = pyplot()
    x_key, y_key = THROUGHPUT[command], LATENCY[command]
    drawn = [
        (x, y, row)
        for row in rows
        if not row.get("error")
        and (x := _number(row.get(x_key))) is not None
        and (y := _number(row.get(y_key))) is not None
    ]
    if not drawn:
        raise PlotError(f"{say('plot')}: no row without an error has {x_key} and {y_key} to draw")
    fitting = [i for i, (_, _, row) in enumerate(drawn) if row.get("fits") is not False]
    front = [fitting[i] for i in pareto([drawn[i][:2] for i in fitting])]
    devices = list(dict.fromkeys(str(row.get("device")) for _, _, row in drawn))
    colours = plt.get_cmap("tab10" if len(devices) <= 10 else "tab20")
    fig, ax = plt.subplots(figsize=(8.5, 5.5))
    for n, device in enumerate(devices):
        mine = [(x, y, row) for x, y, row in drawn if str(row.get("device")) == device]
        fits = [(x, y) for x, y, row in mine if row.get("fits") is not False]
        over = [(x, y) for x, y, row in mine if row.get("fits") is False]
        colour = colours(n % colours.N)
        if fits:
            ax.scatter(*zip(*fits), s=22, color=colour, alpha=0.75, label=device)
        if over:
            ax.scatter(
                *zip(*over),
                s=22,
                facecolors="none",
                edgecolors=colour,
                alpha=0.6,
                label=f"{device} (does not fit)",
            )
    if front:
        line = sorted((drawn[i][0], drawn[i][1]) for i in front)
        ax.plot(*zip(*line), color="black", linewidth=1, drawstyle="steps-pre", zorder=1)
        ax.scatter(
            *zip(*line),
            s=90,
            facecolors="none",
            edgecolors="black",
            linewidths=1.2,
            label="Pareto front",
            zorder=3,
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(f"{LABELS[x_key]} (higher is better)")
    ax.set_ylabel(f"{LABELS[y_key]} (lower is better)")
    ax.set_title(
        f"castcore sweep: {len(drawn)} {command} points, {len(front)} on the Pareto front", fontsize=10
    )
    ax.grid(True, which="both", alpha=0.2)
    ax.legend(fontsize=8, loc="best")
    save(fig, path, fmt)
    return f"{len(drawn)} points, {len(front)} on the Pareto front"
