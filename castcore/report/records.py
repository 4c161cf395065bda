"""The report castcore returns and prints: one record per operator call, summaries by operator, totals."""

from __future__ import annotations

import csv
import io
import json
import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from castcore.errors import CastcoreError
from castcore.devices.costs import Estimate, PerformanceProperties
from castcore.devices.profile import DeviceProfile
from castcore.report.bands import op_band
from castcore.recording.invoke import OpInvoke, TensorMeta


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
    error_band: dict[str, Any] | None = (
        None  # castcore.report.bands: the family's held-out error on this device
    )
    # a grouped (mixture-of-experts) product: the experts a call's rows reach on this device, the mean over calls
    experts_run: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}


def _experts_run(records: list[OpRecord]) -> float | None:
    """The mean experts a grouped product's rows reach (castcore.builtin.formulas.matmul.routed_experts: under
    --ep the busiest device's rows), or None for other ops."""
    from castcore.builtin.formulas.matmul import routed_experts

    grouped = [
        r.invoke
        for r in records
        if len(r.invoke.args) > 1
        and all(isinstance(a, TensorMeta) for a in r.invoke.args[:2])
        and r.invoke.args[0].dim() == 2
        and r.invoke.args[1].dim() == 3
    ]
    if not grouped:
        return None
    reached = [routed_experts(i, i.args[1].shape[0], i.args[0].shape[0]) for i in grouped]
    return round(sum(reached) / len(reached), 2)


@dataclass(slots=True)
class ModuleSummary:
    module: str
    calls: int
    time_s: float
    share: float
    flops: float
    bytes: float

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}


_INDEX_DTYPES = ("bool", "int64", "int32", "int16", "uint8")


class ReportError(CastcoreError, ValueError):
    """A report that cannot be written as asked; the message says why."""


class Report:
    def __init__(
        self,
        records: list[OpRecord],
        device: DeviceProfile,
        description: str = "",
        memory=None,
        notes: list[str] | None = None,
        workload: dict[str, Any] | None = None,
    ):
        self.records = records
        self.device = device
        self.description = description
        self.memory = memory  # a castcore.report.memory.MemoryReport, when the capture was analysed
        self.notes = list(notes or [])  # what a user should know about how the model was built and run
        self.workload = workload  # the Workload's options, when the report came from one
        self.warnings: list[str] = []  # what did not go as a plugin meant: claims this workload never reached

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
            summaries.append(
                OpSummary(
                    op=name,
                    calls=len(records),
                    time_s=time_s,
                    share=time_s / total,
                    bound=max(bound_time, key=bound_time.__getitem__),
                    source=", ".join(sources),
                    flops=sum(r.flops for r in records),
                    bytes=sum(r.bytes for r in records),
                    fallback=any(r.estimate.fallback for r in records),
                    error_band=op_band(records, self.device),
                    experts_run=_experts_run(records),
                )
            )
        summaries.sort(key=lambda s: (-s.time_s, s.op))
        return summaries

    def by_module(self) -> list[ModuleSummary]:
        """One summary per module path (the innermost module that made each call), slowest first."""
        groups: dict[str, list[OpRecord]] = defaultdict(list)
        for record in self.records:
            groups[record.invoke.module or "(top level)"].append(record)
        total = self.time_s or 1.0
        rows = [
            ModuleSummary(
                module=name,
                calls=len(rs),
                time_s=sum(r.estimate.time_s for r in rs),
                share=sum(r.estimate.time_s for r in rs) / total,
                flops=sum(r.flops for r in rs),
                bytes=sum(r.bytes for r in rs),
            )
            for name, rs in groups.items()
        ]
        rows.sort(key=lambda m: (-m.time_s, m.module))
        return rows

    def coverage(self) -> dict[str, Any]:
        """How much of the estimate rests on formulas, and how much on the memory-only fallback."""
        fallback = [r for r in self.records if r.estimate.fallback]
        fallback_time = sum(r.estimate.time_s for r in fallback)
        ops = {r.invoke.name for r in self.records}
        fallback_ops = sorted({r.invoke.name for r in fallback})
        return {
            "ops": len(ops),
            "fallback_ops": fallback_ops,
            "calls": len(self.records),
            "fallback_calls": len(fallback),
            "fallback_time_s": fallback_time,
            "fallback_op_share": len(fallback_ops) / len(ops) if ops else 0.0,
            "fallback_time_share": fallback_time / self.time_s if self.time_s else 0.0,
        }

    def borrowed_rates(self) -> list[str]:
        """A line per dtype the device lists no rate for, naming the rate used instead and the ops it timed."""
        used: dict[tuple[str, str, str], set[str]] = {}
        for record in self.records:
            for unit_dtype, rate in record.estimate.detail.get("rates", {}).items():
                found = re.fullmatch(r"(\S+) \(no (\S+) rate\)", str(rate))
                unit = "matrix" if unit_dtype.startswith(("mma", "cube")) else "vector"
                # Index arithmetic (int64 positions, bool masks) on the vector unit is noise, not a choice to show.
                if found and (unit == "matrix" or found.group(2) not in _INDEX_DTYPES):
                    used.setdefault((unit, found.group(2), found.group(1)), set()).add(record.invoke.name)
        return [
            f"{self.device.name} lists no {unit} rate for {wanted}: {', '.join(sorted(ops))} used its {rate} rate"
            for (unit, wanted, rate), ops in sorted(used.items())
        ]

    def totals(self) -> dict[str, Any]:
        return {
            "time_s": self.time_s,
            "flops": self.flops,
            "bytes": self.bytes,
            "calls": len(self.records),
            "fallback_calls": self.fallback_calls,
        }

    def to_dict(self) -> dict[str, Any]:
        data = {
            "description": self.description,
            "device": self.device.name,
            "workload": self.workload,
            "notes": self.notes,
            "warnings": self.warnings,
            "ops": [s.to_dict() for s in self.by_op()],
            "modules": [m.to_dict() for m in self.by_module()],
            "totals": self.totals(),
            "coverage": self.coverage(),
        }
        if self.memory is not None:
            data["memory"] = self.memory.to_dict()
        return data

    def to_json(self, indent: int | None = 2) -> str:
        """The report as strict JSON; a total that overflowed to infinity is an error, never ``Infinity``."""
        try:
            return json.dumps(self.to_dict(), indent=indent, allow_nan=False)
        except ValueError:
            slowest = max(self.records, key=lambda r: r.estimate.time_s, default=None)
            culprit = (
                f" (the slowest call: {slowest.invoke.name}, {slowest.estimate.time_s:g} s from "
                f"{slowest.estimate.source})"
                if slowest
                else ""
            )
            raise ReportError(
                f"the report's numbers overflow to infinity{culprit}; an estimator answers times "
                "far too large"
            ) from None

    def to_csv(self, by: str = "op") -> str:
        """Every row (by op or by module) and a last TOTAL row."""
        rows = self.by_op() if by == "op" else self.by_module()
        fields = list(rows[0].to_dict()) if rows else list(OpSummary.__slots__)
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=fields, lineterminator="\n")
        writer.writeheader()
        for row in rows:  # a table cell holds the band's number; its family is the op's, as in the JSON
            cells = row.to_dict()
            if cells.get("error_band"):
                cells["error_band"] = cells["error_band"]["held_out_median_abs_error"]
            writer.writerow(cells)
        total = {
            fields[0]: "TOTAL",
            "calls": len(self.records),
            "time_s": self.time_s,
            "share": 1.0,
            "flops": self.flops,
            "bytes": self.bytes,
        }
        writer.writerow({k: v for k, v in total.items() if k in fields})
        return out.getvalue()

    def to_trace(self) -> dict[str, Any]:
        """Chrome trace events (Perfetto opens them): one slice per op call, back to back on one track."""
        events: list[dict[str, Any]] = [
            {"name": "process_name", "ph": "M", "pid": 0, "args": {"name": f"castcore: {self.device.name}"}},
            {
                "name": "thread_name",
                "ph": "M",
                "pid": 0,
                "tid": 0,
                "args": {"name": self.description or "ops"},
            },
        ]
        now_us = 0.0
        for record in self.records:
            duration_us = record.estimate.time_s * 1e6
            invoke = record.invoke
            events.append(
                {
                    "name": invoke.name,
                    "cat": record.estimate.bound,
                    "ph": "X",
                    "pid": 0,
                    "tid": 0,
                    "ts": now_us,
                    "dur": duration_us,
                    "args": {
                        "inputs": [repr(t) for t in invoke.inputs()],
                        "outputs": [repr(t) for t in invoke.outputs()],
                        "module": invoke.module,
                        "bound": record.estimate.bound,
                        "source": str(record.estimate.source),
                        "flops": record.flops,
                        "bytes": record.bytes,
                    },
                }
            )
            now_us += duration_us
        return {"traceEvents": events, "displayTimeUnit": "ms"}

    def format_table(self, top: int | None = None, by: str = "op") -> str:
        """The readable report: rows by op (or by module), totals, coverage and memory."""
        if by == "module":
            rows = self.by_module()
            header = ("module", "calls", "time", "share", "FLOPs", "bytes")
            cells = [
                (
                    m.module,
                    str(m.calls),
                    format_seconds(m.time_s),
                    f"{m.share:6.1%}",
                    format_count(m.flops),
                    format_count(m.bytes, "B"),
                )
                for m in rows
            ]
            left = {0}
        else:
            rows = self.by_op()
            header = ("op", "calls", "time", "share", "bound", "answered by")
            cells = [
                (s.op, str(s.calls), format_seconds(s.time_s), f"{s.share:6.1%}", s.bound, s.source)
                for s in rows
            ]
            left = {0, 4, 5}
        shown = cells if top is None else cells[:top]
        widths = [max(len(r[i]) for r in [header, *shown]) for i in range(len(header))]
        lines = [
            f"{self.description} on {self.device.name}" if self.description else f"on {self.device.name}",
            "",
        ]
        for row in [header, *shown]:
            lines.append(
                "  ".join(
                    cell.ljust(w) if i in left else cell.rjust(w)
                    for i, (cell, w) in enumerate(zip(row, widths))
                ).rstrip()
            )
        if len(shown) < len(cells):
            rest = rows[len(shown) :]
            lines.append(f"... {len(rest)} more rows, {format_seconds(sum(r.time_s for r in rest))} in all")
        cov = self.coverage()
        lines += [
            "",
            f"total time   {format_seconds(self.time_s)}",
            f"total FLOPs  {format_count(self.flops)}",
            f"bytes moved  {format_count(self.bytes, 'B')}",
            f"coverage     {cov['ops'] - len(cov['fallback_ops'])} of {cov['ops']} ops by formula or estimator; "
            f"{cov['fallback_calls']} of {cov['calls']} calls ({cov['fallback_time_share']:.1%} of time) "
            f"by memory-only fallback"
            + (f": {', '.join(cov['fallback_ops'])}" if cov["fallback_ops"] else ""),
        ]
        if self.memory is not None:
            lines += ["", *self.memory.summary_lines(self.device)]
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
