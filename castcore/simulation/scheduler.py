"""The continuous-batching scheduler, following vLLM's V1 scheduler: each iteration it picks the batch
(``schedule``), then books what the batch made (``update``).

1. Running requests, in admission order, each take the tokens they still need (a decode: 1, or 1 + k draft tokens
   under speculation; a request part-way through a chunked prefill: the rest of its prompt) within the per-iteration
   token budget, and the KV blocks those tokens need. When no block is free the most recently admitted running
   request is preempted (recompute: its blocks are freed, it returns to the front of the waiting queue and later
   prefills its prompt plus the tokens it had generated); if that is the request asking, it waits instead.
2. If nobody was preempted and the policy decides this iteration, waiting requests are admitted in arrival order
   while fewer than ``max_running_requests`` run, budget is left and the blocks the KV policy asks are free. With
   chunked prefill a prompt may be split over iterations; without it the whole prompt must fit the remaining budget.
   A request whose prefix is cached is admitted with its whole blocks computed.
3. After the batch ran, a request whose computed tokens reach its prompt plus its generated tokens produces output
   tokens, timestamped at the end of the iteration (so a prefill's last chunk gives the first token), and finishes
   after its last output token, freeing its blocks.

Without mixed chunks (SGLang's default) an iteration first tries steps 1 and 2 with the prompts alone (the running
requests part-way through theirs, then the waiting ones); only when that finds no prompt work do the decodes run,
on their own.
"""

from __future__ import annotations

import dataclasses
from collections import deque

from castcore.simulation.blocks import BlockPool
from castcore.simulation.chunks import Chunk
from castcore.simulation.policies import Policies
from castcore.simulation.presets import EngineLimits
from castcore.simulation.request_state import NeverFit, RequestState, Status


@dataclasses.dataclass
class Batch:
    """One iteration's work: ``chunks[j]`` is what ``requests[j]`` computes; ``preempted``: scheduling it preempted
    a request (so nothing was admitted)."""

    requests: list[RequestState] = dataclasses.field(default_factory=list)
    chunks: list[Chunk] = dataclasses.field(default_factory=list)
    preempted: bool = False


@dataclasses.dataclass
class Progress:
    """What an iteration made: prompt tokens computed, decodes run, and the requests it finished."""

    prefill_tokens: int
    decodes: int
    finished: list[RequestState]


class Scheduler:
    def __init__(self, limits: EngineLimits, pool: BlockPool, policies: Policies):
        self.limits, self.pool, self.policies = limits, pool, policies
        self.waiting: deque[RequestState] = deque()
        self.running: list[RequestState] = []
        self.preemptions = 0

    @property
    def in_system(self) -> int:
        return len(self.waiting) + len(self.running)

    def add(self, state: RequestState) -> None:
        state.status = Status.WAITING
        self.waiting.append(state)

    def schedule(self) -> Batch:
        mixed = self.limits.mixed_chunk
        batch = Batch()
        budget = self._schedule_running(batch, None if mixed else False)
        deciding = self.policies.decisions.deciding(bool(self.running))
        if not batch.preempted and deciding:
            self._admit_waiting(batch, budget)
        if mixed or batch.chunks or batch.preempted:
            return batch
        decodes = Batch()  # no prompt work: the decodes' own iteration
        self._schedule_running(decodes, True)
        return decodes

    def _schedule_running(self, batch: Batch, decoding: bool | None = None) -> int:
        """Step 1 for the running requests that are ``decoding`` (None: all); the budget left."""
        budget, running, pool = self.limits.max_batched_tokens, self.running, self.pool
        draft = self.policies.decoding.draft
        requests, chunks = batch.requests, batch.chunks
        k = 0
        while k < len(running) and budget > 0:
            state = running[k]
            if decoding is not None and state.decoding != decoding:
                k += 1
                continue
            tokens = state.prompt + state.generated
            left = tokens - state.computed
            new = min(left + draft if state.decoding else left, budget)  # a verification pass: k drafts too
            # <= 0 under Reserve
            need = pool.need(state.computed + new) - state.shared - state.held
            victim = None
            while need > pool.free and victim is not state:
                victim = running.pop()
                self._preempt(victim)
                batch.preempted = True
            if victim is state:
                break
            if need > 0:
                pool.allocate(state, need)
            budget -= new
            requests.append(state)
            chunks.append(Chunk(new, state.computed, state.computed + new >= tokens))
            k += 1
        return budget

    def _preempt(self, state: RequestState) -> None:
        self.pool.release(state)
        state.preempt()
        self.waiting.appendleft(state)
        self.preemptions += 1

    def _admit_waiting(self, batch: Batch, budget: int) -> None:
        """Step 2."""
        waiting, running, pool, limits = self.waiting, self.running, self.pool, self.limits
        kv, prefix_cache = self.policies.kv, self.policies.prefix_cache
        while waiting and len(running) < limits.max_running_requests and budget > 0:
            state = waiting[0]
            if state.request.prefilled and state.generated == 0:
                state.arrive_prefilled()
            cached_blocks, cached = prefix_cache.lookup(state) if state.computed == 0 else (0, 0)
            new = state.prompt + state.generated - state.computed - cached
            if new > budget and not limits.chunked_prefill:
                break
            new = min(new, budget)
            need = pool.need(kv.admission_tokens(state, cached, new)) - cached_blocks - state.held
            if need > pool.free:
                break
            waiting.popleft()
            if cached_blocks:
                prefix_cache.use(state, cached_blocks, cached)
            state.status = Status.RUNNING
            running.append(state)
            pool.allocate(state, need)
            budget -= new
            batch.requests.append(state)
            batch.chunks.append(
                Chunk(new, state.computed, state.computed + new == state.prompt + state.generated)
            )

    def give_up_head(self) -> NeverFit:
        """An iteration scheduled nothing and preempted nobody: the head of the queue can never run."""
        state = self.waiting.popleft()
        state.status = Status.NEVER_FIT
        return NeverFit(
            state.request.index,
            (
                f"after {state.preemptions} preemptions its {state.prompt + state.generated} tokens to recompute cannot "
                f"be scheduled under the {self.limits.max_batched_tokens}-token budget without chunked prefill"
            ),
        )

    def update(self, batch: Batch, clock: float) -> Progress:
        """Step 3, the batch having run until ``clock``."""
        decoding, prefix_cache = self.policies.decoding, self.policies.prefix_cache
        prefill = decodes = 0
        leaving: list[RequestState] = []
        for state, chunk in zip(batch.requests, batch.chunks):
            made = 0
            if state.decoding:
                decodes += 1
                made = decoding.accept(state, chunk.new)
                state.computed = state.prompt + state.generated + made - 1  # the accepted tokens' KV is kept
            else:
                prefill += chunk.new
                state.computed += chunk.new
                if state.computed == state.prompt + state.generated:
                    state.decoding, made = True, 1
                    prefix_cache.keep(state)
            if made:
                state.generated += made
                state.token_times.extend([clock] * made)
                if state.generated == state.output:
                    leaving.append(state)
        for state in leaving:
            self.running.remove(state)
            self.pool.release(state)
            state.status = Status.FINISHED
        return Progress(prefill, decodes, leaving)
