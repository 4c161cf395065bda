"""Running captured or registered operators for real on this machine, and calibrating a profile of it.

``measure`` captures a function on fake tensors as usual, then runs each distinct call for real
with generated inputs (the op's ``input_gen_fn`` when it has one; else random floats, zeros for
integer and bool tensors), warms up, times repeated runs and sets the median against the estimate
on a device profile. ``calibrate`` measures matmul throughput, vector throughput, memory bandwidth
and per-op overhead and writes them as a device-profile TOML whose sources say so.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from castcore.devices.dtypes import dtype_name
from castcore.devices.profile import DeviceProfile
from castcore.devices.profile_files import device_from_dict
from castcore.ops.annotations import CustomOpError
from castcore.ops.register import lookup
from castcore.recording.invoke import OpInvoke, TensorMeta
from castcore.recording.recorder import capture
from castcore.report.records import format_seconds
from castcore.session import Session, default_session


class MeasureError(CustomOpError):
    """Measurement or calibration was asked for something it cannot do; the message says why."""


@dataclass
class Measurement:
    """One distinct call measured for real: median and min over ``repeat`` runs, and the estimate."""

    op: str
    inputs: str
    calls: int
    measured_s: float | None
    min_s: float | None
    estimated_s: float | None
    answered_by: str = ""
    error: str = ""

    @property
    def ratio(self) -> float | None:
        """estimated / measured: above 1 the estimate is pessimistic, below 1 optimistic."""
        if not self.measured_s or self.estimated_s is None:
            return None
        return self.estimated_s / self.measured_s

    def to_dict(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "inputs": self.inputs,
            "calls": self.calls,
            "measured_s": self.measured_s,
            "min_s": self.min_s,
            "estimated_s": self.estimated_s,
            "ratio": self.ratio,
            "answered_by": self.answered_by,
            "error": self.error,
        }


@dataclass
class MeasureReport:
    device: str
    runtime: str  # where the ops ran: "cpu" or "cuda:0"
    warmup: int
    repeat: int
    rows: list[Measurement] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        timed = [r for r in self.rows if r.measured_s is not None]
        return {
            "device": self.device,
            "runtime": self.runtime,
            "warmup": self.warmup,
            "repeat": self.repeat,
            "measured_s": sum(r.measured_s * r.calls for r in timed),
            "estimated_s": sum((r.estimated_s or 0.0) * r.calls for r in timed),
            "rows": [r.to_dict() for r in self.rows],
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def format_table(self) -> str:
        header = ("op", "inputs", "calls", "measured", "estimated", "est/meas", "answered by")
        rows = []
        for r in self.rows:
            if r.error:
                rows.append((r.op, r.inputs, str(r.calls), "not run", "-", "-", r.error))
                continue
            rows.append(
                (
                    r.op,
                    r.inputs,
                    str(r.calls),
                    format_seconds(r.measured_s),
                    format_seconds(r.estimated_s) if r.estimated_s is not None else "-",
                    f"{r.ratio:.2f}" if r.ratio is not None else "-",
                    r.answered_by,
                )
            )
        widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
        lines = [
            f"measured on {self.runtime} ({self.warmup} warm-up, median of {self.repeat}); "
            f"estimated on {self.device}",
            "",
        ]
        lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in [header, *rows]]
        totals = self.to_dict()
        lines += [
            "",
            f"total measured {format_seconds(totals['measured_s'])}, "
            f"estimated {format_seconds(totals['estimated_s'])} (ops that ran)",
        ]
        return "\n".join(lines)


def runtime_device() -> str:
    """Where measurement runs: the first CUDA device when present, else the CPU."""
    return "cuda:0" if torch.cuda.is_available() else "cpu"


def real_inputs(invoke: OpInvoke, device: str = "cpu") -> tuple[tuple, dict]:
    """Inputs for one captured call: the op's input_gen_fn when registered with one, else generated.

    Generated tensors are random floats in [0, 1), zeros for integer and bool dtypes (so index
    arguments stay in range), contiguous, with the captured shape and dtype.
    """
    try:
        record = lookup(invoke.op)
    except KeyError:
        record = None

    def make(value: Any) -> Any:
        if isinstance(value, TensorMeta):
            if value.dtype.is_floating_point or value.dtype.is_complex:
                return torch.rand(value.shape, dtype=value.dtype, device=device)
            return torch.zeros(value.shape, dtype=value.dtype, device=device)
        if isinstance(value, tuple):
            return [make(v) for v in value]
        if isinstance(value, dict):
            return {k: make(v) for k, v in value.items()}
        return value

    kwargs = {k: make(v) for k, v in invoke.kwargs.items()}
    if record is None or record.input_gen_fn is None:
        return tuple(make(a) for a in invoke.args), kwargs
    made = record.input_gen_fn(_Node(invoke))
    if isinstance(made, tuple) and len(made) == 2 and isinstance(made[1], dict):
        return tuple(made[0]), dict(made[1])
    made = list(made)
    if len(made) == len(invoke.args):
        return tuple(made), kwargs
    tensors = iter(made)  # nnScaler's form: the tensor inputs only; the other arguments as captured

    def fill(value: Any) -> Any:
        if isinstance(value, TensorMeta):
            return next(tensors)
        return [fill(v) for v in value] if isinstance(value, tuple) else make(value)

    return tuple(fill(a) for a in invoke.args), kwargs


class _Node:
    """A captured call as an ``input_gen_fn`` written for nnScaler reads it: ``inputs()`` gives each tensor's
    shape, dtype and requires_grad (False: measuring runs the forward only); the rest is the OpInvoke's."""

    def __init__(self, invoke: OpInvoke):
        self._invoke = invoke

    def __getattr__(self, name: str) -> Any:
        return getattr(self._invoke, name)

    def inputs(self) -> list[_Input]:
        return [_Input(t) for t in self._invoke.inputs()]


class _Input:
    requires_grad = False

    def __init__(self, meta: TensorMeta):
        self._meta = meta

    def __getattr__(self, name: str) -> Any:
        return getattr(self._meta, name)


def time_call(fn: Callable[[], Any], warmup: int = 3, repeat: int = 10, device: str = "cpu") -> list[float]:
    """Seconds per call of ``fn`` for ``repeat`` runs after ``warmup`` untimed ones."""
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    for _ in range(warmup):
        fn()
    sync()
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        sync()
        samples.append(time.perf_counter() - start)
    return samples


def measure_invoke(
    invoke: OpInvoke, warmup: int = 3, repeat: int = 10, device: str | None = None
) -> list[float]:
    """Run one captured call for real ``repeat`` times; returns the samples in seconds."""
    device = device or runtime_device()
    args, kwargs = real_inputs(invoke, device)
    with torch.no_grad():
        return time_call(lambda: invoke.op(*args, **kwargs), warmup, repeat, device)


def measure(
    target: Any,
    *inputs: Any,
    session: Session | None = None,
    device: str | DeviceProfile | None = None,
    warmup: int = 3,
    repeat: int = 10,
    **kwargs: Any,
) -> MeasureReport:
    """Capture ``target(*inputs, **kwargs)``, run each distinct call for real and compare with the estimate on
    ``device`` of ``session`` (None: the default session).

    ``target`` is any function or module castcore can capture, including a register_op function.
    """
    if warmup < 0 or repeat < 1:
        raise MeasureError(f"warmup must be >= 0 and repeat >= 1, not {warmup} and {repeat}")
    session = session or default_session()
    profile = session.device(device)
    runtime = runtime_device()
    captured = capture(target, *inputs, **kwargs)
    groups: dict[Any, list[OpInvoke]] = {}
    for invoke in captured.invokes:
        groups.setdefault(invoke.key, []).append(invoke)
    report = MeasureReport(profile.name, runtime, warmup, repeat)
    for calls in groups.values():
        invoke = calls[0]
        shapes = ", ".join(repr(t) for t in invoke.inputs()) or "-"
        estimate = session.resolver.estimate(invoke, profile)
        row = Measurement(
            invoke.name,
            shapes,
            len(calls),
            None,
            None,
            estimate.time_s,
            str(estimate.source) if estimate.source else "",
        )
        if not hasattr(invoke.op, "_schema"):
            row.error = "not a torch operator"
        else:
            try:
                samples = measure_invoke(invoke, warmup, repeat, runtime)
            except Exception as exc:  # e.g. a collective with no process group: reported, not fatal
                row.error = (
                    f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
                )
            else:
                row.measured_s, row.min_s = statistics.median(samples), min(samples)
        report.rows.append(row)
    return report


# ---------------------------------------------------------------------------------------------
# Calibration


@dataclass
class Calibration:
    """What ``calibrate`` measured on this machine, in SI units."""

    mma_flops: dict[str, float]
    gp_flops: dict[str, float]
    memory_bandwidth: float
    memory_bytes: float
    mma_op_cost_s: float
    gp_op_cost_s: float
    runtime: str


def _best_rate(work: float, samples: list[float]) -> float:
    return work / min(samples)


def calibrate(
    quick: bool = False, dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16), repeat: int = 5
) -> Calibration:
    """Measure this machine: matmul op/s per dtype, vector op/s, copy bandwidth, and per-op overhead.

    ``quick`` uses small sizes (for tests): the numbers are then far below the machine's peak.
    """
    device = runtime_device()
    mma, gp = {}, {}
    sizes = (128, 256) if quick else (1024, 2048)
    with torch.no_grad():
        for dtype in dtypes:
            best = 0.0
            for n in sizes:
                a = torch.rand(n, n, dtype=dtype, device=device)
                b = torch.rand(n, n, dtype=dtype, device=device)
                best = max(best, _best_rate(2 * n**3, time_call(lambda: torch.mm(a, b), 3, repeat, device)))
            mma[dtype_name(dtype)] = best
        # Small enough to stay in cache: the vector rate must measure the vector units, not DRAM
        # (a 16M-element add ran at memory speed, a third of the in-cache rate); bandwidth is below.
        numel = 1 << (16 if quick else 18)
        for dtype in dtypes:
            x = torch.rand(numel, dtype=dtype, device=device)
            y = torch.rand(numel, dtype=dtype, device=device)
            out = torch.empty_like(x)
            gp[dtype_name(dtype)] = _best_rate(
                numel, time_call(lambda: torch.add(x, y, out=out), 3, repeat, device)
            )
        src = torch.rand(1 << (18 if quick else 26), dtype=torch.float32, device=device)  # 1 MiB / 256 MiB
        dst = torch.empty_like(src)
        bandwidth = _best_rate(
            2 * src.numel() * src.element_size(), time_call(lambda: dst.copy_(src), 3, repeat, device)
        )
        tiny = torch.rand(1, 1, device=device)
        mma_cost = min(time_call(lambda: torch.mm(tiny, tiny), 3, repeat * 4, device))
        one = torch.rand(1, device=device)
        gp_cost = min(time_call(lambda: torch.add(one, one), 3, repeat * 4, device))
    return Calibration(mma, gp, bandwidth, _memory_bytes(device), mma_cost, gp_cost, device)


def _memory_bytes(device: str) -> float:
    if device.startswith("cuda"):
        return float(torch.cuda.get_device_properties(0).total_memory)
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return float(16 << 30)


def profile_toml(cal: Calibration, name: str = "local", when: datetime.date | None = None) -> str:
    """The calibration as a device-profile TOML (efficiencies 1: the rates are already achieved ones)."""
    when = when or datetime.date.today()
    source = f"measurement, {when.isoformat()}, castcore calibrate"
    vendor = (
        torch.cuda.get_device_name(0)
        if cal.runtime.startswith("cuda")
        else platform.processor() or platform.machine() or "local"
    )

    def num(x: float) -> str:
        return repr(float(x)) if math.isfinite(x) else "0.0"

    lines = [
        f"# measured by castcore calibrate on {platform.node() or 'this machine'} ({cal.runtime}), "
        f"{when.isoformat()}",
        f'name = "{name}"',
        f'vendor = "{vendor.replace(chr(34), "")}"',
        f"memory_bytes = {int(cal.memory_bytes)}",
        f"memory_bandwidth = {num(cal.memory_bandwidth)}",
        "compute_efficiency = 1.0",
        "memory_efficiency = 1.0",
        f"mma_op_cost_s = {num(cal.mma_op_cost_s)}",
        f"gp_op_cost_s = {num(cal.gp_op_cost_s)}",
        "",
        "[mma_flops]",
    ]
    lines += [f"{k} = {num(v)}" for k, v in cal.mma_flops.items()]
    lines += ["", "[gp_flops]"] + [f"{k} = {num(v)}" for k, v in cal.gp_flops.items()]
    fields = (
        "memory_bytes",
        "memory_bandwidth",
        "compute_efficiency",
        "memory_efficiency",
        "mma_op_cost_s",
        "gp_op_cost_s",
        "mma_flops",
        "gp_flops",
    )
    lines += ["", "[sources]"] + [f'{f} = "{source}"' for f in fields]
    text = "\n".join(lines) + "\n"
    import tomllib  # py3.11+; the profile is checked with castcore's own validation before anyone uses it

    device_from_dict(tomllib.loads(text), origin="castcore calibrate")
    return text


# ---------------------------------------------------------------------------------------------
