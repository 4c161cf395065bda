"""What calling code knows of how a collective will run, recorded with it for the estimators.

``with collective_algorithms("low_latency"):`` around collectives records ``attrs["algorithms"]`` on each of them:
the algorithms the communication library the deployment uses runs (castcore.workload.experts: DeepEP's
low-latency dispatch and combine). An estimator that models algorithms prices only those; one that does not
ignores the hint.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

ALGORITHMS: ContextVar[tuple[str, ...]] = ContextVar("castcore_collective_algorithms", default=())


@contextmanager
def collective_algorithms(*names: str) -> Iterator[None]:
    token = ALGORITHMS.set(names)
    try:
        yield
    finally:
        ALGORITHMS.reset(token)


def recorded() -> dict:
    """The attrs a collective captured now carries: ``{"algorithms": (...)}`` under a hint, else nothing."""
    names = ALGORITHMS.get()
    return {"algorithms": names} if names else {}
