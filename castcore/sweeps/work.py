"""What a worker does: make the sweep's Session once per process, given the capture cache as its capture step,
and run a task's points one after another (a task is the points that share their captures), one row of figures
each."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from castcore.options.option import terms
from castcore.sweeps.spec import Job, one_line


@dataclass(frozen=True)
class Settings:
    """What every worker needs, the same for the whole sweep: the Session's options and the working folder
    (relative model and device paths, ``package.module:factory`` on the path)."""

    session: dict[str, Any] = field(default_factory=dict)  # castcore.Session keyword arguments
    cwd: str = ""
    disk_cache: bool = True

    def key(self) -> str:
        return repr(sorted(self.session.items()))


@dataclass
class Task:
    """Points a worker runs in one go, in order: (the point's index, its job)."""

    id: int
    points: list[tuple[int, Job]]
    # What a worker that ran the task keeps for the next like it (Job.kept): the local backend gives such a task
    # to that worker, whose step-time models and captures are then already in memory.
    kept: tuple = ()


_sessions: dict[str, Any] = {}
_cache: Any = None  # this process's capture cache, shared by its sessions


def prepare(settings: Settings) -> tuple[Any, Any]:
    """This process's Session for ``settings`` and its capture cache, made on first use."""
    global _cache
    if settings.cwd and os.path.isdir(settings.cwd) and os.getcwd() != settings.cwd:
        os.chdir(settings.cwd)
    if settings.cwd and settings.cwd not in sys.path:
        sys.path.insert(0, settings.cwd)
    if _cache is None:
        from castcore.sweeps.capture import CaptureCache

        _cache = CaptureCache(disk=settings.disk_cache)
    if settings.key() not in _sessions:
        from castcore.session import Session

        _sessions[settings.key()] = Session(**settings.session, capture_step=_cache)
    return _sessions[settings.key()], _cache


def warm_up() -> None:
    """Load castcore, torch and the capture cache in this process ahead of its first task."""
    import castcore.sweeps.capture  # noqa: F401
    import castcore.session  # noqa: F401


def figures(session: Any, job: Job) -> dict[str, Any]:
    """The figures of one point, as its row holds them."""
    from castcore.sweeps.rows import estimate_figures, serve_figures, simulate_figures

    if job.command == "estimate":
        return estimate_figures(session.estimate(job.workload, device=job.device), job.workload)
    if job.command == "simulate":
        report = session.simulate(device=job.device, **job.simulate)
        return simulate_figures(report, job.simulate.get("price_per_device_hour"), session.pipeline.host)
    return serve_figures(session.serve(device=job.device, **job.serve))


def run_task(task: Task, settings: Settings) -> Iterator[tuple[int, dict[str, Any]]]:
    """Each point's figures with ``error`` and ``seconds``, as it finishes; a point that fails gives its error and
    the next one runs."""
    try:
        session, _ = prepare(settings)
    except Exception as exc:  # the sweep's plugins or devices cannot load here: every point says why
        for index, _ in task.points:
            yield index, {"error": one_line(exc), "seconds": 0.0}
        return
    for index, job in task.points:
        started = time.perf_counter()
        try:
            with terms("spec"):  # a row's error names options as the spec does
                row = {**figures(session, job), "error": None}
        except Exception as exc:  # any failure is the point's, never the sweep's
            row = {"error": one_line(exc)}
        row["seconds"] = time.perf_counter() - started
        yield index, row


def stats() -> dict[str, Any]:
    """This process's capture counts and cache warnings so far."""
    return _cache.stats.to_dict() if _cache is not None else {}


def stats_since(before: dict[str, Any]) -> dict[str, Any]:
    """The capture counts and cache warnings added since ``before`` (a stats() taken earlier)."""
    return _cache.stats.since(before) if _cache is not None else {}


def run_whole_task(task: Task, settings: Settings) -> tuple[list[tuple[int, dict[str, Any]]], dict[str, Any]]:
    """Every row of a task and the capture counts it added (a Ray task returns them at once)."""
    before = stats()
    rows = list(run_task(task, settings))
    return rows, stats_since(before)
