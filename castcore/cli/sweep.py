"""``castcore sweep SPEC.toml``: runs castcore.sweeps.sweep.sweep on a spec file and prints what it returns."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from castcore.cli.common import note, warn
from castcore.cli.options import add_options
from castcore.cli.page import page_path, write_page
from castcore.options.catalog import SWEEP
from castcore.plugins.selection import PluginOptions


def run(args: argparse.Namespace) -> int:
    from castcore.sweeps.row_files import write_rows
    from castcore.sweeps.sweep import sweep

    html = page_path(args)
    result = sweep(
        args.spec,
        out=args.out,
        workers=args.workers,
        backend=args.backend,
        ray_address=args.ray_address,
        resume=args.resume,
        yes=args.yes,
        plot=args.plot,
        plugins=PluginOptions.of(args),
        log=note,
    )
    for line in result.warnings:  # workers that died; what the workers' capture caches said
        warn(line)
    stats = result.stats
    rate = f", {result.ran / result.seconds:.1f} points/s" if result.ran and result.seconds else ""
    note(
        f"{result.ran} points run in {result.seconds:.1f} s{rate}"
        + (f", {result.resumed} resumed from {args.out}" if args.resume else "")
        + f"; captures: {stats.captured} made, {stats.reused} reused in this sweep, {stats.loaded} from the cache "
        f"({stats.hit_ratio:.0%} hits); {result.failed} rows with an error"
    )
    if args.out:
        note(f"wrote {len(result.rows)} rows to {args.out}")
    else:
        import tempfile

        with tempfile.TemporaryDirectory() as folder:
            table = Path(folder) / "rows.csv"
            write_rows(table, result.rows, result.columns)
            sys.stdout.write(table.read_text(encoding="utf-8"))
    if html:
        from castcore.report.html.sweep import sweep_data

        write_page(html, "sweep", sweep_data(result.rows, result.columns, result.command))
    if result.plot is not None:
        note(f"wrote the Pareto picture to {args.plot} ({result.plot})")
    return 0


def add_parser(subparsers) -> None:
    cmd = subparsers.add_parser(
        "sweep",
        help="run a grid of estimate or serve points (devices x models x batches x ...) to a table",
        description='Run every point of a spec\'s grid: command = "estimate" or "serve", then any of the '
        "command's options (long name without dashes: model, device, batch, seq, phase, tp, input, "
        "output, weights, ...) with a value or a list of values; the grid is their product. Each row "
        "holds the point's parameters, its figures, an error column and its seconds. Points that "
        "share a capture share it (devices alike too), and captures are cached on disk "
        "(castcore cache).",
    )
    cmd.add_argument("spec", metavar="SPEC.toml", help="the sweep spec (TOML)")
    add_options(cmd, SWEEP)
    cmd.set_defaults(func=run)
