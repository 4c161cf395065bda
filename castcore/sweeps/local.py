"""The local backend: N spawned worker processes, each with its own task at a time, rows sent back as each point
finishes.

Not concurrent.futures' ProcessPoolExecutor: when one of its workers dies it breaks the whole pool, ending every
other worker's task too, and cannot say which task was on the dead one. Here each worker has its own pipe, so a
worker that dies (killed, out of memory) is seen by its own sentinel: its task's unfinished points go back to
the scheduler (see castcore.sweeps.run.Scheduler) and a fresh worker takes its place, while the others go on.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
import threading
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

from castcore.serving.kv_capacity import KEPT_STEP_TIMES
from castcore.sweeps import work


@contextlib.contextmanager
def _interrupts_held() -> Iterator[None]:
    """Ctrl-C inside the block takes effect at its end. The parent's handler is swapped (a signal may reach any
    thread, so blocking it in this one is not enough), and the signal is blocked too: a process started inside
    inherits that and is free of a terminal's Ctrl-C until it unblocks it (_serve)."""
    if threading.current_thread() is not threading.main_thread():  # only the main thread may set handlers
        yield
        return
    caught: list[tuple] = []
    previous = signal.signal(signal.SIGINT, lambda *given: caught.append(given))
    masking = hasattr(signal, "pthread_sigmask")  # POSIX
    if masking:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        if masking:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # one pending lands in caught
        signal.signal(signal.SIGINT, previous)
        if caught and callable(previous):
            previous(*caught[0])  # Python's own raises KeyboardInterrupt
        elif caught and previous == signal.SIG_DFL:
            raise KeyboardInterrupt


def _serve(conn: Connection, settings: work.Settings) -> None:
    """A worker's life: take a task, send a row per point and then the task's capture counts; None ends it."""
    try:
        if hasattr(signal, "pthread_sigmask"):  # started with the parent's interrupts held (see _start)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        work.warm_up()  # torch and castcore load while this process's first task is made
        while (task := conn.recv()) is not None:
            before = work.stats()
            for index, row in work.run_task(task, settings):
                conn.send(("row", task.id, index, row))
            conn.send(("done", task.id, work.stats_since(before)))
    except (EOFError, KeyboardInterrupt, ConnectionError):  # the sweep ended, was interrupted or was killed
        pass
    # Every row has been sent and the capture cache writes as it goes, so nothing is left to finish: skip the
    # interpreter's teardown of torch and the captures held, which took 3-4 s a worker at the end of each sweep.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


@dataclass
class _Worker:
    process: Any
    conn: Connection
    task: work.Task | None = None
    # the Task.kept of the last tasks it ran, as many as a process keeps step-time models of (kv_capacity)
    kept: deque = field(default_factory=lambda: deque(maxlen=KEPT_STEP_TIMES))


def death(exitcode: int | None) -> str:
    """How a worker process ended, in words."""
    if exitcode is None:
        return "it stopped answering"
    if exitcode < 0:
        name = (
            signal.Signals(-exitcode).name
            if -exitcode in signal.Signals._value2member_map_
            else str(-exitcode)
        )
        return f"killed by {name}" + (", as the out-of-memory killer does" if name == "SIGKILL" else "")
    return f"exit code {exitcode}"


class LocalBackend:
    def __init__(self, workers: int, settings: work.Settings):
        self.workers = max(1, workers)
        self.settings = settings
        self._context = multiprocessing.get_context("spawn")  # a fresh interpreter: no torch state forked
        self._slots: list[_Worker | None] = [None] * self.workers

    def _start(self) -> _Worker:
        parent, child = self._context.Pipe()
        process = self._context.Process(
            target=_serve, args=(child, self.settings), daemon=True, name="castcore-sweep-worker"
        )
        # Ctrl-C while start() writes the new process's set-up data would leave it half written: the child then
        # dies printing a traceback. The interrupt waits until the write is done, and the child unblocks it.
        with _interrupts_held():
            process.start()
        child.close()
        return _Worker(process=process, conn=parent)

    def __enter__(self) -> LocalBackend:
        self._slots = [self._start() for _ in range(self.workers)]
        return self

    def __exit__(self, failed: Any, *exc: Any) -> None:
        """Stop every worker (they are kept between runs, so a plan's rounds start no new processes); at once on
        an error or an interrupt."""
        for worker in self._slots:
            if worker is not None:
                self._stop(worker, at_once=failed is not None)
        self._slots = [None] * self.workers

    def run(self, scheduler: Any) -> None:
        slots = self._slots
        while True:
            for i, worker in enumerate(slots):
                if worker is not None and worker.task is not None:
                    continue
                others = set().union(*(w.kept for j, w in enumerate(slots) if w is not None and j != i))
                task = scheduler.take(worker.kept if worker is not None else (), others)
                if task is None:
                    break
                if worker is None or not worker.process.is_alive():
                    worker = slots[i] = self._start()
                try:
                    worker.conn.send(task)
                except OSError:  # it died idle, just now: a fresh one takes the task
                    worker = slots[i] = self._start()
                    worker.conn.send(task)
                worker.task = task
                if task.kept in worker.kept:
                    worker.kept.remove(task.kept)
                worker.kept.append(task.kept)  # the last used last, as the worker keeps them
            busy = [w for w in slots if w is not None and w.task is not None]
            if not busy:
                return
            wait([w.conn for w in busy] + [w.process.sentinel for w in busy])
            for i, worker in enumerate(slots):
                if worker is not None and worker.task is not None and not self._drain(worker, scheduler):
                    slots[i] = None

    def _drain(self, worker: _Worker, scheduler: Any) -> bool:
        """Take the worker's messages; False when it died (its task then goes back to the scheduler)."""
        try:
            while worker.task is not None and worker.conn.poll():
                message = worker.conn.recv()
                if message[0] == "row":
                    scheduler.row(message[1], message[2], message[3])
                else:
                    scheduler.done(message[1], message[2])
                    worker.task = None
        except (EOFError, OSError):
            pass
        if worker.task is not None and not worker.process.is_alive():
            worker.process.join()
            scheduler.died(worker.task, death(worker.process.exitcode))
            worker.conn.close()
            return False
        return True

    @staticmethod
    def _stop(worker: _Worker, at_once: bool = False) -> None:
        try:
            worker.conn.send(None)
        except (OSError, ValueError):
            pass
        worker.process.join(timeout=0 if at_once or worker.task is not None else 5)
        if worker.process.is_alive():
            worker.process.terminate()
            worker.process.join(timeout=5)
        worker.conn.close()
