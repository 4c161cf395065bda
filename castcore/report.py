"""The report castcore returns and prints: one record per operator call, summaries by operator, totals."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from .devices import DeviceProfile
from .estimate import Estimate
from .invoke import OpInvoke
from .properties import PerformanceProperties


@dataclass(slots=True)
class OpRecord:
    """One operator call with its estimate and, when a plugin gave them, its properties."""

    invoke: OpInvoke
    estimate: Estimate
    properties: PerformanceProperties | None

    @property
    def flops(self) -> float:
        return self.properties.flops if self.properties else 0.0

    @property
    def bytes(self) -> float:
        props = self.properties or self.invoke.memory_access_properties()
        return props.memory_bytes


@dataclass(slots=True)
class OpSummary:
    op: str
    calls: int
    time_s: float
    share: float
    bound: str
    source: str
    flops: float
    bytes: float
    fallback: bool

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}


class Report:
    def __init__(self, records: list[OpRecord], device: DeviceProfile, description: str = ""):
        self.records = records
        self.device = device
        self.description = description

    @property
    def time_s(self) -> float:
        return sum(r.estimate.time_s for r in self.records)

    @property
    def flops(self) -> float:
        return sum(r.flops for r in self.records)

    @property
    def bytes(self) -> float:
        return sum(r.bytes for r in self.records)

    @property
    def fallback_calls(self) -> int:
        return sum(r.estimate.fallback for r in self.records)

    def by_op(self) -> list[OpSummary]:
        """One summary per operator, slowest first."""
        groups: dict[str, list[OpRecord]] = defaultdict(list)
        for record in self.records:
            groups[record.invoke.name].append(record)
        total = self.time_s or 1.0
        summaries = []
        for name, records in groups.items():
            time_s = sum(r.estimate.time_s for r in records)
            bound_time: dict[str, float] = defaultdict(float)
            for r in records:
                bound_time[r.estimate.bound] += r.estimate.time_s
            sources = sorted({str(r.estimate.source) for r in records})
            summaries.append(OpSummary(
                op=name, calls=len(records), time_s=time_s, share=time_s / total,
                bound=max(bound_time, key=bound_time.__getitem__), source=", ".join(sources),
                flops=sum(r.flops for r in records), bytes=sum(r.bytes for r in records),
                fallback=any(r.estimate.fallback for r in records),
            ))
        summaries.sort(key=lambda s: (-s.time_s, s.op))
        return summaries

    def totals(self) -> dict[str, Any]:
        return {"time_s": self.time_s, "flops": self.flops, "bytes": self.bytes, "calls": len(self.records),
                "fallback_calls": self.fallback_calls}

    def to_dict(self) -> dict[str, Any]:
        return {"description": self.description, "device": self.device.name,
                "ops": [s.to_dict() for s in self.by_op()], "totals": self.totals()}

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def format_table(self, top: int | None = None) -> str:
        rows = self.by_op()
        shown = rows if top is None else rows[:top]
        header = ("op", "calls", "time", "share", "bound", "answered by")
        body = [(s.op, str(s.calls), format_seconds(s.time_s), f"{s.share:6.1%}", s.bound, s.source) for s in shown]
        widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]
        lines = [f"{self.description} on {self.device.name}" if self.description else f"on {self.device.name}", ""]
        for row in [header, *body]:
            lines.append("  ".join(cell.ljust(w) if i in (0, 4, 5) else cell.rjust(w)
                                   for i, (cell, w) in enumerate(zip(row, widths))).rstrip())
        if len(shown) < len(rows):
            rest = rows[len(shown):]
            lines.append(f"... {len(rest)} more ops, {format_seconds(sum(s.time_s for s in rest))} in all")
        lines += ["", f"total time   {format_seconds(self.time_s)}",
                  f"total FLOPs  {format_count(self.flops)}",
                  f"bytes moved  {format_count(self.bytes, 'B')}",
                  f"op calls     {len(self.records)} ({self.fallback_calls} by memory-only fallback)"]
        return "\n".join(lines)


def format_seconds(seconds: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3f} {unit}"
    return f"{seconds / 1e-6:.3f} us"


def format_count(value: float, unit: str = "") -> str:
    for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= scale:
            return f"{value / scale:.3f} {prefix}{unit}"
    return f"{value:.0f} {unit}".rstrip()
