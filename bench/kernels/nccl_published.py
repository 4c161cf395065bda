"""Score castpack-collectives' NCCL model against published, measured NCCL collectives (nccl_published.csv).

Every row of ``nccl_published.csv`` is one measured collective: GPU and castpack-nvidia profile, collective, ranks,
nodes, size S (as nccl-tests counts it), the source's metric (``busbw`` GB/s or ``time_us``), the algorithm the
source forced (``default``: NCCL's own pick; ``nvls``: NCCL_ALGO=NVLS; ``ring``: NVLS off), framework and source.
``sets`` names the profile constant a row set; a row with it empty set none ("held out").

Each row is priced with ``castpack_collectives.alphabeta.collective_cost`` on the profile's interconnect levels and
``comm_op_cost_s``, with the algorithms the source allowed (``nvls``: in-switch reduction only; ``ring``: the
profile without its in-switch reduction), and compared in time (busbw is turned into time with nccl-tests' bus
factor). ``python bench/kernels/nccl_published.py`` writes bench/results/nccl_published.md and prints it.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # score.py sits beside this file
from score import WITHIN, quantile  # noqa: E402

HERE = Path(__file__).parent
POINTS = HERE / "nccl_published.csv"
OUT = HERE.parent / "results" / "nccl_published.md"
SMALL, LARGE = 64 * 1024, 16 * 2**20  # size regimes in the report: <= 64 KiB, up to 16 MiB, above


def load(path: Path = POINTS) -> list[dict]:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for row in rows:
        row["ranks"], row["nodes"], row["bytes"] = int(row["ranks"]), int(row["nodes"]), float(row["bytes"])
        row["value"] = float(row["value"])
    return rows


def measured_s(row: dict) -> float:
    from castpack_collectives.alphabeta import bus_factor

    if row["metric"] == "time_us":
        return row["value"] * 1e-6
    if row["metric"] == "busbw":
        return row["bytes"] * bus_factor(row["collective"], row["ranks"]) / (row["value"] * 1e9)
    raise ValueError(f"{row['id']}: unknown metric {row['metric']!r}")


def price(row: dict, profile):
    """castpack-collectives' cost of one row on ``profile``, with the algorithms its source allowed."""
    from castpack_collectives.alphabeta import NCCL, collective_cost

    levels, algorithms = profile.interconnect, NCCL
    if row["algorithm"] == "nvls":
        algorithms = ("in_switch",)
    elif row["algorithm"] == "ring":
        levels = tuple(dataclasses.replace(level, reduction_efficiency=0.0) for level in levels)
    return collective_cost(
        row["collective"], row["bytes"], row["ranks"], levels, profile.comm_op_cost_s, algorithms
    )


def score(rows: list[dict]) -> list[dict]:
    import castcore

    session = castcore.Session()
    results = []
    for row in rows:
        cost = price(row, session.device(row["profile"]))
        seconds = measured_s(row)
        results.append(
            {
                **row,
                "measured_s": seconds,
                "estimated_s": cost.time_s,
                "error": cost.time_s / seconds - 1,
                "how": f"{cost.algorithm} {'+'.join(cost.protocols) or '-'}",
                "split": "fitted" if row["sets"] else "held out",
            }
        )
    return results


def summary(results: list[dict]) -> dict:
    errors = [r["error"] for r in results]
    absolute = sorted(abs(e) for e in errors)
    return {
        "n": len(errors),
        "median": statistics.median(absolute),
        "p90": quantile(absolute, 0.9),
        "bias": statistics.median(errors),
        "within": sum(a <= WITHIN for a in absolute) / len(absolute),
    }


def regime(size: float) -> str:
    return "<= 64 KiB" if size <= SMALL else "<= 16 MiB" if size <= LARGE else "> 16 MiB"


def one_process(row: dict) -> bool:
    """nccl-tests run as ``-g N`` (N > 1): one process launches every GPU's kernels, so the host's N launches are
    in each iteration's time, which a serving engine (a process a GPU) does not pay."""
    gpus = re.search(r"(?<!\S)-g (\d+)", row["framework"])
    return row["framework"].startswith("nccl-tests") and gpus is not None and int(gpus.group(1)) > 1


def _row(label: str, results: list[dict]) -> str:
    s = summary(results)
    return (
        f"| {label} | {s['n']} | {s['median']:.1%} | {s['p90']:.1%} | {s['bias']:+.1%} | {s['within']:.0%} |"
    )


def report(results: list[dict]) -> str:
    head = "| group | points | median \\|error\\| | p90 \\|error\\| | bias (median error) | within 20% |"
    rule = "|---|---:|---:|---:|---:|---:|"
    held = [r for r in results if r["split"] == "held out"]
    lines = [
        "# NCCL collectives: castpack-collectives against published measurements",
        "",
        f"{len(results)} measured points from public sources (bench/kernels/nccl_published.csv, one source a "
        f"row), priced by `castpack_collectives.alphabeta.collective_cost` on castpack-nvidia's profiles; "
        f"error = estimate / measured - 1 in time. Fitted: the {len(results) - len(held)} points that set a "
        f"profile constant (the csv's `sets`); held out: the other {len(held)}. Written by "
        "`python bench/kernels/nccl_published.py`.",
        "",
        "## Summary",
        "",
        head,
        rule,
        _row("all held out", held),
    ]
    fitted = [r for r in results if r["split"] == "fitted"]
    if fitted:
        lines.append(_row("all fitted", fitted))
    for name in ("<= 64 KiB", "<= 16 MiB", "> 16 MiB"):
        part = [r for r in held if regime(r["bytes"]) == name]
        if part:
            lines.append(_row(f"held out, S {name}", part))
    for name, keep in (
        ("nccl-tests", lambda r: r["framework"].startswith("nccl-tests")),
        ("nccl-tests -g N (one process launches every GPU: host launches in the timing)", one_process),
        (
            "nccl-tests, a process a GPU or not stated",
            lambda r: r["framework"].startswith("nccl-tests") and not one_process(r),
        ),
        ("torch.distributed (host launch in the timing)", lambda r: r["framework"].startswith("torch")),
        ("one node", lambda r: r["nodes"] == 1),
        ("several nodes", lambda r: r["nodes"] > 1),
    ):
        part = [r for r in held if keep(r)]
        if part:
            lines.append(_row(f"held out, {name}", part))
            for size in ("<= 64 KiB", "<= 16 MiB", "> 16 MiB"):
                sized = [r for r in part if regime(r["bytes"]) == size]
                if sized and name == "nccl-tests":
                    lines.append(_row(f"held out, nccl-tests, S {size}", sized))
    lines += ["", "## Per collective", "", head.replace("group", "collective, split"), rule]
    for collective in sorted({r["collective"] for r in results}):
        for split in ("fitted", "held out"):
            part = [r for r in results if r["collective"] == collective and r["split"] == split]
            if part:
                lines.append(_row(f"{collective}, {split}", part))
    lines += ["", "## Per collective and GPU", "", head.replace("group", "collective, GPU, split"), rule]
    groups: dict[tuple, list[dict]] = {}
    for r in results:
        groups.setdefault((r["collective"], r["gpu"], r["split"]), []).append(r)
    for (collective, gpu, split), part in sorted(groups.items()):
        lines.append(_row(f"{collective}, {gpu}, {split}", part))
    lines += ["", "## Per source and framework (held out)", "", head.replace("group", "source"), rule]
    by_source: dict[str, list[dict]] = {}
    for r in held:
        by_source.setdefault(
            r["source"].split(" (")[0].split(", section")[0] + " / " + r["framework"].split(",")[0], []
        ).append(r)
    for name, part in sorted(by_source.items()):
        lines.append(_row(name, part))
    lines += [
        "",
        "## Worst held-out points",
        "",
        "| point | GPU | S (B) | ranks | measured us | estimated us | error | castcore's pick |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in sorted(held, key=lambda r: -abs(r["error"]))[:15]:
        lines.append(
            f"| {r['id']} | {r['gpu']} | {int(r['bytes'])} | {r['ranks']} | {r['measured_s'] * 1e6:.1f} | "
            f"{r['estimated_s'] * 1e6:.1f} | {r['error']:+.0%} | {r['how']} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT, help=f"markdown report (default {OUT})")
    args = parser.parse_args(argv)
    text = report(score(load()))
    args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
