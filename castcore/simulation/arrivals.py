"""When requests arrive: all at once, at a rate, or in a closed loop of fixed concurrency.

- ``offline`` (the default): every request arrives at t = 0, the offline maximum-throughput case.
- ``rate`` (``--rate QPS --burstiness B``): an open loop whose inter-arrival times are gamma-distributed as
  ``vllm bench serve`` draws them; B = 1 is a Poisson process, B < 1 burstier, B > 1 more even.
- ``concurrency`` (``--concurrency C``): a closed loop. There are no arrival times to draw: the simulator starts
  C requests at t = 0 and a new one each time one finishes, so ``times`` refuses this mode.

A trace's own arrival times, when it has them, are used instead of any of these (``schedule``).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace

from castcore.errors import ModelError
from castcore.options.catalog import say
from castcore.simulation.requests import Request

MODES = ("offline", "rate", "concurrency")


def _positive(value: object) -> bool:
    return (
        isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    )


def _check_rate(rate: object, burstiness: object) -> None:
    if not _positive(rate):
        raise ModelError(
            f"{say('rate', rate)}: give a request rate in requests per second, finite and above 0."
        )
    if not _positive(burstiness):
        raise ModelError(
            f"{say('burstiness', burstiness)}: give a finite number above 0 (1 is a Poisson process)."
        )


def poisson(rate: float, burstiness: float, n: int, seed: int | None) -> list[float]:
    """``n`` arrival times in seconds for ``rate`` requests per second, as ``get_request`` in vLLM's
    vllm/benchmarks/serve.py (checked at vllm-project/vllm commit 009e6d4a1cd6) draws them: each gap from a gamma
    distribution of shape ``burstiness`` and scale 1 / (rate * burstiness) (mean 1 / rate), summed, the first
    request arriving after one gap; then, as vLLM does at a fixed rate, every time scaled so that the last arrival
    is at exactly n / rate, which keeps runs with different seeds at the same offered load."""
    _check_rate(rate, burstiness)
    rng = random.Random(seed)
    scale = 1.0 / (rate * burstiness)
    times, now = [], 0.0
    for _ in range(n):
        now += rng.gammavariate(burstiness, scale)
        times.append(now)
    if not times or times[-1] == 0:
        return times
    factor = (n / rate) / times[-1]
    return [t * factor for t in times]


@dataclass(frozen=True)
class Arrivals:
    """How requests arrive: ``mode`` is one of MODES; ``rate`` (requests per second) and ``burstiness`` belong to
    "rate", ``concurrency`` (requests in flight) to "concurrency". Checked on construction: ModelError if not."""

    mode: str = "offline"
    rate: float | None = None
    burstiness: float = 1.0
    concurrency: int | None = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ModelError(f"Arrival mode {self.mode!r}: give one of {', '.join(MODES)}.")
        if self.mode == "rate":
            _check_rate(self.rate, self.burstiness)
        if self.mode == "concurrency" and (
            isinstance(self.concurrency, bool)
            or not isinstance(self.concurrency, int)
            or self.concurrency < 1
        ):
            raise ModelError(
                f"{say('concurrency', self.concurrency)}: give a whole number of requests in flight of at "
                "least 1."
            )

    @classmethod
    def offline(cls) -> Arrivals:
        return cls()

    @classmethod
    def at_rate(cls, rate: float, burstiness: float = 1.0) -> Arrivals:
        return cls("rate", rate=rate, burstiness=burstiness)

    @classmethod
    def closed_loop(cls, concurrency: int) -> Arrivals:
        return cls("concurrency", concurrency=concurrency)

    def times(self, n: int, seed: int | None) -> list[float]:
        """The arrival times of ``n`` requests in an open-loop mode; a closed loop has none (see the module)."""
        if self.mode == "offline":
            return [0.0] * n
        if self.mode == "rate":
            assert self.rate is not None  # checked on construction
            return poisson(self.rate, self.burstiness, n, seed)
        raise ValueError(
            "a closed loop (mode 'concurrency') has no arrival times: the simulator starts a request "
            "each time one finishes"
        )

    def schedule(self, requests: list[Request], seed: int | None) -> list[Request]:
        """``requests`` with their arrival times: a trace's own when every request has one, else drawn for the
        open-loop modes; in a closed loop without a trace's times they stay None (the simulator decides)."""
        if all(request.arrival_s is not None for request in requests) or self.mode == "concurrency":
            return list(requests)
        times = self.times(len(requests), seed)
        return [replace(request, arrival_s=time) for request, time in zip(requests, times)]
