"""A continuous-batching serving engine, iteration by iteration: who runs, who waits, who is preempted, and when
each output token comes out.

The scheduler follows vLLM's V1 scheduler. Each iteration:

1. Running requests, in admission order, each take the tokens they still need (a decode: 1; a request part-way
   through a chunked prefill: the rest of its prompt) within the per-iteration token budget, and the KV blocks
   those tokens need. When no block is free the most recently admitted running request is preempted (recompute:
   its blocks are freed, it returns to the front of the waiting queue and later prefills its prompt plus the
   tokens it had generated); if that is the request asking, it waits instead.
2. If nobody was preempted, waiting requests are admitted in arrival order while fewer than
   ``max_running_requests`` run, budget is left and blocks for their first chunk are free. With chunked prefill a
   prompt may be split over iterations; without it the whole prompt must fit the remaining budget.
3. The batch runs for ``step_time(batch)`` seconds. A request whose computed tokens reach its prompt plus its
   generated tokens produces one output token, timestamped at the end of the iteration (so a prefill's last
   chunk gives the first token), and finishes after its last output token, freeing its blocks.

With ``scheduler_steps`` n > 1 (vLLM 0.6's multi-step scheduling: RFC vllm-project/vllm#6854, PR #7000) the
scheduler decides once every n iterations: the requests it scheduled run the next n - 1 iterations too (a prompt
scheduled whole then decodes), and no waiting request is admitted until the next decision, which comes early only
when nothing is left running. Tokens are timestamped at the iteration that makes them, as if streamed at once.

Under the "reserve" KV policy (TensorRT-LLM's default, GUARANTEED_NO_EVICT) a waiting request is admitted only
when the blocks of its whole prompt and output are free, and holds them to its end, so nobody is preempted.

A request holds ``ceil(kv_tokens / block_size)`` blocks; its KV peaks at prompt + output - 1 tokens (the last
token is produced, never read back). A request that needs more blocks than the cache has, or whose prompt can
never be scheduled under the limits, is reported in ``never_fit`` with why, never simulated. An iteration that
schedules nothing and preempts nothing while requests wait means the head can never run: it goes to
``never_fit`` too, so every iteration makes progress and the loop ends.

Prefix caching: a request that starts with a shared prefix (``Request.prefix_id``) whose KV is cached skips the
prefix's whole blocks (vLLM caches full blocks, and recomputes the last prompt token when all of it is cached): it
is admitted with them computed, and holds only its own blocks; the first request to compute a prefix leaves its
blocks cached, held once for every later request, for the rest of the run.

Speculative decoding (``speculation`` (k, tokens per step)): a decoding request runs a verification pass of its
last token and k draft tokens (k + 1 new tokens in the batch, within the token budget) and keeps the accepted ones:
``tokens per step`` on average (1 plus the expected accepted draft tokens), counted out whole as they accrue, all
timestamped at the end of that iteration; the draft's own cost is in ``step_time``.

A ``prefilled`` request (a disaggregated decode instance's) arrives with its prompt's KV and first token: it is
admitted with them computed, holding their blocks, and its first iteration decodes; its own token times start
with its second token.

Arrivals: ``arrival_s`` None means 0 (offline); otherwise requests arrive at their time and idle time jumps to
the next arrival. With ``concurrency`` C (a closed loop) the first C requests enter at 0 and each later one
enters, its arrival time being that moment, when a request leaves the system; ``arrival_s`` is then not read.
"""

from __future__ import annotations

import dataclasses
from array import array
from collections import deque
from collections.abc import Callable, Sequence

from castcore.errors import ModelError
from castcore.options.catalog import say
from castcore.simulation.metrics import Finished
from castcore.simulation.presets import EngineLimits
from castcore.simulation.requests import Request

MAX_KV_SAMPLES = 2000


@dataclasses.dataclass(frozen=True)
class NeverFit:
    """A request not simulated: ``why`` is one line."""

    index: int
    why: str


@dataclasses.dataclass(frozen=True)
class Trace:
    """One entry per iteration: its start ``time`` and ``duration`` (s), the prefill and decode tokens it ran,
    the requests in its batch, and the share of KV blocks in use after it."""

    time: array
    duration: array
    prefill_tokens: array
    decode_tokens: array
    running: array
    kv_used: array


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


def _blocks(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


def _why_never(request: Request, limits: EngineLimits, kv_blocks: int) -> str | None:
    prompt, output = request.input_tokens, request.output_tokens
    if prompt < 1 or output < 1:
        return f"it has {prompt} input and {output} output tokens; both must be at least 1"
    need = _blocks(prompt + output - 1, limits.block_size)
    if need > kv_blocks:
        return f"it needs {need} KV blocks of {limits.block_size} tokens and the cache has {kv_blocks}"
    if not limits.chunked_prefill and prompt > limits.max_batched_tokens and not request.prefilled:
        return f"its {prompt}-token prompt exceeds the {limits.max_batched_tokens}-token budget without chunked prefill"
    return None


def simulate(
    requests: Sequence[Request],
    limits: EngineLimits,
    kv_blocks: int,
    step_time: Callable[[list[tuple[int, int, bool]]], float],
    concurrency: int | None = None,
    speculation: tuple[int, float] | None = None,
) -> EngineResult:
    """Serve ``requests`` on an engine with ``limits`` and ``kv_blocks`` KV blocks; ``step_time`` gives an
    iteration's seconds from its batch, per request (new tokens, KV tokens before, whether it samples a token:
    a decode, or the chunk that ends a prompt). ``speculation``: (draft tokens k, tokens a decode step keeps)."""
    if kv_blocks < 1:
        raise ModelError(f"the KV cache has {kv_blocks} blocks; the deployment leaves no memory for it")
    if concurrency is not None and concurrency < 1:
        raise ModelError(f"{say('concurrency', concurrency)}: must be a whole number of at least 1")
    block_size, budget_max = limits.block_size, limits.max_batched_tokens
    max_running, chunked = limits.max_running_requests, limits.chunked_prefill
    reserve = limits.kv_policy == "reserve"
    steps_left = 0  # iterations left before the next scheduling decision (multi-step scheduling)

    n = len(requests)
    prompt = [r.input_tokens for r in requests]
    output = [r.output_tokens for r in requests]
    computed = [0] * n  # tokens whose KV is computed
    generated = [0] * n  # output tokens produced
    held = [0] * n  # KV blocks held
    preempted = [0] * n
    decoding = [False] * n  # prefilled since its last admission: each iteration it runs is one decode
    shared = [0] * n  # cached prefix blocks it uses, held once for all (not in ``held``)
    cached_prefix: dict[int, int] = {}  # prefix id -> its whole blocks, cached
    credit = [0.0] * n  # speculative tokens accrued, not yet whole
    draft, per_step = speculation or (0, 1.0)
    prefix_hits = cached_tokens = 0
    entered = [0.0] * n
    times: list[list[float]] = [[] for _ in range(n)]

    if concurrency is None:
        order = sorted(range(n), key=lambda i: (requests[i].arrival_s or 0.0, i))
        arrival = [requests[i].arrival_s or 0.0 for i in range(n)]
    else:
        order = list(range(n))
        arrival = [0.0] * n
    pending = deque(order)
    in_system = 0
    waiting: deque[int] = deque()
    running: list[int] = []
    finished: list[Finished] = []
    never_fit: list[NeverFit] = []
    free = kv_blocks
    clock = 0.0
    total_preemptions = 0
    trace = Trace(array("d"), array("d"), array("q"), array("q"), array("q"), array("d"))

    def admit_arrivals() -> None:
        nonlocal in_system
        while pending and (concurrency is None and arrival[pending[0]] <= clock or
                           concurrency is not None and in_system < concurrency):
            i = pending.popleft()
            entered[i] = arrival[i] if concurrency is None else clock
            why = _why_never(requests[i], limits, kv_blocks)
            if why is None:
                waiting.append(i)
                in_system += 1
            else:
                never_fit.append(NeverFit(requests[i].index, why))

    partial = False
    try:  # Ctrl-C ends the run where it is: the requests finished so far are its figures
        while True:
            admit_arrivals()
            if not running and not waiting:
                if not pending:
                    break
                clock = max(clock, arrival[pending[0]])
                continue
            budget = budget_max
            batch: list[tuple[int, int, bool]] = []
            scheduled: list[tuple[int, int]] = []
            stopped = False
            k = 0
            while k < len(running) and budget > 0:
                i = running[k]
                left = prompt[i] + generated[i] - computed[i]
                new = min(left + draft if decoding[i] else left, budget)  # a verification pass: k drafts too
                need = max(0, _blocks(computed[i] + new, block_size) - shared[i] - held[i])  # none under "reserve"
                victim = -1
                while need > free and victim != i:
                    victim = running.pop()
                    free += held[victim]
                    held[victim] = computed[victim] = shared[victim] = 0
                    decoding[victim] = False
                    preempted[victim] += 1
                    total_preemptions += 1
                    waiting.appendleft(victim)
                    stopped = True
                if victim == i:
                    break
                free -= need
                held[i] += need
                budget -= new
                batch.append((new, computed[i], computed[i] + new >= prompt[i] + generated[i]))
                scheduled.append((i, new))
                k += 1
            steps_left = steps_left - 1 if running and steps_left > 0 else limits.scheduler_steps - 1
            deciding = steps_left == limits.scheduler_steps - 1
            if not stopped and deciding:
                while waiting and len(running) < max_running and budget > 0:
                    i = waiting[0]
                    if requests[i].prefilled and generated[i] == 0:  # its KV and first token came with it
                        computed[i], generated[i], decoding[i] = prompt[i], 1, True
                    hit = _cached(requests[i], cached_prefix, block_size) if computed[i] == 0 else (0, 0)
                    new = prompt[i] + generated[i] - computed[i] - hit[1]
                    if new > budget and not chunked:
                        break
                    new = min(new, budget)
                    # Under "reserve" the blocks of its whole prompt and output, held to the end.
                    need = (_blocks((prompt[i] + output[i] - 1) if reserve else computed[i] + hit[1] + new, block_size)
                            - hit[0] - held[i])
                    if need > free:
                        break
                    waiting.popleft()
                    if hit[0]:
                        shared[i], computed[i] = hit
                        prefix_hits += 1
                        cached_tokens += hit[1]
                    running.append(i)
                    free -= need
                    held[i] += need
                    budget -= new
                    batch.append((new, computed[i], computed[i] + new == prompt[i] + generated[i]))
                    scheduled.append((i, new))
            if not batch:
                if stopped:
                    continue
                i = waiting.popleft()
                in_system -= 1
                never_fit.append(NeverFit(requests[i].index, (
                    f"after {preempted[i]} preemptions its {prompt[i] + generated[i]} tokens to recompute cannot be "
                    f"scheduled under the {budget_max}-token budget without chunked prefill")))
                continue

            start = clock
            duration = step_time(batch)
            clock = start + duration
            prefill = decode = 0
            leaving = []
            for i, new in scheduled:
                made = 0
                if decoding[i]:
                    decode += 1
                    credit[i] += per_step if new > 1 else 1.0  # a full verification pass, or a plain decode
                    made = min(max(1, int(credit[i])), output[i] - generated[i])
                    credit[i] -= made
                    computed[i] = prompt[i] + generated[i] + made - 1  # the accepted tokens' KV is kept
                else:
                    prefill += new
                    computed[i] += new
                    if computed[i] == prompt[i] + generated[i]:
                        decoding[i], made = True, 1
                        _cache_prefix(requests[i], computed[i], cached_prefix, block_size, shared, held, i)
                if made:
                    generated[i] += made
                    times[i].extend([clock] * made)
                    if generated[i] == output[i]:
                        leaving.append(i)
            for i in leaving:
                running.remove(i)
                free += held[i]
                held[i] = 0
                in_system -= 1
                tt = times[i]
                r = requests[i]
                finished.append(Finished(r.index, prompt[i], output[i], entered[i], tt[0], tt[-1], tt, preempted[i]))
            trace.time.append(start)
            trace.duration.append(duration)
            trace.prefill_tokens.append(prefill)
            trace.decode_tokens.append(decode)
            trace.running.append(len(batch))
            trace.kv_used.append((kv_blocks - free) / kv_blocks)

    except KeyboardInterrupt:
        partial = True

    iterations = len(trace.time)
    stride = max(1, -(-iterations // MAX_KV_SAMPLES))
    kv_usage = [(trace.time[j] + trace.duration[j], trace.kv_used[j]) for j in range(0, iterations, stride)]
    mean_running = sum(trace.running) / iterations if iterations else 0.0
    return EngineResult(finished, never_fit, iterations, total_preemptions, mean_running, kv_usage, trace, partial,
                        prefix_hits, cached_tokens)


def _cached(request: Request, cached: dict[int, int], block_size: int) -> tuple[int, int]:
    """(blocks, tokens) of ``request``'s prefix found cached: its whole blocks, never the whole prompt (the last
    prompt token is computed again for its logits)."""
    if request.prefix_id is None or request.prefix_id not in cached:
        return 0, 0
    blocks = min(cached[request.prefix_id], (request.input_tokens - 1) // block_size)
    return blocks, blocks * block_size


def _cache_prefix(request: Request, computed: int, cached: dict[int, int], block_size: int, shared: list[int],
                  held: list[int], i: int) -> None:
    """Once a request has computed its prompt, its prefix's whole blocks stay cached for the rest of the run: they
    leave the request's own blocks and are held once, for every later request with that prefix."""
    if request.prefix_id is None or request.prefix_id in cached or shared[i]:
        return
    blocks = min(request.prefix_tokens, computed) // block_size
    if blocks:
        cached[request.prefix_id] = blocks
        shared[i] = blocks
        held[i] -= blocks
