"""Partition analysis of a registered op: every legal split over N devices, its shapes, time and collective.

A plain dim splits the tensors that hold it (outputs included); a ``+`` dim splits the inputs that
hold it and leaves each device with a partial sum of every output, which an all_reduce completes.
The all_reduce is timed by whichever plugin answers ``_c10d_functional::all_reduce`` in the
session (castpack-collectives when installed), through a synthetic call with the group size set.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import torch

from castcore.devices.costs import STEP_FALLBACK, Estimate
from castcore.devices.profile import DeviceProfile
from castcore.ops.annotations import FROZEN, SUM, CustomOpError
from castcore.ops.binding import Binding
from castcore.ops.record import RegisteredOp
from castcore.ops.register import lookup
from castcore.plugins.resolve import EstimatorError
from castcore.recording.invoke import OpInvoke, TensorMeta
from castcore.report.records import format_seconds
from castcore.session import Session, default_session

ALL_REDUCE = "_c10d_functional::all_reduce"


class PartitionError(CustomOpError):
    """partition was asked about something it cannot analyse; the message says what to pass instead."""


@dataclass
class Collective:
    """The collective a split needs after the op, and its time (None: no plugin estimates it)."""

    op: str
    group_size: int
    bytes: int  # per device, summed over the outputs it reduces
    estimate: Estimate | None
    note: str = ""

    @property
    def time_s(self) -> float | None:
        return None if self.estimate is None else self.estimate.time_s

    def to_dict(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "group_size": self.group_size,
            "bytes": self.bytes,
            "time_s": self.time_s,
            "answered_by": str(self.estimate.source) if self.estimate and self.estimate.source else None,
            "note": self.note,
        }


@dataclass
class Split:
    """Splitting one named dim ``ways`` ways: legal or why not, and each device's shapes and time."""

    dim: str
    kind: str  # "spatial" ('' dims) or "sum" ('+' dims)
    size: int
    legal: bool
    reason: str = ""
    input_shapes: list[tuple[int, ...] | None] = field(default_factory=list)  # per device
    output_shapes: list[tuple[int, ...]] = field(default_factory=list)
    arguments: dict[str, int] = field(default_factory=dict)  # hidden-dim arguments per device
    estimate: Estimate | None = None  # one device's op time
    collective: Collective | None = None

    @property
    def time_s(self) -> float | None:
        """One device's op time plus the collective's; None when either part is not estimated."""
        if self.estimate is None:
            return None
        if self.collective is None:
            return self.estimate.time_s
        return None if self.collective.time_s is None else self.estimate.time_s + self.collective.time_s

    def to_dict(self) -> dict[str, Any]:
        return {
            "dim": self.dim,
            "kind": self.kind,
            "size": self.size,
            "legal": self.legal,
            "reason": self.reason,
            "input_shapes": [list(s) if s is not None else None for s in self.input_shapes],
            "output_shapes": [list(s) for s in self.output_shapes],
            "arguments": self.arguments,
            "op_time_s": self.estimate.time_s if self.estimate else None,
            "op_answered_by": str(self.estimate.source) if self.estimate and self.estimate.source else None,
            "collective": self.collective.to_dict() if self.collective else None,
            "time_s": self.time_s,
        }


@dataclass
class PartitionPlan:
    """Every named dim of one call of a registered op, split ``ways`` ways on ``device``."""

    op: str
    annotation: str
    ways: int
    device: str
    input_shapes: list[tuple[int, ...] | None]
    output_shapes: list[tuple[int, ...]]
    whole: Estimate | None  # the unsplit op on one device
    splits: list[Split]

    @property
    def legal(self) -> list[Split]:
        return [s for s in self.splits if s.legal]

    def best(self) -> Split | None:
        """The legal split with the least estimated time per device (collective included)."""
        timed = [s for s in self.legal if s.time_s is not None]
        return min(timed, key=lambda s: s.time_s) if timed else None

    def to_dict(self) -> dict[str, Any]:
        best = self.best()
        return {
            "op": self.op,
            "annotation": self.annotation,
            "ways": self.ways,
            "device": self.device,
            "input_shapes": [list(s) if s is not None else None for s in self.input_shapes],
            "output_shapes": [list(s) for s in self.output_shapes],
            "whole_time_s": self.whole.time_s if self.whole else None,
            "best": best.dim if best else None,
            "splits": [s.to_dict() for s in self.splits],
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def format_table(self) -> str:
        shapes = ", ".join("?" if s is None else "x".join(map(str, s)) for s in self.input_shapes)
        lines = [
            f"{self.op}  {self.annotation}",
            f"inputs {shapes}; {self.ways} ways on {self.device}; unsplit "
            f"{format_seconds(self.whole.time_s) if self.whole else '-'}",
            "",
        ]
        header = ("dim", "kind", "legal", "per-device inputs", "op time", "collective", "total")
        rows = []
        for s in self.splits:
            per_device = (
                "; ".join("?" if x is None else "x".join(map(str, x)) for x in s.input_shapes)
                if s.legal
                else s.reason
            )
            op_time = format_seconds(s.estimate.time_s) if s.estimate else "-"
            if s.collective is None:
                comm = "-"
            elif s.collective.estimate is None:
                comm = f"{s.collective.op.split('::')[1]} unestimated"
            else:
                comm = f"{s.collective.op.split('::')[1]} {format_seconds(s.collective.time_s)}"
            total = format_seconds(s.time_s) if s.time_s is not None else "-"
            rows.append((s.dim, s.kind, "yes" if s.legal else "no", per_device, op_time, comm, total))
        widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
        for row in [header, *rows]:
            lines.append("  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip())
        best = self.best()
        notes = {s.collective.note for s in self.splits if s.collective and s.collective.note}
        lines += [""] + [f"note: {n}" for n in sorted(notes)]
        lines.append(
            f"best: split {best.dim} ({format_seconds(best.time_s)} per device)"
            if best
            else "best: no legal split is fully estimated"
        )
        return "\n".join(lines)


def partition(
    op: Any,
    *inputs: Any,
    ways: int,
    session: Session | None = None,
    device: str | DeviceProfile | None = None,
    **kwargs: Any,
) -> PartitionPlan:
    """Analyse ``op(*inputs, **kwargs)`` split ``ways`` ways: legal splits, per-device shapes and estimates on
    ``device`` of ``session`` (None: the default session).

    ``op`` is a function returned by ``castcore.register_op``, its OpOverload or "ns::name".
    Inputs are tensors on any device (meta is fine) or TensorMeta; nothing is computed for real.
    """
    if isinstance(ways, bool) or not isinstance(ways, int) or ways < 1:
        raise PartitionError(f"ways must be a whole number >= 1, not {ways!r}")
    try:
        record = lookup(op)
    except KeyError as exc:
        raise PartitionError(str(exc.args[0])) from None
    session = session or default_session()
    profile = session.device(device)
    args = [_meta(v) for v in inputs]
    kwargs = {k: _meta(v) for k, v in kwargs.items()}
    bound = record.bind_all(args, kwargs)
    values = [bound[p] for p in record.params]
    fitted = record.fit(values)
    count = len(fitted.annotation.inputs)
    named_args = dict(zip(record.params[count:], values[count:]))

    whole = _estimate(session, record, values, profile)
    splits = []
    for name, mark in fitted.marks.items():
        if name[0].isdecimal():
            continue
        size = fitted.sizes[name]
        split = Split(dim=name, kind="sum" if mark == SUM else "spatial", size=size, legal=False)
        if mark == FROZEN:
            split.kind, split.reason = "frozen", f"'{name}^' must not be split"
        elif size % ways or size < ways:
            split.reason = f"length {size} does not divide into {ways}"
        else:
            split.legal = True
        splits.append(split)
        if not split.legal:
            continue
        sizes = dict(fitted.sizes, **{name: size // ways})
        split.input_shapes = [
            None if dims is None else fitted.shape_of(dims, sizes) for dims in fitted.inputs
        ]
        full_outputs = [fitted.shape_of(dims, sizes) for dims in fitted.outputs]
        split.output_shapes = full_outputs
        device_values = list(values)
        for index, shape in enumerate(split.input_shapes):
            if shape is not None and isinstance(values[index], torch.Tensor):
                device_values[index] = torch.empty(shape, dtype=values[index].dtype, device="meta")
        if isinstance(named_args.get(name), int):
            split.arguments[name] = size // ways
            device_values[record.params.index(name)] = size // ways
        try:
            split.estimate = _estimate(session, record, device_values, profile)
        except CustomOpError as exc:
            split.legal = False
            split.reason = f"the op rejects the per-device shapes: {getattr(exc, 'reason', exc)}"
            continue
        if mark == SUM:
            split.collective = _all_reduce(session, profile, fitted, full_outputs, values, ways)
    return PartitionPlan(
        op=record.qualname,
        annotation=str(fitted.annotation),
        ways=ways,
        device=profile.name,
        input_shapes=fitted.input_shapes,
        output_shapes=fitted.output_shapes,
        whole=whole,
        splits=splits,
    )


def _meta(value: Any) -> Any:
    if isinstance(value, TensorMeta):
        return torch.empty_strided(
            value.shape, value.stride or _contiguous(value.shape), dtype=value.dtype, device="meta"
        )
    if isinstance(value, torch.Tensor) and value.device.type != "meta":
        return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="meta")
    return value


def _contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


def _estimate(session: Session, record: RegisteredOp, values: list, profile: DeviceProfile) -> Estimate:
    """One device's time for the op: capture it on fake tensors and resolve it through the session."""
    report = session.estimate(record.wrapper, *values, device=profile)
    mine = [r for r in report.records if r.invoke.op in record.overloads.values()]
    if len(mine) == 1 and len(report.records) == 1:
        return mine[0].estimate
    time_s = sum(r.estimate.time_s for r in report.records)
    return Estimate(
        time_s=time_s,
        bound="unknown",
        source=mine[0].estimate.source if mine else None,
        detail={"calls": len(report.records)},
    )


def _all_reduce(
    session: Session, profile: DeviceProfile, fitted: Binding, output_shapes: list, values: list, ways: int
) -> Collective:
    """All-reduce of every output's partial sums, asked of the session as a synthetic functional collective."""
    tensors = [v for v in values if isinstance(v, torch.Tensor)]
    floats = [t.dtype for t in tensors if t.dtype.is_floating_point]
    dtype = floats[0] if floats else tensors[0].dtype
    total = 0.0
    nbytes = 0
    answer: Estimate | None = None
    try:
        op = torch.ops._c10d_functional.all_reduce.default
    except (AttributeError, RuntimeError):  # a torch built without distributed
        return Collective(ALL_REDUCE, ways, 0, None, "this torch has no functional collectives")
    for shape in output_shapes:
        meta = TensorMeta(shape=tuple(shape), dtype=dtype, stride=_contiguous(tuple(shape)))
        nbytes += meta.nbytes
        invoke = OpInvoke(
            op=op,
            args=(meta, "sum", "castcore-partition"),
            out=meta,
            module="partition",
            attrs={"group_size": ways, "group_name": "castcore-partition"},
        )
        try:
            estimate = session.resolver.estimate(invoke, profile)
        except EstimatorError as exc:
            return Collective(ALL_REDUCE, ways, nbytes, None, f"all_reduce unestimated: {exc}")
        if estimate.source is None or estimate.source.step == STEP_FALLBACK:
            return Collective(
                ALL_REDUCE,
                ways,
                nbytes,
                None,
                "all_reduce unestimated: no plugin times _c10d_functional::all_reduce "
                "(pip install castpack-collectives)",
            )
        total += estimate.time_s
        answer = estimate
    summed = Estimate(
        time_s=total,
        comm_s=total,
        bound="comm",
        source=answer.source if answer else None,
        detail={"outputs": len(output_shapes)},
    )
    return Collective(ALL_REDUCE, ways, nbytes, summed)
