"""The engine's policies, each a small strategy object the scheduler asks at one point of an iteration, chosen from
the engine preset and the run's options by ``Policies.of``:

- KV policy: how many blocks an admission takes: those of its first chunk (``OnDemand``: more as tokens come,
  preempting when they run out), or those of its whole prompt and output, held to its end (``Reserve``: TensorRT-LLM's
  GUARANTEED_NO_EVICT, so nobody is preempted).
- Scheduling decisions: every iteration (``EveryIteration``), or once every n iterations (``MultiStep``: vLLM 0.6's
  multi-step scheduling, RFC vllm-project/vllm#6854, PR #7000), admissions waiting for the next decision.
- Decoding: one token per decode (``PlainDecode``), or a verification pass of k draft tokens keeping the accepted
  ones (``Speculation``).
- Prefix cache: a prompt's shared prefix, once computed, stays cached in whole blocks for later requests.
- Entry: at each request's time (``AtArrivalTime``), or a closed loop of fixed concurrency (``ClosedLoop``).
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from collections.abc import Sequence
from typing import Protocol

from castcore.simulation.presets import EngineLimits
from castcore.simulation.request_state import RequestState


class KvPolicy(Protocol):
    def admission_tokens(self, state: RequestState, cached: int, new: int) -> int:
        """The tokens whose blocks an admission takes, ``cached`` of them found in the prefix cache and ``new``
        computed in its first chunk."""
        ...


class OnDemand:
    def admission_tokens(self, state: RequestState, cached: int, new: int) -> int:
        return state.computed + cached + new


class Reserve:
    def admission_tokens(self, state: RequestState, cached: int, new: int) -> int:
        return state.prompt + state.output - 1  # its KV peaks there: the last token is never read back


class Decisions(Protocol):
    def deciding(self, running: bool) -> bool:
        """Called once an iteration, after the running requests are scheduled: whether this iteration admits."""
        ...


class EveryIteration:
    def deciding(self, running: bool) -> bool:
        return True


class MultiStep:
    """A decision every ``steps`` iterations, or at once when nothing is left running."""

    def __init__(self, steps: int):
        self.steps, self.left = steps, 0  # iterations left before the next decision

    def deciding(self, running: bool) -> bool:
        self.left = self.left - 1 if running and self.left > 0 else self.steps - 1
        return self.left == self.steps - 1


class Decoding(Protocol):
    draft: int  # draft tokens a decode verifies besides its own

    def accept(self, state: RequestState, new: int) -> int:
        """The output tokens a decode of ``new`` tokens keeps, at most those ``state`` has left to make."""
        ...


class PlainDecode:
    draft = 0

    def accept(self, state: RequestState, new: int) -> int:
        return min(1, state.output - state.generated)


class Speculation:
    """``draft`` tokens verified per decode, ``per_step`` kept on average (1 plus the expected accepted drafts),
    counted out whole as they accrue."""

    def __init__(self, draft: int, per_step: float):
        self.draft, self.per_step = draft, per_step

    def accept(self, state: RequestState, new: int) -> int:
        state.credit += self.per_step if new > 1 else 1.0  # a full verification pass, or a plain decode
        made = min(max(1, int(state.credit)), state.output - state.generated)
        state.credit -= made
        return made


class PrefixCache:
    """Prefix id -> its whole blocks, cached for the rest of the run (vLLM caches full blocks, and recomputes the last
    prompt token when all of it is cached); ``hits`` admissions found their prefix, skipping ``cached_tokens``."""

    def __init__(self, block_size: int):
        self.block_size = block_size
        self.blocks: dict[int, int] = {}
        self.hits = self.cached_tokens = 0

    def lookup(self, state: RequestState) -> tuple[int, int]:
        """(blocks, tokens) of ``state``'s prefix found cached: its whole blocks, never the whole prompt (the last
        prompt token is computed again for its logits)."""
        prefix = state.request.prefix_id
        if prefix is None or prefix not in self.blocks:
            return 0, 0
        blocks = min(self.blocks[prefix], (state.prompt - 1) // self.block_size)
        return blocks, blocks * self.block_size

    def use(self, state: RequestState, blocks: int, tokens: int) -> None:
        """An admission starts with the cached prefix computed, held once for all."""
        state.shared, state.computed = blocks, tokens
        self.hits += 1
        self.cached_tokens += tokens

    def keep(self, state: RequestState) -> None:
        """Once a request has computed its prompt, its prefix's whole blocks stay cached for the rest of the run:
        they leave the request's own blocks and are held once, for every later request with that prefix."""
        prefix = state.request.prefix_id
        if prefix is None or prefix in self.blocks or state.shared:
            return
        blocks = min(state.request.prefix_tokens, state.computed) // self.block_size
        if blocks:
            self.blocks[prefix] = blocks
            state.shared = blocks
            state.held -= blocks


class Entry(Protocol):
    """How requests enter the system (castcore.simulation.arrivals draws their times). A request is admitted
    ``delay`` seconds after it arrives (the engine's path before scheduling it: tokenizing, admitting); its
    ``entered`` time, which its latencies count from, is its arrival."""

    pending: deque[RequestState]

    def next_due(self, clock: float, in_system: int) -> RequestState | None:
        """The next request to enter the system now, its ``entered`` time set; None while none is due."""
        ...

    def next_time(self) -> float:
        """When the next request enters if nobody leaves the system (inf: not before one does); asked once
        ``next_due`` has let in everyone due."""
        ...


class AtArrivalTime:
    """Each request enters at its arrival time (0 when it has none: offline)."""

    def __init__(self, states: Sequence[RequestState], delay: float = 0.0):
        self.pending = deque(sorted(states, key=lambda state: state.arrival))
        self.delay = delay

    def next_due(self, clock: float, in_system: int) -> RequestState | None:
        if not self.pending or self.pending[0].arrival + self.delay > clock:
            return None
        state = self.pending.popleft()
        state.entered = state.arrival
        return state

    def next_time(self) -> float:
        return self.pending[0].arrival + self.delay if self.pending else math.inf


class ClosedLoop:
    """The first ``concurrency`` requests are sent at 0 and each later one when a request leaves the system, its
    arrival time being that moment; each is admitted ``delay`` after it is sent."""

    def __init__(self, states: Sequence[RequestState], concurrency: int, delay: float = 0.0):
        self.pending, self.concurrency, self.delay = deque(states), concurrency, delay
        self.sent: deque[float] = deque()  # when the first len(sent) pending requests were sent
        for state in states:
            state.arrival = 0.0

    def next_due(self, clock: float, in_system: int) -> RequestState | None:
        while in_system + len(self.sent) < self.concurrency and len(self.sent) < len(self.pending):
            self.sent.append(clock)
        if not self.sent or self.sent[0] + self.delay > clock:
            return None
        state = self.pending.popleft()
        state.arrival = state.entered = self.sent.popleft()
        return state

    def next_time(self) -> float:
        return self.sent[0] + self.delay if self.sent else math.inf  # the next is sent when one leaves


@dataclasses.dataclass(frozen=True)
class Policies:
    kv: KvPolicy
    decisions: Decisions
    decoding: Decoding
    prefix_cache: PrefixCache
    entry: Entry

    @classmethod
    def of(
        cls,
        limits: EngineLimits,
        states: Sequence[RequestState],
        concurrency: int | None,
        speculation: tuple[int, float] | None,
        delay: float = 0.0,
    ) -> Policies:
        """One run's policies: the preset's KV policy and scheduler steps, and the run's speculation and arrivals
        (each request admitted ``delay`` seconds after it arrives)."""
        return cls(
            kv=Reserve() if limits.kv_policy == "reserve" else OnDemand(),
            decisions=MultiStep(limits.scheduler_steps) if limits.scheduler_steps > 1 else EveryIteration(),
            decoding=Speculation(*speculation) if speculation else PlainDecode(),
            prefix_cache=PrefixCache(limits.block_size),
            entry=AtArrivalTime(states, delay)
            if concurrency is None
            else ClosedLoop(states, concurrency, delay),
        )
