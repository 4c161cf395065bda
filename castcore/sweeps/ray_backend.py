"""The Ray backend: each task is a Ray task of one CPU on a cluster (``--ray-address`` or ``RAY_ADDRESS``) or a
local Ray instance. ``ray`` is an optional extra (pip install 'castcore[ray]') imported here only.

Ray's own retry is off: a task whose worker died comes back to the scheduler (castcore.sweeps.run.Scheduler),
which retries its points one by one, as the local backend's, so both give the same rows.
"""

from __future__ import annotations

import os
from typing import Any

from castcore.options.catalog import any_value, say
from castcore.sweeps import work
from castcore.sweeps.spec import one_line
from castcore.workload.spec import ModelError


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ModelError(
            f"{say('backend', 'ray')} needs ray: pip install 'castcore[ray]' (or use the local backend, "
            f"{say('workers', any_value('N'))})"
        ) from None
    return ray


def _check_reachable(address: str) -> None:
    """Refuse at once a cluster address nothing answers at (ray.init would retry for minutes)."""
    import socket

    if address in ("auto", "local"):
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=10).close()
    except ValueError:
        raise ModelError(
            f"{say('ray_address', address)}: give host:port (or ray://host:port, or auto)"
        ) from None
    except OSError as exc:
        raise ModelError(
            f"cannot reach the Ray cluster at {address}: {exc.strerror or exc}; check "
            f"{say('ray_address')} (or RAY_ADDRESS), or drop it for a local Ray instance"
        ) from None


class RayBackend:
    def __init__(self, workers: int, settings: work.Settings, address: str | None = None):
        self.ray = _ray()
        self.settings = settings
        self.address = address or os.environ.get("RAY_ADDRESS") or None
        self.workers = workers
        self._started = False
        self._warming: list[Any] = []

    def __enter__(self) -> RayBackend:
        ray = self.ray
        if ray.is_initialized():  # the caller's own Ray session: use it, leave it running
            self._warm_up()
            return self
        quiet = {"include_dashboard": False, "log_to_driver": False, "logging_level": "ERROR"}
        if self.address:
            _check_reachable(self.address)
        try:
            if self.address:
                ray.init(address=self.address, **quiet)
            else:
                ray.init(num_cpus=self.workers, **quiet)
        except Exception as exc:
            where = f"the Ray cluster at {self.address}" if self.address else "a local Ray instance"
            raise ModelError(
                f"cannot reach {where}: {one_line(exc)}; check {say('ray_address')} (or RAY_ADDRESS)"
                if self.address
                else f"cannot start {where}: {one_line(exc)}"
            ) from None
        self._started = True
        self._warm_up()
        return self

    def _warm_up(self) -> None:
        """A task per CPU that loads castcore and torch, so Ray's workers do it while the points are checked."""
        ray = self.ray
        try:
            cpus = int(ray.cluster_resources().get("CPU", 1))
        except Exception:  # a cluster that does not say: the workers load castcore with their first task
            return
        warm = ray.remote(num_cpus=1, max_retries=0)(work.warm_up)
        self._warming = [warm.remote() for _ in range(min(cpus, self.workers))]

    def __exit__(self, *exc: Any) -> None:
        if self._started:
            self.ray.shutdown()

    def run(self, scheduler: Any) -> None:
        ray = self.ray
        remote = ray.remote(num_cpus=1, max_retries=0, retry_exceptions=False)(work.run_whole_task)
        in_flight: dict[Any, work.Task] = {}
        while True:
            while (task := scheduler.take()) is not None:
                in_flight[remote.remote(task, self.settings)] = task
            if not in_flight:
                return
            ready, _ = ray.wait(list(in_flight), num_returns=1)
            for ref in ready:
                task = in_flight.pop(ref)
                try:
                    rows, stats = ray.get(ref)
                except ray.exceptions.RayTaskError as exc:  # castcore itself failed outside a point
                    for index, _ in task.points:
                        scheduler.row(task.id, index, {"error": one_line(exc.cause or exc), "seconds": None})
                    scheduler.done(task.id, {})
                except ray.exceptions.RayError as exc:  # the worker died: killed, out of memory, node lost
                    scheduler.died(task, type(exc).__name__)
                else:
                    for index, row in rows:
                        scheduler.row(task.id, index, row)
                    scheduler.done(task.id, stats)
