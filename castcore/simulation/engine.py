"""A continuous-batching serving engine, iteration by iteration: who runs, who waits, who is preempted, and when
each output token comes out.

The parts, each in its own module: ``request_state`` (a request's status and progress), ``blocks`` (the KV block
pool), ``scheduler`` (each iteration's batch of chunks, and what it made), ``policies`` (KV reserve, multi-step
decisions, prefix cache, speculation, entry of requests, chosen from the preset). This module runs them: requests enter as
they arrive, the scheduler picks a batch, the batch runs for ``step_time(chunks)`` seconds, and the trace records it.

A request holds ``ceil(kv_tokens / block_size)`` blocks; its KV peaks at prompt + output - 1 tokens (the last
token is produced, never read back). A request that needs more blocks than the cache has, or whose prompt can
never be scheduled under the limits, is reported in ``never_fit`` with why, never simulated. An iteration that
schedules nothing and preempts nothing while requests wait means the head can never run: it goes to
``never_fit`` too, so every iteration makes progress and the loop ends.

Speculative decoding (``speculation`` (k, tokens per step)): a decoding request runs a verification pass of its
last token and k draft tokens (k + 1 new tokens in the batch, within the token budget) and keeps ``tokens per
step`` on average, all timestamped at the end of that iteration; the draft's own cost is in ``step_time``.

A ``prefilled`` request (a disaggregated decode instance's) arrives with its prompt's KV and first token: it is
admitted with them computed, holding their blocks, and its first iteration decodes; its own token times start
with its second token.

Arrivals: ``arrival_s`` None means 0 (offline); otherwise requests arrive at their time and idle time jumps to
the next arrival. With ``concurrency`` C (a closed loop) the first C requests enter at 0 and each later one
enters, its arrival time being that moment, when a request leaves the system; ``arrival_s`` is then not read.
"""

from __future__ import annotations

import bisect
import dataclasses
import gc
from array import array
from collections.abc import Sequence
from typing import Any

from castcore.errors import ModelError
from castcore.options.catalog import say
from castcore.simulation import steady
from castcore.simulation.blocks import BlockPool
from castcore.simulation.chunks import StepTime
from castcore.simulation.decode_run import decode_run
from castcore.simulation.metrics import Finished
from castcore.simulation.policies import Policies
from castcore.simulation.presets import EngineLimits
from castcore.simulation.request_state import NeverFit, RequestState, Status
from castcore.simulation.requests import Request
from castcore.simulation.scheduler import Progress, Scheduler

MAX_KV_SAMPLES = 2000


@dataclasses.dataclass(frozen=True)
class Trace:
    """One entry per iteration: its start ``time`` and ``duration`` (s), the prefill and decode tokens it ran,
    the requests in its batch, and the share of KV blocks in use after it."""

    time: array[float] = dataclasses.field(default_factory=lambda: array("d"))
    duration: array[float] = dataclasses.field(default_factory=lambda: array("d"))
    prefill_tokens: array[int] = dataclasses.field(default_factory=lambda: array("q"))
    decode_tokens: array[int] = dataclasses.field(default_factory=lambda: array("q"))
    running: array[int] = dataclasses.field(default_factory=lambda: array("q"))
    kv_used: array[float] = dataclasses.field(default_factory=lambda: array("d"))

    def record(self, start: float, duration: float, progress: Progress, running: int, kv_used: float) -> None:
        self.time.append(start)
        self.duration.append(duration)
        self.prefill_tokens.append(progress.prefill_tokens)
        self.decode_tokens.append(progress.decodes)
        self.running.append(running)
        self.kv_used.append(kv_used)


@dataclasses.dataclass(frozen=True)
class EngineResult:
    """``finished`` in the order requests finished; ``never_fit`` those not simulated; ``iterations`` run;
    ``preemptions`` in all; ``mean_running`` the mean batch size over iterations; ``kv_usage`` (time, share of
    blocks used) at most ``MAX_KV_SAMPLES`` points; ``trace`` per iteration; ``partial`` when Ctrl-C ended the run."""

    finished: list[Finished]
    never_fit: list[NeverFit]
    iterations: int
    preemptions: int
    mean_running: float
    kv_usage: list[tuple[float, float]]
    trace: Trace
    partial: bool = False  # interrupted (Ctrl-C): the figures are of the requests finished by then
    prefix_hits: int = 0  # admissions that found their prefix cached
    cached_tokens: int = 0  # prompt tokens those admissions did not compute
    # stopped once its steady window showed it saturated (stop_saturated): the window's rates, in the form
    # castcore.simulation.steady gives them, and the clock then
    saturated: dict[str, Any] | None = None


def run_engine(
    requests: Sequence[Request],
    limits: EngineLimits,
    kv_blocks: int,
    step_time: StepTime,
    concurrency: int | None = None,
    speculation: tuple[int, float] | None = None,
    request_s: float = 0.0,
    *,
    leaping: bool = True,
    stop_saturated: bool = False,
    state_blocks: int = 0,
) -> EngineResult:
    """Serve ``requests`` on an engine with ``limits`` and ``kv_blocks`` KV blocks; ``step_time`` gives an
    iteration's seconds from its batch's chunks. ``speculation``: (draft tokens k, tokens a decode step keeps).
    ``leaping``: decode-only runs booked at once (castcore.simulation.decode_run); False runs every iteration
    through the scheduler, to check that both give the same. ``request_s``: each request's path before the
    scheduler sees it (castcore.simulation.overheads). ``stop_saturated``: at a rate, the run ends as soon as the
    clock passes the steady window's last arrival if the window is saturated then (castcore.simulation.steady):
    the rest of the run would only measure how long the queue grew. ``state_blocks``: the blocks each request
    holds for a hybrid model's recurrent state (castcore.simulation.blocks)."""
    if kv_blocks < 1:
        raise ModelError(f"the KV cache has {kv_blocks} blocks; the deployment leaves no memory for it")
    if concurrency is not None and concurrency < 1:
        raise ModelError(f"{say('concurrency', concurrency)}: must be a whole number of at least 1")
    states = [RequestState.of(r) for r in requests]
    policies = Policies.of(limits, states, concurrency, speculation, request_s)
    arrivals = sorted(s.arrival for s in states)
    judged = steady.window(arrivals) if stop_saturated and concurrency is None else None
    saturated = stopped = None
    pool = BlockPool(kv_blocks, limits.block_size, state_blocks)
    scheduler = Scheduler(limits, pool, policies)
    entry, trace = policies.entry, Trace()
    finished: list[Finished] = []
    never_fit: list[NeverFit] = []
    clock, partial = 0.0, False
    # The loop's objects are freed by their reference counts, but so many allocations set off the cyclic
    # collector, which walks every live object (the captures' too): a quarter of a long run. Off for the loop;
    # cycles a capture made in it are collected after.
    collecting = gc.isenabled()
    gc.disable()
    try:  # Ctrl-C ends the run where it is: the requests finished so far are its figures
        while True:
            if judged is not None and clock >= judged[1]:  # the verdict holds: later first tokens are past it
                saturated, judged = _saturated(states, arrivals, judged), None
            if saturated is not None and finished:  # stopped once a request has finished: figures to give
                stopped = {**saturated, "stopped_s": clock}
                break
            while (state := entry.next_due(clock, scheduler.in_system)) is not None:
                why = state.why_never(limits, kv_blocks, state_blocks)
                if why is None:
                    scheduler.add(state)
                else:
                    state.status = Status.NEVER_FIT
                    never_fit.append(NeverFit(state.request.index, why))
            if not scheduler.in_system:
                if not entry.pending:
                    break
                clock = max(clock, entry.next_time())  # idle until the next request is due
                continue
            if leaping:  # a run of decode-only iterations booked at once where nothing else can happen
                after = decode_run(scheduler, step_time, clock, entry.next_time(), trace)
                if after is not None:
                    clock = after
                    continue
            batch = scheduler.schedule()
            if not batch.chunks:
                if not batch.preempted:
                    never_fit.append(scheduler.give_up_head())
                continue
            start = clock
            duration = step_time(batch.chunks)
            clock = start + duration
            progress = scheduler.update(batch, clock)
            finished.extend(state.finished() for state in progress.finished)
            trace.record(start, duration, progress, len(batch.chunks), pool.used_share())
    except KeyboardInterrupt:
        partial = True
    finally:
        if collecting:
            gc.enable()
    return _result(finished, never_fit, scheduler, trace, partial, stopped)


def _saturated(
    states: list[RequestState], arrivals: list[float], bounds: tuple[float, float]
) -> dict[str, Any] | None:
    """The steady window's requests and rates once the clock has passed its last arrival, when saturated; None
    when the run keeps up (castcore.simulation.steady)."""
    found = steady.rates(arrivals, sorted(s.token_times[0] for s in states if s.token_times), *bounds)
    if not found["saturated"]:
        return None
    inside = bisect.bisect_right(arrivals, bounds[1]) - bisect.bisect_left(arrivals, bounds[0])
    return {"requests": inside, "window_s": list(bounds), **found}


def _result(
    finished: list[Finished],
    never_fit: list[NeverFit],
    scheduler: Scheduler,
    trace: Trace,
    partial: bool,
    saturated: dict[str, Any] | None,
) -> EngineResult:
    iterations = len(trace.time)
    stride = max(1, -(-iterations // MAX_KV_SAMPLES))
    kv_usage = [(trace.time[j] + trace.duration[j], trace.kv_used[j]) for j in range(0, iterations, stride)]
    mean_running = sum(trace.running) / iterations if iterations else 0.0
    cache = scheduler.policies.prefix_cache
    return EngineResult(
        finished,
        never_fit,
        iterations,
        scheduler.preemptions,
        mean_running,
        kv_usage,
        trace,
        partial,
        cache.hits,
        cache.cached_tokens,
        saturated,
    )
