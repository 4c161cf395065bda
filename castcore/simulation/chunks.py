"""What an engine iteration computes for each sequence in its batch, the unit both the scheduler's batches and the
step-time captures are made of."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple


class Chunk(NamedTuple):
    """One sequence's share of an iteration: ``new`` tokens computed now over ``cached`` tokens already in its KV
    cache; ``samples``: the iteration ends with a token sampled for it (a decode, or the last chunk of a prompt).

    A named tuple rather than a dataclass: the scheduler makes one per request per iteration, and a tuple is the
    cheapest object that carries names."""

    new: int
    cached: int
    samples: bool = True


StepTime = Callable[[Sequence[Chunk]], float]
"""An iteration's seconds from its batch's chunks."""
