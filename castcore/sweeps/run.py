"""Running points: grouped into tasks by the captures they share, handed to a backend, rows gathered in grid
order, written as they finish and whole at the end.

Points that differ only in the device share a task, so their captures are made once (devices alike share the
capture itself; see castcore.sweeps.capture) and no two workers capture the same steps at once. A worker that
dies (killed, out of memory) costs only its task's unfinished points: each is retried once on its own, and
marked failed if its worker dies again.
"""

from __future__ import annotations

import itertools
import os
import sys
import time
from collections import Counter, deque
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from castcore.options.catalog import say
from castcore.report.output_files import OutputError
from castcore.sweeps import row_files
from castcore.sweeps.rows import columns, parameter_key
from castcore.sweeps.spec import Point
from castcore.sweeps.store import Stats
from castcore.sweeps.work import Settings, Task
from castcore.workload.spec import ModelError

RETRIES = 1  # runs of a point after its worker died


class Scheduler:
    """The tasks still to run, and what to do with what comes back (a row, a task done, a worker dead)."""

    def __init__(self, tasks: list[Task], on_row: Callable[[int, dict[str, Any]], None]):
        self.pending = deque(tasks)
        self._waiting = Counter(t.kept for t in tasks)  # pending tasks by what they keep
        self.on_row = on_row
        self.stats = Stats()
        self.attempts: dict[int, int] = {}
        self.deaths: list[str] = []  # how each worker died (the rows' error says only that one did)
        self._unfinished = {t.id: {i for i, _ in t.points} for t in tasks}
        self._ids = itertools.count(max((t.id for t in tasks), default=0) + 1)

    def take(self, here: Collection[tuple] = (), elsewhere: Collection[tuple] = ()) -> Task | None:
        """The next task: the first whose kept state is ``here`` (a worker's), else the first no other worker
        keeps (``elsewhere``), else the first."""
        if not self.pending:
            return None
        tries = [lambda t: t.kept not in elsewhere]
        if any(
            self._waiting[k] for k in here
        ):  # a scan only where one will match: a sweep may hold thousands
            tries.insert(0, lambda t: t.kept in here)
        found = next((i for wanted in tries for i, t in enumerate(self.pending) if wanted(t)), 0)
        task = self.pending[found]
        del self.pending[found]
        self._waiting[task.kept] -= 1
        return task

    def row(self, task_id: int, index: int, row: dict[str, Any]) -> None:
        if index in self._unfinished.get(task_id, ()):
            self._unfinished[task_id].discard(index)
            self.on_row(index, row)

    def done(self, task_id: int, stats: dict[str, int]) -> None:
        self._unfinished.pop(task_id, None)
        self.stats.add(Stats(**stats))

    def died(self, task: Task, how: str) -> None:
        """The worker running ``task`` died: its unfinished points go back one by one, or fail on a second death."""
        left = self._unfinished.pop(task.id, set())
        retried = failed = 0
        for index, job in task.points:
            if index not in left:
                continue
            self.attempts[index] = self.attempts.get(index, 0) + 1
            if self.attempts[index] > RETRIES:
                failed += 1
                self.on_row(
                    index,
                    {
                        "error": "the worker running this point died (killed, or out of memory), "
                        "and again when the point was retried on its own; run it alone to "
                        "see why",
                        "seconds": None,
                    },
                )
                continue
            retried += 1
            retry = Task(id=next(self._ids), points=[(index, job)], kept=task.kept)
            self._unfinished[retry.id] = {index}
            self.pending.append(retry)
            self._waiting[retry.kept] += 1
        self.deaths.append(
            f"a worker died ({how}): {retried} unfinished point(s) retried on their own, {failed} "
            "marked failed"
        )


class Progress:
    """Points done, rate and time left, redrawn on one terminal line; silent when stderr is no terminal."""

    def __init__(self, total: int, stream: TextIO | None = None, enabled: bool | None = None):
        self.total, self.done = total, 0
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.started = time.perf_counter()
        self._drawn = 0.0

    def advance(self, count: int = 1) -> None:
        self.done += count
        now = time.perf_counter()
        if self.enabled and (now - self._drawn > 0.1 or self.done == self.total):
            self._drawn = now
            elapsed = now - self.started
            rate = self.done / elapsed if elapsed else 0.0
            left = (self.total - self.done) / rate if rate else 0.0
            width = 30
            filled = int(width * self.done / self.total) if self.total else width
            print(
                f"\r[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} points, {rate:.1f}/s, "
                f"ETA {_duration(left)}  ",
                end="",
                file=self.stream,
                flush=True,
            )

    def close(self) -> None:
        if self.enabled and self._drawn:
            print(file=self.stream)


def _duration(seconds: float) -> str:
    seconds = int(seconds + 0.5)
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


@dataclass
class SweepResult(Sequence):
    """A sweep's rows in grid order, and what running them took; a sequence of its rows (what castcore.sweep
    returned before it returned this)."""

    rows: list[dict[str, Any]]
    columns: list[str]
    stats: Stats = field(default_factory=Stats)
    deaths: list[str] = field(default_factory=list)  # workers that died, and the points they took with them
    ran: int = 0  # points run now (the rest were refused by their command or resumed)
    resumed: int = 0
    seconds: float = 0.0
    command: str = ""
    plot: str | None = None  # what the Pareto picture shows, when one was drawn

    @property
    def failed(self) -> int:
        return sum(1 for row in self.rows if row.get("error"))

    @property
    def warnings(self) -> list[str]:
        """What a user should know: workers that died, and what the workers' capture caches said."""
        return [*self.deaths, *self.stats.warnings]

    def __getitem__(self, index):  # type: ignore[override]
        return self.rows[index]

    def __len__(self) -> int:
        return len(self.rows)


def _check_resumable(rows: list[dict[str, Any]], parameters: list[str], grid: set[tuple], out: Path) -> None:
    """Refuse to resume from rows another sweep (or something else) wrote: each row a sweep writes starts with its
    command's parameters, in order, and is a point of its grid (a grid grown since is fine)."""
    for row in rows:
        if list(row)[: len(parameters)] != parameters:
            missing = [p for p in parameters if p not in row]
            other = [k for k in list(row)[: len(parameters)] if k not in parameters]
            raise OutputError(
                f"{say('resume', True)}: {out} holds rows of another sweep ("
                + "; ".join(
                    filter(
                        None,
                        [
                            f"no column {', '.join(missing[:5])}" if missing else "",
                            f"columns {', '.join(other[:5])} this command does not have" if other else "",
                            "its columns in another order" if not (missing or other) else "",
                        ],
                    )
                )
                + f"): move it away, or give another {say('out')}"
            )
    foreign = [row for row in rows if parameter_key(row, parameters) not in grid]
    if foreign:
        varies = [p for p in parameters if len({str(row.get(p)) for row in rows}) > 1 or p == parameters[0]]
        example = ", ".join(f"{p} = {foreign[0].get(p)!r}" for p in varies[:4])
        raise OutputError(
            f"{say('resume', True)}: {out} holds {len(foreign)} row(s) that are no point of this spec "
            f"(the first: {example}): it was written by another spec; move it away, or give another "
            f"{say('out')}"
        )


def group(points: list[Point]) -> list[Task]:
    """One task per set of points whose jobs differ only in the device, in grid order."""
    shared: dict[tuple, list] = {}
    for point in points:
        shared.setdefault(point.job.shared(), []).append((point.index, point.job))
    return [
        Task(id=i, points=members, kept=members[0][1].kept()) for i, members in enumerate(shared.values())
    ]


def default_workers() -> int:
    return os.cpu_count() or 1


# room for one local worker: torch, transformers and a large model's capture (0.4-0.8 GiB)
WORKER_BYTES = 1 << 30


def worker_count(asked: int | None, points: int, local: bool = True) -> tuple[int, str | None]:
    """How many workers to start for ``points`` points, and why when that is fewer than asked: never more than the
    points, and locally never more than the cores or what the free memory holds (each worker imports torch)."""
    wanted = asked or default_workers()
    limits = {f"{points} point{'s' * (points != 1)}": max(1, points)}
    if local:
        limits[f"{default_workers()} cores"] = default_workers()
        try:
            free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):  # not on this system: no memory limit known
            free = 0
        if free:
            limits[f"free memory for {max(1, free // WORKER_BYTES)}"] = max(1, free // WORKER_BYTES)
    count = min(wanted, *limits.values())
    if count >= wanted or asked is None:
        return count, None
    held = ", ".join(reason for reason, limit in limits.items() if limit == count)
    return count, f"--workers {asked}: starting {count} ({held})"


def backend_for(name: str, workers: int | None, settings: Settings, ray_address: str | None = None) -> Any:
    """A backend: a context manager (its workers live until it exits) with ``run(scheduler)``."""
    if name == "ray":
        from castcore.sweeps.ray_backend import RayBackend

        return RayBackend(workers or default_workers(), settings, ray_address)
    if name != "local":
        raise ModelError(f"unknown backend {name!r}; use local or ray")
    from castcore.sweeps.local import LocalBackend

    return LocalBackend(workers or default_workers(), settings)


def run_points(
    points: list[Point],
    parameters: list[str],
    settings: Settings,
    *,
    workers: int | None = None,
    backend: str = "local",
    ray_address: str | None = None,
    out: Path | None = None,
    resume: bool = False,
    progress: Progress | bool | None = None,
    runner: Any = None,
) -> SweepResult:
    """Run every point not refused (and, with ``resume``, not already in ``out`` without an error); the rows.
    ``runner``: a backend already entered (see backend_for), kept running for the caller's next points."""
    if out is None:
        return _run_points(
            points, parameters, settings, workers, backend, ray_address, None, resume, progress, runner
        )
    with row_files.held(out):
        return _run_points(
            points, parameters, settings, workers, backend, ray_address, out, resume, progress, runner
        )


def _run_points(
    points: list[Point],
    parameters: list[str],
    settings: Settings,
    workers: int | None,
    backend: str,
    ray_address: str | None,
    out: Path | None,
    resume: bool,
    progress: Progress | bool | None,
    runner: Any,
) -> SweepResult:
    started = time.perf_counter()
    rows: dict[int, dict[str, Any]] = {}
    earlier: dict[tuple, dict[str, Any]] = {}
    if out is not None and resume:
        found = row_files.read_rows(out)
        _check_resumable(found, parameters, {parameter_key(p.params, parameters) for p in points}, out)
        for row in found:  # later rows (the journal) replace earlier ones of the same point
            earlier[parameter_key(row, parameters)] = row
    elif out is not None:
        row_files.journal(out).unlink(missing_ok=True)
    resumed = 0
    for point in points:
        kept = earlier.pop(parameter_key(point.params, parameters), None)
        if kept is not None and not kept.get("error"):
            rows[point.index], resumed = kept, resumed + 1
        elif point.error:
            rows[point.index] = {**point.params, "error": point.error, "seconds": 0.0}
    todo = [p for p in points if p.index not in rows]
    by_index = {p.index: p for p in todo}
    shown = progress if isinstance(progress, Progress) else Progress(len(todo), enabled=progress)

    def finished(index: int, row: dict[str, Any]) -> None:
        full = {**by_index[index].params, **row}
        rows[index] = full
        if out is not None:
            row_files.append(out, [full])
        shown.advance()

    scheduler = Scheduler(group(todo), finished)
    try:
        if runner is not None:
            runner.run(scheduler)
        elif todo:
            workers, _ = worker_count(workers, len(todo), local=backend == "local")
            with backend_for(backend, workers, settings, ray_address) as runner:
                runner.run(scheduler)
    finally:
        shown.close()
    ordered = [rows[i] for i in sorted(rows)]  # (--resume took only rows of this grid: see _check_resumable)
    names = columns(ordered, parameters)
    # every row with every column, None where absent
    ordered = [{c: row.get(c) for c in names} for row in ordered]
    result = SweepResult(
        rows=ordered,
        columns=names,
        stats=scheduler.stats,
        deaths=scheduler.deaths,
        ran=len(todo),
        resumed=resumed,
        seconds=time.perf_counter() - started,
    )
    if out is not None:
        row_files.write_rows(out, result.rows, result.columns)
        row_files.journal(out).unlink(missing_ok=True)
    return result
