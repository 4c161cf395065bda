"""``castcore simulate --plot``: the requests' TTFT and TPOT distributions (median and p99 marked, and the goodput
objective where one was given), and output tokens/s over the run with the KV cache's use. Needs matplotlib (pip
install 'castcore[plot]')."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from castcore.report.plot import PlotError, pyplot, save
from castcore.simulation.metrics import Finished, percentile

BINS = 60  # time bins of the throughput panel


def _distribution(ax, values_ms: list[float], name: str, objective_ms: float | None) -> None:
    ax.hist(values_ms, bins=min(50, max(5, len(values_ms) // 4)), color="tab:blue", alpha=0.75)
    for p, style in ((50, "--"), (99, ":")):
        at = percentile(values_ms, p)
        ax.axvline(
            at,
            color="black",
            linestyle=style,
            linewidth=1,
            label=f"{'median' if p == 50 else 'p99'} {at:.3g} ms",
        )
    if objective_ms is not None:
        ax.axvline(objective_ms, color="tab:red", linewidth=1.2, label=f"objective {objective_ms:.3g} ms")
    ax.set_xlabel(f"{name} (ms)")
    ax.set_ylabel("requests")
    ax.legend(fontsize=7)


def plot_simulation(
    finished: list[Finished],
    kv_usage: list[tuple[float, float]],
    title: str,
    path: str | Path,
    slo_ttft_s: float | None = None,
    slo_tpot_s: float | None = None,
) -> Path:
    """Draw a simulation's requests (castcore.simulation.metrics.Finished) to ``path``."""
    if not finished:
        raise PlotError("nothing to plot: no request finished")
    plt = pyplot()
    ttfts = [(r.first_token_s - r.arrival_s) * 1e3 for r in finished]
    tpots = [
        (r.finish_s - r.first_token_s) / (r.output_tokens - 1) * 1e3 for r in finished if r.output_tokens > 1
    ]
    fig, (first, second, third) = plt.subplots(3, 1, figsize=(8, 9.5))
    _distribution(first, ttfts, "time to first token", None if slo_ttft_s is None else slo_ttft_s * 1e3)
    if tpots:
        _distribution(
            second, tpots, "time per output token", None if slo_tpot_s is None else slo_tpot_s * 1e3
        )
    else:
        second.text(
            0.5, 0.5, "no request generated more than one token", ha="center", transform=second.transAxes
        )
    _throughput(third, finished, kv_usage)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return save(fig, path)


def _throughput(ax, finished: list[Finished], kv_usage: list[tuple[float, float]]) -> None:
    end = max(r.finish_s for r in finished)
    width = end / BINS
    counts = [0] * BINS
    for request in finished:
        for t in request.token_times:
            counts[min(int(t / width), BINS - 1)] += 1
    ax.bar(
        [width * (i + 0.5) for i in range(BINS)],
        [c / width for c in counts],
        width=width,
        color="tab:green",
        alpha=0.7,
        label="output tokens/s",
    )
    ax.set_xlabel("time (s)")
    ax.set_ylabel("output tokens/s")
    if kv_usage:
        kv: Any = ax.twinx()
        kv.plot(
            [t for t, _ in kv_usage],
            [u * 100 for _, u in kv_usage],
            color="tab:purple",
            linewidth=1,
            label="KV cache in use (%)",
        )
        kv.set_ylabel("KV cache in use (%)")
        kv.set_ylim(0, 105)
        kv.legend(fontsize=7, loc="upper right")
    ax.legend(fontsize=7, loc="upper left")
