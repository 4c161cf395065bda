"""The ladder a step-time model is made of (castcore.serving.step_time): the token counts captured, each capture
as plain data (every op's module, name, pipeline stage and compute, memory and other time), and the ops of one kind
interpolated between two captures."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from castcore.report.energy import busy_s

if TYPE_CHECKING:
    from castcore.report.records import OpRecord, Report


def ladder(most: int, step: int = 4) -> list[int]:
    """Token counts captured: the powers of ``step`` below ``most``, and ``most``. Each op's compute and memory
    times are each near-linear in the tokens (the kernel's shape changes only in one dimension), so points this far
    apart interpolate them closely; where an op turns from memory- to compute-bound, the max after interpolating
    finds the turn (bench/simulate_steps.py measures how close)."""
    points = [1]
    while points[-1] * step < most:
        points.append(points[-1] * step)
    return sorted({*points, most})


def is_head(module: str) -> bool:
    return module.endswith("lm_head")


@dataclass
class Point:
    """A ladder capture as the model reads it: each op's module, name, pipeline stage and (compute, memory,
    rest), the share of its time the device is busy (castcore.serving.metering), and for the full token budget
    its activations' peak (castcore.serving.kv_capacity). Plain data, so a capture
    cache keeps it on disk (castcore.sweeps.capture.CaptureCache.priced) and a warm run skips the capture."""

    ops: list[tuple[str, str, int, tuple[float, float, float]]]
    busy_share: float
    activation_peak_bytes: int | None = None  # where the capture's memory was analysed

    @classmethod
    def of(cls, report: Report, stages: list[int]) -> Point:
        ops = [(r.invoke.module, r.invoke.name, s, split(r)) for r, s in zip(report.records, stages)]
        peak = report.memory.activation_peak_bytes if report.memory is not None else None
        return cls(ops, busy_s(report) / report.time_s if report.time_s else 0.0, peak)

    def plain(self) -> dict[str, Any]:
        return {
            "ops": [[m, n, s, *parts] for m, n, s, parts in self.ops],
            "busy_share": self.busy_share,
            "activation_peak_bytes": self.activation_peak_bytes,
        }

    @classmethod
    def from_plain(cls, data: dict[str, Any]) -> Point:
        ops = [(m, n, s, (c, mem, r)) for m, n, s, c, mem, r in data["ops"]]
        return cls(ops, data["busy_share"], data["activation_peak_bytes"])


@dataclass
class Parts:
    """Ops of one kind between two ladder points: those that estimate alike, with their parts at each point."""

    points: list[int]  # the two token (or sampling-sequence) counts
    # (how many, [(compute, memory, rest) at each point])
    ops: list[tuple[int, list[tuple[float, float, float]]]]

    @classmethod
    def of(
        cls, points: list[int], per_point: list[list[tuple[str, str, tuple[float, float, float]]]]
    ) -> Parts:
        """Each op matched across the ladder by its module, name and place among such calls; an op a capture
        did not run (a reshape that is free at one token) costs nothing there."""
        found: list[dict[tuple, tuple[float, float, float]]] = []
        for ops in per_point:
            seen: Counter = Counter()
            parts = {}
            for module, name, split in ops:
                where = (module, name)
                parts[(*where, seen[where])] = split
                seen[where] += 1
            found.append(parts)
        keys = dict.fromkeys(key for parts in found for key in parts)
        counted = Counter(tuple(parts.get(key, (0.0, 0.0, 0.0)) for parts in found) for key in keys)
        return cls(points, [(count, list(parts)) for parts, count in counted.items()])

    def at(self, x: int) -> float:
        """The ops' time at ``x``, each part interpolated (or extrapolated) on the line through the two points."""
        x0, x1 = self.points
        w = (x - x0) / (x1 - x0) if x1 != x0 else 0.0
        total = 0.0
        for count, parts in self.ops:
            (c0, m0, r0), (c1, m1, r1) = parts
            total += count * (max(c0 + w * (c1 - c0), m0 + w * (m1 - m0)) + r0 + w * (r1 - r0))
        return total


def split(record: OpRecord) -> tuple[float, float, float]:
    """An estimate as (compute, memory, the rest): the roofline's max(compute, memory) plus launch and
    communication; an estimate that is not of that form is kept whole in the rest."""
    e = record.estimate
    if abs(max(e.compute_s, e.memory_s) + e.overhead_s + e.comm_s - e.time_s) <= 1e-12 + 1e-9 * e.time_s:
        return e.compute_s, e.memory_s, e.overhead_s + e.comm_s
    return 0.0, 0.0, e.time_s
