"""A request as the engine sees it while serving it: where it is (its status), how many of its tokens have their KV
computed, the output tokens it has produced and when, and the KV blocks it holds."""

from __future__ import annotations

import dataclasses
import enum

from castcore.simulation.metrics import Finished
from castcore.simulation.presets import EngineLimits
from castcore.simulation.requests import Request


class Status(enum.Enum):
    PENDING = "not arrived yet"
    WAITING = "waiting to be admitted (or readmitted after a preemption)"
    RUNNING = "admitted: scheduled every iteration while the budget lasts"
    FINISHED = "its last output token produced"
    NEVER_FIT = "not served: see NeverFit.why"


@dataclasses.dataclass(frozen=True)
class NeverFit:
    """A request not simulated: ``why`` is one line."""

    index: int
    why: str


def blocks_for(tokens: int, block_size: int) -> int:
    """KV blocks that hold ``tokens``."""
    return -(-tokens // block_size)


@dataclasses.dataclass(slots=True, eq=False)
class RequestState:
    """``computed``: tokens whose KV is computed; ``held``: KV blocks it holds alone; ``shared``: cached prefix blocks
    it uses, held once for all requests with that prefix (not in ``held``); ``decoding``: its prompt (and any
    tokens generated before a preemption) is computed since its last admission, so each iteration it runs is a
    decode; ``credit``: speculative tokens accrued, not yet whole; ``entered``: when it entered the system."""

    request: Request
    prompt: int
    output: int
    arrival: float
    status: Status = Status.PENDING
    computed: int = 0
    generated: int = 0
    held: int = 0
    shared: int = 0
    preemptions: int = 0
    decoding: bool = False
    credit: float = 0.0
    entered: float = 0.0
    token_times: list[float] = dataclasses.field(default_factory=list)

    @classmethod
    def of(cls, request: Request) -> RequestState:
        return cls(request, request.input_tokens, request.output_tokens, request.arrival_s or 0.0)

    def why_never(self, limits: EngineLimits, kv_blocks: int, per_request: int = 0) -> str | None:
        """Why it can never be served on this engine, or None; ``per_request``: the blocks its state takes."""
        prompt, output = self.prompt, self.output
        if prompt < 1 or output < 1:
            return f"it has {prompt} input and {output} output tokens; both must be at least 1"
        need = blocks_for(prompt + output - 1, limits.block_size) + per_request
        if need > kv_blocks:
            return f"it needs {need} KV blocks of {limits.block_size} tokens and the cache has {kv_blocks}"
        if not limits.chunked_prefill and prompt > limits.max_batched_tokens and not self.request.prefilled:
            return (
                f"its {prompt}-token prompt exceeds the {limits.max_batched_tokens}-token budget without chunked "
                "prefill"
            )
        return None

    def arrive_prefilled(self) -> None:
        """A disaggregated decode instance's request comes with its prompt's KV and first token."""
        self.computed, self.generated, self.decoding = self.prompt, 1, True

    def preempt(self) -> None:
        """Recompute preemption: its blocks are gone (the caller frees them), and it prefills again on readmission."""
        self.held = self.computed = self.shared = 0
        self.decoding = False
        self.preemptions += 1
        self.status = Status.WAITING

    def finished(self) -> Finished:
        times = self.token_times
        return Finished(
            self.request.index,
            self.prompt,
            self.output,
            self.entered,
            times[0],
            times[-1],
            times,
            self.preemptions,
        )
