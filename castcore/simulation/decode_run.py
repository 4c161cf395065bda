"""Runs of decode-only iterations taken at once: the same iterations the scheduler would run one by one, booked
without visiting each request every iteration.

Between two events (a request arriving, one finishing) a batch of decoding requests changes in one way only: every
request's KV grows by a token an iteration. Nobody is admitted (the queue is empty), nobody preempted (the blocks
the run takes are free), nobody leaves: the iterations differ only in their KV lengths, so their times come from
those lengths alone (``decode_times`` of the step-time model, or the batches built when it has none) and each
request's tokens are booked in one go. Most of a long simulation's iterations are such runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from castcore.simulation.chunks import Chunk, StepTime
from castcore.simulation.policies import PlainDecode
from castcore.simulation.scheduler import Progress, Scheduler


class Trace(Protocol):  # castcore.simulation.engine.Trace, which imports this module
    def record(
        self, start: float, duration: float, progress: Progress, running: int, kv_used: float
    ) -> None: ...


SHORTEST = 4  # a run of fewer iterations is left to the scheduler: booking it at once would save nothing


def run_length(scheduler: Scheduler) -> int:
    """The iterations the running batch can decode before anything but its KV lengths changes; 0 when it cannot
    now (requests waiting, a prompt being computed, speculation, more requests than the token budget)."""
    running, limits = scheduler.running, scheduler.limits
    if scheduler.waiting or not running or len(running) > limits.max_batched_tokens:
        return 0
    if not isinstance(scheduler.policies.decoding, PlainDecode):
        return 0
    if not all(state.decoding for state in running):
        return 0
    # The last iteration of the run is the one before the first request finishes: that one the scheduler runs.
    return min(state.output - state.generated for state in running) - 1


def _first_block_at(state, block_size: int, per_request: int) -> int:
    """The run's iteration (from 1) at which ``state`` first needs a block more than it holds (for its tokens:
    ``per_request`` of its blocks hold its state)."""
    return (state.held - per_request + state.shared) * block_size - state.computed + 1


def _blocks_taken(firsts: list[int], steps: int, block_size: int) -> int:
    return sum((steps - first) // block_size + 1 for first in firsts if first <= steps)


def decode_run(
    scheduler: Scheduler,
    step_time: StepTime,
    clock: float,
    next_entry: float,
    trace: Trace,
) -> float | None:
    """Runs the longest decode-only run the batch allows from ``clock`` and returns the clock after it, or None
    (nothing run) when the batch cannot run one now. ``next_entry``: the clock at which the next request enters;
    no iteration of the run starts at or after it."""
    steps = run_length(scheduler)
    if steps < SHORTEST:
        return None
    running, pool = scheduler.running, scheduler.pool
    block_size = pool.block_size
    firsts = [_first_block_at(state, block_size, pool.per_request) for state in running]
    while steps >= SHORTEST and _blocks_taken(firsts, steps, block_size) > pool.free:
        steps //= 2  # the blocks for fewer iterations may be free; the scheduler preempts when they are not
    if steps < SHORTEST:
        return None
    cached = [state.computed for state in running]
    durations = _durations(step_time, cached, steps)
    # Blocks taken at each iteration of the run, to book the pool's use after each as the trace keeps it.
    taken = [0] * (steps + 1)
    for first in firsts:
        for j in range(max(first, 1), steps + 1, block_size):
            taken[j] += 1
    decisions, n = scheduler.policies.decisions, len(running)
    made, used, clocks = Progress(0, n, []), pool.total - pool.free, []
    for j, duration in enumerate(durations, start=1):
        if j > 1 and clock >= next_entry:
            break
        decisions.deciding(True)
        start, clock = clock, clock + duration
        used += taken[j]
        clocks.append(clock)
        trace.record(start, duration, made, n, used / pool.total)
    done = len(clocks)
    for state, first in zip(running, firsts):
        state.computed += done
        state.generated += done
        state.token_times.extend(clocks)
        if first <= done:
            blocks = (done - max(first, 1)) // block_size + 1
            pool.allocate(state, blocks)
    return clock


def _durations(step_time: StepTime, cached: Sequence[int], steps: int) -> list[float]:
    """Each iteration's seconds: the step-time model's own run where it has one, else each batch built."""
    own = getattr(step_time, "decode_times", None)
    times = own(cached, steps) if own is not None else None
    if times is not None:
        return times
    return [step_time([Chunk(1, c + j) for c in cached]) for j in range(steps)]
