"""``castcore.sweep(grid)``: every point of a spec's grid of estimate or serve points, one row each, optionally
written to .parquet, .csv or .jsonl; ``castcore sweep SPEC.toml`` prints what this returns.

The spec's keys are the commands' own options (castcore.options.catalog), and every point is checked as those
commands check their options (castcore.sweeps.spec).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from castcore.errors import StrictFailure
from castcore.options.catalog import ESTIMATE, SERVE, say
from castcore.options.traffic import SIMULATE
from castcore.plugins.selection import PluginOptions, profiles_without_plugins
from castcore.sweeps.run import SweepResult
from castcore.sweeps.spec import (
    Command,
    Job,
    Point,
    Spec,
    check_devices,
    check_size,
    check_spec,
    expand,
    key_lines,
    read_spec,
)
from castcore.sweeps.work import Settings
from castcore.workload.spec import DEPLOYMENT, ModelError, build_workload

Log = Callable[[str], None]


def _estimate_job(values: dict[str, Any]) -> Job:
    options = {k: v for k, v in values.items() if k not in ("model", "device")}
    return Job("estimate", values["device"], workload=build_workload(values["model"], **options))


def _serve_job(values: dict[str, Any]) -> Job:
    from castcore.serving.static import check_request

    batch = "max" if values["max_batch"] else values["batch"]
    deployment = {name: values[name] for name in DEPLOYMENT}
    check_request(values["model"], values["input_tokens"], values["output_tokens"], batch, **deployment)
    return Job(
        "serve",
        values["device"],
        serve={
            "model": values["model"],
            "input_tokens": values["input_tokens"],
            "output_tokens": values["output_tokens"],
            "batch": batch,
            "price_per_device_hour": values["price_per_device_hour"],
            **deployment,
        },
    )


def _simulate_job(values: dict[str, Any]) -> Job:
    from castcore.serving.simulation_plan import check

    options = {k: v for k, v in values.items() if k not in ("model", "device")}
    check(values["model"], **options)  # the options, the lengths or dataset, the model's position limit
    return Job("simulate", values["device"], simulate={"model": values["model"], **options})


def commands() -> dict[str, Command]:
    """estimate, serve and simulate as a sweep sees them."""
    return {
        "estimate": Command(ESTIMATE, _estimate_job),
        "serve": Command(SERVE, _serve_job),
        "simulate": Command(SIMULATE, _simulate_job),
    }


def open_session(plugins: PluginOptions, log: Log | None = None, **extra: Any) -> Any:
    """A Session of the plugin options; its plugin problems go to ``log``, and fail under strict."""
    from castcore.session import Session

    session = Session(**plugins.session_kwargs(), **extra)
    for line in session.warnings + session.notes:
        if log is not None:
            log(f"warning: {line}")
    if session.config.strict and session.warnings:  # a note (a slow import) is no fault
        raise StrictFailure(
            f"{len(session.warnings)} plugin problem(s) and {say('strict', True)} is on"
            + (" (above)" if log is not None else f": {'; '.join(session.warnings)}")
        )
    return session


def check(
    data: dict[str, Any],
    plugins: PluginOptions | None = None,
    yes: bool = False,
    lines: dict[str, int] | None = None,
) -> tuple[Spec, PluginOptions, Settings]:
    """Check a spec's keys, values and size (torch-free); the spec, its plugin options with ``plugins`` added,
    and the Settings every worker gets."""
    spec = check_spec(data, commands(), lines)
    check_size(spec, yes)
    merged = PluginOptions.of(spec.session).merged(plugins or PluginOptions())
    session = merged.session_kwargs()
    if spec.session.get("on_error"):
        session["on_error"] = spec.session["on_error"]
    return (
        spec,
        merged,
        Settings(session=session, cwd=os.getcwd(), disk_cache=not spec.session.get("no_cache")),
    )


def points_of(spec: Spec, plugins: PluginOptions, log: Log | None = None) -> list[Point]:
    """Check the devices and every point against the plugins' devices and the command's own checks."""
    # With every device named, the profiles are read without loading the packs and torch in this process when
    # it can, so the workers starting beside it have the CPUs to themselves.
    devices = profiles_without_plugins(plugins) if "device" in spec.axes and not plugins.strict else None
    if devices is not None:
        check_devices(spec, devices)
        return expand(spec, "")
    on_error = spec.session.get("on_error")
    session = open_session(plugins, log, **({"on_error": on_error} if on_error else {}))
    check_devices(spec, session.devices)
    return expand(spec, session.device(None).name)


def sweep(
    grid: dict[str, Any] | str | Path,
    *,
    out: str | Path | None = None,
    workers: int | None = None,
    backend: str = "local",
    ray_address: str | None = None,
    resume: bool = False,
    yes: bool = False,
    plot: str | Path | None = None,
    progress: bool = False,
    plugins: PluginOptions | None = None,
    log: Log | None = None,
) -> SweepResult:
    """Run a sweep: ``grid`` is a spec as a dict (``{"command": "estimate", "model": [...], "batch": [1, 8]}``) or
    the path of a TOML spec. The SweepResult holds every point's row (parameters, figures, ``error``,
    ``seconds``) in grid order, and is itself the sequence of those rows; they are also written to ``out``
    (.parquet, .csv, .jsonl) when given. ``plugins`` adds to the spec's plugin options; ``log`` gets progress
    lines. See ``castcore sweep --help``."""
    from castcore.sweeps import store
    from castcore.sweeps.row_files import check_out
    from castcore.sweeps.run import backend_for, run_points, worker_count

    if resume and out is None:
        raise ModelError(f"{say('resume', True)} reads the rows already in {say('out')}: give {say('out')}")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise ModelError(f"{say('workers', workers)}: must be a whole number of at least 1")
    lines = key_lines(grid) if isinstance(grid, (str, Path)) else None
    data = read_spec(grid) if isinstance(grid, (str, Path)) else dict(grid)
    target = check_out(out) if out is not None else None
    chart = check_plot(plot)
    spec, merged, settings = check(data, plugins, yes=yes, lines=lines)
    count, why = worker_count(workers, spec.size, local=backend == "local")
    if why and log is not None:
        log(why)
    cache_problem = store.problem()
    if cache_problem:  # said once here; the workers then keep captures in memory only
        if log is not None:
            log(f"warning: {cache_problem}")
        settings = replace(settings, disk_cache=False)
    # The workers start now: their imports overlap this process's checking of every point.
    with backend_for(backend, count, settings, ray_address) as runner:
        points = points_of(spec, merged, log)
        if log is not None:
            refused = sum(1 for p in points if p.error)
            log(
                f"{len(points)} {spec.command.name} points ({refused} refused by castcore {spec.command.name}'s "
                "checks), "
                + (
                    "Ray"
                    if backend == "ray"
                    else f"{count} local worker process" + ("es" if count > 1 else "")
                )
            )
        result = run_points(
            points, spec.command.axes(), settings, out=target, resume=resume, runner=runner, progress=progress
        )
    result.command = spec.command.name
    if chart is not None:
        result.plot = draw(result.rows, spec.command.name, chart)
    return result


def check_plot(plot: str | Path | None) -> Path | None:
    """The Pareto picture's path, checked writable, when matplotlib is installed; None for no picture."""
    if plot is None:
        return None
    from castcore.report.output_files import check_output

    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ModelError(f"{say('plot')} needs matplotlib: pip install 'castcore[plot]'") from None
    return check_output(plot, "plot")


def draw(rows: list[dict[str, Any]], command: str, path: Path) -> str:
    """Draw the Pareto picture to ``path``; what it shows."""
    from castcore.report.output_files import write_whole
    from castcore.sweeps.plot import plot_pareto

    drawn: list[str] = []
    write_whole(path, "plot", lambda p: drawn.append(plot_pareto(rows, command, p, path.suffix)))
    return drawn[0]
