"""The engine's KV cache as a pool of fixed-size blocks: requests take blocks as their tokens need them and give them
all back when they finish or are preempted."""

from __future__ import annotations

from castcore.simulation.request_state import RequestState


class BlockPool:
    """``total`` KV blocks of ``block_size`` tokens, ``free`` of them not held by any request or the prefix cache."""

    __slots__ = ("block_size", "free", "total")

    def __init__(self, total: int, block_size: int):
        self.total, self.free, self.block_size = total, total, block_size

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
