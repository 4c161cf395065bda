"""``castcore sweep SPEC.toml``: a grid of estimate or serve points, one row each, to .parquet, .csv or .jsonl;
and ``castcore.sweep(grid)``, the same from Python.

The spec's keys are the command's own options, read off the parsers ``castcore estimate`` and ``castcore serve``
are built with (castcore.sweeps.spec), and every point is checked as those commands check their options.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from castcore.cli import estimate, serve
from castcore.cli.common import add_plugin_options, deployment_from, make_session, note, warn, workload_from
from castcore.sweeps.spec import Command, Job, Point, Spec, check_devices, check_size, check_spec, expand, read_spec
from castcore.workload.spec import ModelError

OUTPUT_OPTIONS = frozenset({"json", "csv", "top", "by", "trace", "plot", "debug"})


class _Refusing(argparse.ArgumentParser):
    """A command's parser that raises ModelError where the command line would print usage and exit."""

    def error(self, message: str):
        raise ModelError(message)


def _estimate_job(args: argparse.Namespace) -> Job:
    return Job("estimate", args.device, workload=workload_from(args))


def _serve_job(args: argparse.Namespace) -> Job:
    from castcore.workload.serving import check_request

    batch = "max" if args.max_batch else args.batch
    deployment = deployment_from(args)
    check_request(args.model, args.input, args.output, batch, **deployment)
    return Job("serve", args.device, serve={"model": args.model, "input_tokens": args.input,
                                            "output_tokens": args.output, "batch": batch, **deployment})


def commands() -> dict[str, Command]:
    """estimate and serve as a sweep sees them, from the parsers the command line runs."""
    sub = argparse.ArgumentParser(prog="castcore").add_subparsers(parser_class=_Refusing)
    estimate.add_parser(sub)
    serve.add_parser(sub)
    plugins = argparse.ArgumentParser(add_help=False)
    add_plugin_options(plugins)
    session = frozenset(a.dest for a in plugins._actions) - OUTPUT_OPTIONS | {"on_error"}
    return {name: Command(name=name, parser=sub.choices[name], session_options=session, output_options=OUTPUT_OPTIONS,
                          to_job=job) for name, job in (("estimate", _estimate_job), ("serve", _serve_job))}


def plugin_namespace(spec: Spec, args: argparse.Namespace | None = None) -> argparse.Namespace:
    """The plugin options of the spec and of the command line together, as make_session reads them."""
    merged: dict[str, Any] = {n: [*(spec.session.get(n) or []), *(getattr(args, n, None) or [])] or None
                              for n in ("custom_op_dir", "device_file")}
    merged.update({n: bool(spec.session.get(n)) or bool(getattr(args, n, None))
                   for n in ("no_packs", "strict", "no_default_custom_op_dirs")})
    merged["strict"] = merged["strict"] or None  # None: the config file and CASTCORE_STRICT decide
    return argparse.Namespace(**merged)


def session_options(plugins: argparse.Namespace, on_error: str | None = None) -> dict[str, Any]:
    """castcore.Session's keyword arguments for the plugin options, as make_session passes them."""
    options = {"custom_op_dirs": plugins.custom_op_dir, "device_files": plugins.device_file,
               "load_packs": [] if plugins.no_packs else None, "strict": plugins.strict,
               "default_custom_op_dirs": False if plugins.no_default_custom_op_dirs else None}
    if on_error:
        options["on_error"] = on_error
    return options


def check(data: dict[str, Any], args: argparse.Namespace | None = None, yes: bool = False
          ) -> tuple[Spec, argparse.Namespace, Any]:
    """Check a spec's keys, values and size (torch-free); the spec, its plugin options and the Settings every
    worker gets."""
    from castcore.sweeps.work import Settings

    spec = check_spec(data, commands())
    check_size(spec, yes)
    plugins = plugin_namespace(spec, args)
    return spec, plugins, Settings(session=session_options(plugins, spec.session.get("on_error")), cwd=os.getcwd())


def points_of(spec: Spec, plugins: argparse.Namespace) -> list[Point]:
    """Check the devices and every point against the plugins' devices and the command's own checks."""
    from castcore.cli.devices import _profiles_without_plugins

    # With every device named, the profiles are read as castcore devices reads them: without loading the packs
    # and torch in this process when it can, so the workers starting beside it have the CPUs to themselves.
    devices = _profiles_without_plugins(plugins) if "device" in spec.axes and not plugins.strict else None
    if devices is not None:
        check_devices(spec, devices)
        return expand(spec, "")
    on_error = spec.session.get("on_error")
    session = make_session(plugins, **({"on_error": on_error} if on_error else {}))
    check_devices(spec, session.devices)
    return expand(spec, session.device(None).name)


def sweep(grid: dict[str, Any] | str | Path, *, out: str | Path | None = None, workers: int | None = None,
          backend: str = "local", ray_address: str | None = None, resume: bool = False, yes: bool = False,
          plot: str | Path | None = None, progress: bool = False) -> list[dict[str, Any]]:
    """Run a sweep: ``grid`` is a spec as a dict (``{"command": "estimate", "model": [...], "batch": [1, 8]}``) or
    the path of a TOML spec; every point's row (parameters, figures, ``error``, ``seconds``) in grid order, also
    written to ``out`` (.parquet, .csv, .jsonl) when given. See ``castcore sweep --help``."""
    from castcore.sweeps.files import check_out
    from castcore.sweeps.run import run_points

    data = read_spec(grid) if isinstance(grid, (str, Path)) else dict(grid)
    if resume and out is None:
        raise ModelError("resume=True reads the rows already in out: give out")
    target = check_out(out) if out is not None else None
    chart = _check_plot(plot)
    spec, plugins, settings = check(data, yes=yes)
    result = run_points(points_of(spec, plugins), spec.command.axes(), settings, workers=workers, backend=backend,
                        ray_address=ray_address, out=target, resume=resume, progress=progress)
    if chart is not None:
        _plot(result.rows, spec.command.name, chart)
    return result.rows


def _check_plot(plot: str | Path | None) -> Path | None:
    if plot is None:
        return None
    from castcore.report.files import check_output

    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ModelError("--plot needs matplotlib: pip install 'castcore[plot]'") from None
    return check_output(plot, "--plot")


def _plot(rows: list[dict[str, Any]], command: str, path: Path) -> str:
    from castcore.report.files import write_whole
    from castcore.sweeps.plot import plot_pareto

    drawn: list[str] = []
    write_whole(path, "--plot", lambda p: drawn.append(plot_pareto(rows, command, p, path.suffix)))
    return drawn[0]


def run(args: argparse.Namespace) -> int:
    from castcore.sweeps.files import check_out, write_rows
    from castcore.sweeps.run import backend_for, run_points, worker_count

    if args.resume and not args.out:
        raise ModelError("--resume reads the rows already in --out: give --out")
    if args.workers is not None and args.workers < 1:
        raise ModelError(f"--workers must be at least 1 (got {args.workers})")
    data = read_spec(args.spec)
    target = check_out(args.out) if args.out else None
    chart = _check_plot(args.plot)
    spec, plugins, settings = check(data, args, yes=args.yes)
    workers, why = worker_count(args.workers, spec.size, local=args.backend == "local")
    if why:
        note(why)
    from castcore.sweeps import store

    cache_problem = store.problem()
    if cache_problem:  # said once here; the workers then keep captures in memory only
        warn(cache_problem)
        settings = replace(settings, disk_cache=False)
    # The workers start now: their imports overlap this process's checking of every point.
    with backend_for(args.backend, workers, settings, args.ray_address) as runner:
        points = points_of(spec, plugins)
        refused = sum(1 for p in points if p.error)
        note(f"{len(points)} {spec.command.name} points ({refused} refused by castcore {spec.command.name}'s "
             "checks), " + ("Ray" if args.backend == "ray" else
                            f"{workers} local worker process" + ("es" if workers > 1 else "")))
        result = run_points(points, spec.command.axes(), settings, out=target, resume=args.resume, runner=runner)
    for death in result.deaths:
        note(f"warning: {death}")
    for line in result.stats.warnings:  # what the workers' capture caches said (an unreadable entry discarded)
        warn(line)
    stats = result.stats
    rate = f", {result.ran / result.seconds:.1f} points/s" if result.ran and result.seconds else ""
    note(f"{result.ran} points run in {result.seconds:.1f} s{rate}"
         + (f", {result.resumed} resumed from {target}" if args.resume else "")
         + f"; captures: {stats.captured} made, {stats.reused} reused in this sweep, {stats.loaded} from the cache "
           f"({stats.hit_ratio:.0%} hits); {result.failed} rows with an error")
    if target is not None:
        note(f"wrote {len(result.rows)} rows to {target}")
    else:
        import tempfile

        with tempfile.TemporaryDirectory() as folder:
            table = Path(folder) / "rows.csv"
            write_rows(table, result.rows, result.columns)
            sys.stdout.write(table.read_text(encoding="utf-8"))
    if chart is not None:
        note(f"wrote the Pareto picture to {chart} ({_plot(result.rows, spec.command.name, chart)})")
    return 0


def add_parser(subparsers) -> None:
    cmd = subparsers.add_parser(
        "sweep", help="run a grid of estimate or serve points (devices x models x batches x ...) to a table",
        description="Run every point of a spec's grid: command = \"estimate\" or \"serve\", then any of the "
                    "command's options (long name without dashes: model, device, batch, seq, phase, tp, input, "
                    "output, weights, ...) with a value or a list of values; the grid is their product. Each row "
                    "holds the point's parameters, its figures, an error column and its seconds. Points that "
                    "share a capture share it (devices alike too), and captures are cached on disk "
                    "(castcore cache).")
    cmd.add_argument("spec", metavar="SPEC.toml", help="the sweep spec (TOML)")
    cmd.add_argument("--out", metavar="FILE", help="write the rows to FILE: .parquet (needs pyarrow: "
                                                   "castcore[sweep]), .csv or .jsonl (default: CSV on stdout)")
    cmd.add_argument("--workers", type=int, metavar="N", help="local worker processes (default: the CPU count)")
    cmd.add_argument("--backend", choices=("local", "ray"), default="local",
                     help="local processes, or Ray tasks (needs castcore[ray]) (default: local)")
    cmd.add_argument("--ray-address", metavar="ADDR", help="the Ray cluster to run on (default: RAY_ADDRESS, "
                                                           "else a local Ray instance of --workers CPUs)")
    cmd.add_argument("--resume", action="store_true",
                     help="keep the rows already in --out that have no error, and run only the other points")
    cmd.add_argument("--yes", action="store_true", help="run a spec of more than 100,000 points")
    cmd.add_argument("--plot", metavar="PNG", help="draw latency against throughput per device, the Pareto front "
                                                   "marked, one colour per device (needs castcore[plot])")
    add_plugin_options(cmd)
    cmd.set_defaults(func=run)
