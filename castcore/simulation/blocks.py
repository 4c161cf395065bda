"""The engine's KV cache as a pool of fixed-size blocks: requests take blocks as their tokens need them and give them
all back when they finish or are preempted. A hybrid model's request also holds its linear-attention or
state-space state from the pool, ``per_request`` blocks whatever its length (as vLLM's hybrid allocator shares one
pool between the two)."""

from __future__ import annotations

from castcore.simulation.request_state import RequestState, blocks_for


class BlockPool:
    """``total`` KV blocks of ``block_size`` tokens, ``free`` of them not held by any request or the prefix cache;
    ``per_request`` more blocks each request holds for its state."""

    __slots__ = ("block_size", "free", "per_request", "total")

    def __init__(self, total: int, block_size: int, per_request: int = 0):
        self.total, self.free, self.block_size, self.per_request = total, total, block_size, per_request

    def need(self, tokens: int) -> int:
        """The blocks a request of ``tokens`` KV tokens holds in all."""
        return blocks_for(tokens, self.block_size) + self.per_request

    def allocate(self, state: RequestState, blocks: int) -> None:
        """Give ``state`` ``blocks`` more; the scheduler has checked they are free."""
        self.free -= blocks
        state.held += blocks

    def release(self, state: RequestState) -> None:
        """Take back every block ``state`` holds alone (its cached prefix blocks stay cached)."""
        self.free += state.held
        state.held = 0

    def used_share(self) -> float:
        return (self.total - self.free) / self.total
