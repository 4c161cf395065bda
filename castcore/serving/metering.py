"""The busy seconds of a simulated run, for its energy (castcore.report.energy): the engine's step-time model,
also adding up how long each iteration keeps the device busy; and each pool's working seconds (its iterations'
time) with their prefill share, for its cost.

An iteration's busy time is its time x the busy share of the step-time model's ladder capture at its token count
(castcore.serving.step_time: the mixed batches captured at powers of four up to the token budget), interpolated
linearly between the two captures around it; a capture's busy share is its ops' busy seconds (each op's time less
its launch overhead and communication) over its time. A decode iteration at long KV lengths spends more of its
time in attention than the ladder's captures (whose chunks have no cache) do, and its attention is busy too, so
the share is carried over to it in proportion.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import TYPE_CHECKING

from castcore.report.energy import PoolUse, prefill_share
from castcore.simulation.chunks import Chunk

if TYPE_CHECKING:
    from castcore.serving.step_time import StepTimes
    from castcore.simulation.engine import Trace
    from castcore.workload.spec import Workload


class Metered:
    """``steps`` (a StepTimes) as the engine calls it, adding each iteration's busy seconds to ``busy_s``."""

    def __init__(self, steps: StepTimes):
        self.steps = steps
        self.busy_s = 0.0
        self._shares: dict[int, float] = {}  # ladder point -> its capture's busy share

    def __call__(self, batch: Sequence[Chunk]) -> float:
        seconds = self.steps(batch)
        tokens = sum(c.new for c in batch)
        self.busy_s += seconds * self.share(tokens)
        return seconds

    def decode_times(self, cached: Sequence[int], steps: int, idle: int = 0) -> list[float] | None:
        """``steps``' decode runs (castcore.simulation.decode_run), metered as the iterations one by one are."""
        times = self.steps.decode_times(cached, steps, idle)
        if times is not None:
            share = self.share(len(cached) + idle)
            for seconds in times:
                self.busy_s += seconds * share
        return times

    def _share_at(self, point: int) -> float:
        if point not in self._shares:
            # the ladder's capture, made already for this iteration's time
            self._shares[point] = self.steps.point(point).busy_share
        return self._shares[point]

    def share(self, tokens: int) -> float:
        """The busy share at ``tokens``: between the two ladder captures around it, within 0..1."""
        points = self.steps.points
        if len(points) == 1 or tokens <= points[0]:
            return self._share_at(points[0])
        i = min(bisect.bisect_left(points, tokens), len(points) - 1)
        low, high = points[i - 1], points[i]
        w = min(max((tokens - low) / (high - low), 0.0), 1.0)
        return min(max((1 - w) * self._share_at(low) + w * self._share_at(high), 0.0), 1.0)


def pool_use(
    device: str, workload: Workload, instances: int, metered: list[Metered], traces: Sequence[Trace]
) -> PoolUse:
    """A pool of ``instances`` of ``workload`` on ``device``, busy as its schedulers' meters say and working for
    its schedulers' iterations (``traces``, engine.Trace): each iteration runs on its scheduler's devices (an
    instance's, or one attention data-parallel group's), 1/pp of its layers each (the pp micro-batches in flight
    share the devices)."""
    busy = sum(m.busy_s for m in metered)
    working = sum(sum(t.duration) for t in traces)
    share = prefill_share(
        [p for t in traces for p in t.prefill_tokens],
        [d for t in traces for d in t.decode_tokens],
        [s for t in traces for s in t.duration],
    )
    per_iteration = workload.devices // workload.attention_dp
    return PoolUse(
        device,
        workload.devices * instances,
        per_iteration * busy / workload.pp,
        per_iteration * working / workload.pp,
        share or 0.0,
    )
