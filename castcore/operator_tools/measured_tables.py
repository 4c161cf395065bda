"""``castcore.measure_table``: run an op for real on this machine over a list of cases, and write the times as a
measured table (castcore.ops.tables reads it back, and ``castcore.pack.register_measured_table`` declares it)."""

from __future__ import annotations

import datetime
import platform
import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

from castcore.ops.tables import (
    SIZE_KEY,
    MeasuredTable,
    MeasuredTableError,
    default_key,
    dtype_of,
    write_measured_table,
)
from castcore.operator_tools.timing import measure_invoke, runtime_device
from castcore.recording.invoke import OpInvoke, op_name, to_meta


def measure_table(
    op: Any,
    cases: Iterable[Sequence[Any]],
    path: str | Path,
    *,
    columns: Sequence[str] | None = None,
    key: SIZE_KEY | None = None,
    source: str | None = None,
    warmup: int = 3,
    repeat: int = 10,
) -> MeasuredTable:
    """Run ``op`` for real here on each case (a tuple of arguments; tensors may be on ``meta``) and write the table.

    Timing is ``castcore.measure``'s: generated inputs (the op's ``input_gen_fn`` when registered with
    one), warm-up, the median of ``repeat`` runs, on CUDA when present, else the CPU.
    """
    runtime = runtime_device()
    rows, names = [], None
    for case in cases:
        invoke = OpInvoke(op, args=to_meta(tuple(case)))
        sizes = tuple(key(invoke)) if key else default_key(invoke)
        if names is None:
            names = (
                list(columns)
                if columns
                else (
                    [f"key{i}" for i in range(len(sizes))]
                    if key
                    else [f"arg{a}_dim{d}" for a, t in enumerate(invoke.inputs()) for d in range(t.dim())]
                )
            )
        if len(sizes) != len(names):
            raise MeasuredTableError(
                f"{path}: case {case!r} gives {len(sizes)} sizes, the columns are {names}"
            )
        samples = measure_invoke(invoke, warmup, repeat, runtime)
        rows.append((sizes, dtype_of(invoke), statistics.median(samples)))
    if not rows:
        raise MeasuredTableError(f"{path}: no cases to measure")
    if source is None:
        machine = (
            torch.cuda.get_device_name(0)
            if runtime.startswith("cuda")
            else (platform.processor() or platform.machine())
        )
        source = (
            f"measurement, castcore measure_table of {op_name(op)} (median of {repeat} after {warmup} "
            f"warm-up), {platform.node() or 'this machine'} {runtime} ({machine}), torch {torch.__version__}, "
            f"{datetime.date.today().isoformat()}"
        )
    return write_measured_table(path, rows, names, source)
