"""What calling code knows of which kernels will run a collective, recorded with it for the estimators.

``with collective_kernels(name):`` around collectives records ``attrs["kernels"]`` on each of them:

- ``"engine"``: a serving engine runs it (castcore.deploy.pipeline, every inference capture), whose own
  small-message all-reduce (vLLM's and SGLang's custom all-reduce, TensorRT-LLM's one-shot and two-shot kernels)
  takes an all-reduce where it is faster than the collective library;
- ``"low-latency"``: DeepEP's low-latency dispatch and combine (castcore.deploy.parallel.experts under
  ``--ep-kernels``).

An estimator that models kernels prices the call as those run it; one that does not ignores the hint. The
innermost ``with`` wins.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

KERNELS = ("engine", "low-latency")
_kernels: ContextVar[str | None] = ContextVar("castcore_collective_kernels", default=None)


@contextmanager
def collective_kernels(name: str | None) -> Iterator[None]:
    """Record ``name`` (one of KERNELS) on the collectives captured inside; None leaves the hint as it is."""
    if name is None:
        yield
        return
    if name not in KERNELS:
        raise ValueError(f"unknown collective kernels {name!r}; known: {', '.join(KERNELS)}")
    token = _kernels.set(name)
    try:
        yield
    finally:
        _kernels.reset(token)


def recorded() -> dict:
    """The attrs a collective captured now carries: ``{"kernels": name}`` under a hint, else nothing."""
    name = _kernels.get()
    return {"kernels": name} if name else {}
