"""Measured (op, sizes) -> time tables as estimators: exact hits, log-space interpolation inside, None outside.

A pack or custom-op file declares, at module level::

    castcore.register_measured_table(torch.ops.aten.mm.default, "tables/mm-910b3.csv", device="ascend-910b3")

which loads the CSV at once (a bad table fails the plugin's import, naming the file and line) and
declares an ordinary estimator claim for the op, owned by the declaring module's plugin. A call
whose sizes lie outside the measured range on any axis, or whose dtype the table lacks, gets
None, so the next plugin answers (in the end the core's roofline); the audit shows both.

The table format::

    # source: measurement, castcore measure_table on atlas-01 (Ascend 910B3, CANN 8.0), 2025-03-01
    m,k,k2,n,dtype,time_s
    128,64,64,32,bfloat16,1.0e-05

Every column other than ``dtype`` and ``time_s`` is a size column, in the order of the key. The
default key is the flattened input tensor shapes (``aten.mm``: m, k, k, n); ``key=lambda invoke:
(m, n, k)`` chooses another. Columns equal in every row (mm's two ``k``) are one axis.
"""

from __future__ import annotations

import csv
import itertools
import math
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from castcore.devices.costs import Estimate
from castcore.devices.dtypes import dtype_name
from castcore.errors import CastcoreError
from castcore.plugins.claims import register_op_estimator
from castcore.recording.invoke import OpInvoke

SIZE_KEY = Callable[[OpInvoke], Sequence[float]]
SCHEME_GRID = "multilinear in log(size) -> log(time) over the enclosing grid points"
SCHEME_NEAREST = (
    "inverse-distance weighting in log(size) of the nearest measured points (the points around "
    "this call are not a full grid)"
)


class MeasuredTableError(CastcoreError, ValueError):
    """A measured table that cannot be used; the message names the file and, where it applies, the line."""


def default_key(invoke: OpInvoke) -> tuple[int, ...]:
    """Every input tensor's dims, flattened in argument order: ``aten.mm(a[m,k], b[k,n])`` -> (m, k, k, n)."""
    return tuple(d for t in invoke.inputs() for d in t.shape)


def dtype_of(invoke: OpInvoke) -> str | None:
    """A call's dtype as a table's dtype column holds it: its first input tensor's."""
    inputs = invoke.inputs()
    return dtype_name(inputs[0].dtype) if inputs else None


def _canonical_dtype(text: str) -> str | None:
    name = dtype_name(text)
    return name if isinstance(getattr(torch, name, None), torch.dtype) else None


@dataclass
class MeasuredTable:
    """One loaded table: measured points per dtype, and lookups that interpolate between them."""

    path: Path
    source: str
    columns: tuple[str, ...]  # the size columns, in key order
    points: dict[str, dict[tuple[float, ...], tuple[float, int]]]  # dtype -> sizes -> (time_s, line)
    key: SIZE_KEY | None = None  # None: default_key
    op: Any = None
    axes: list[list[int]] = field(default_factory=list)  # groups of columns equal in every row

    def __post_init__(self) -> None:
        if not self.axes:
            self.axes = _alias_groups(len(self.columns), [k for pts in self.points.values() for k in pts])

    # --- lookups -------------------------------------------------------------------------------

    def lookup(self, invoke: OpInvoke) -> Estimate | None:
        """The table's estimate of ``invoke``, or None when it is outside the table (then the next plugin answers)."""
        sizes: tuple[float, ...]
        if self.key is None:
            sizes = default_key(invoke)
            if len(sizes) != len(self.columns):
                return None  # another rank than measured: outside the table
        else:
            sizes = tuple(self.key(invoke))
            if len(sizes) != len(self.columns):
                raise MeasuredTableError(
                    f"{self.path}: the key function returned {len(sizes)} sizes {sizes!r} for {invoke.name}, "
                    f"but the table has {len(self.columns)} size columns ({', '.join(self.columns)})"
                )
        dtype = dtype_of(invoke)
        return None if dtype is None else self.lookup_sizes(sizes, dtype)

    def lookup_sizes(self, sizes: Sequence[float], dtype: torch.dtype | str) -> Estimate | None:
        """The same on a size key and a dtype: exact, interpolated, or None outside the measured range."""
        dtype = _canonical_dtype(dtype_name(dtype)) or dtype_name(dtype)
        table = self.points.get(dtype)
        if not table:
            return None
        sizes = tuple(float(s) for s in sizes)
        detail: dict[str, object] = {
            "table": str(self.path),
            "table_source": self.source,
            "dtype": dtype,
            "key": dict(zip(self.columns, _plain(sizes))),
        }
        hit = table.get(sizes)
        if hit is not None:
            detail.update(lookup="exact", points=[self._point(sizes, hit, 1.0)])
            return Estimate(time_s=hit[0], detail=detail)
        query = []  # one value per axis; columns aliased in the table must agree in the call
        for group in self.axes:
            if len({sizes[i] for i in group}) != 1:
                return None
            query.append(sizes[group[0]])
        if any(q <= 0 for q in query):
            return None
        values = [sorted({k[group[0]] for k in table}) for group in self.axes]
        brackets = []
        for q, vals in zip(query, values):
            if q < vals[0] or q > vals[-1]:
                return None  # outside the measured range on this axis
            lo = max(v for v in vals if v <= q)
            hi = min(v for v in vals if v >= q)
            brackets.append((lo, hi))
        corners, missing = [], None
        for choice in itertools.product(*(sorted({lo, hi}) for lo, hi in brackets)):
            full = self._full_key(choice)
            if full not in table:
                missing = full
                break
            weight = 1.0
            for q, (lo, hi), v in zip(query, brackets, choice):
                if lo != hi:
                    f = (math.log(q) - math.log(lo)) / (math.log(hi) - math.log(lo))
                    weight *= f if v == hi else 1.0 - f
            corners.append((full, weight))
        if missing is None:
            chosen = corners
            detail.update(lookup="interpolated", scheme=SCHEME_GRID)
        else:
            chosen = self._nearest(table, query)
            detail.update(
                lookup="nearest", scheme=SCHEME_NEAREST, note=f"grid point {_plain(missing)} is not measured"
            )
        log_t = sum(w * math.log(table[k][0]) for k, w in chosen)
        detail["points"] = [self._point(k, table[k], w) for k, w in chosen if w > 0]
        return Estimate(time_s=math.exp(log_t), detail=detail)

    def _full_key(self, per_axis: Sequence[float]) -> tuple[float, ...]:
        full = [0.0] * len(self.columns)
        for group, v in zip(self.axes, per_axis):
            for i in group:
                full[i] = v
        return tuple(full)

    def _nearest(self, table: dict, query: list[float]) -> list[tuple[tuple[float, ...], float]]:
        """The 2**axes nearest points in log space, weighted by inverse squared distance (summing to 1)."""

        def dist2(k: tuple[float, ...]) -> float:
            return sum((math.log(q) - math.log(k[g[0]])) ** 2 for q, g in zip(query, self.axes))

        near = sorted(table, key=lambda k: (dist2(k), k))[: min(len(table), 2 ** len(self.axes))]
        inverse = [1.0 / dist2(k) for k in near]  # dist2 > 0: an exact hit returned earlier
        total = sum(inverse)
        return [(k, w / total) for k, w in zip(near, inverse)]

    def _point(self, key: tuple[float, ...], hit: tuple[float, int], weight: float) -> dict[str, Any]:
        return {"sizes": _plain(key), "time_s": hit[0], "line": hit[1], "weight": round(weight, 6)}

    # --- as an estimator -----------------------------------------------------------------------

    def estimator(self, module: str | None = None) -> Callable[[OpInvoke, Any], Estimate | None]:
        """``fn(invoke, device)`` for ``register_op_estimator``; named after the table in the audit."""

        def estimate(invoke: OpInvoke, device: object) -> Estimate | None:
            return self.lookup(invoke)

        estimate.__name__ = estimate.__qualname__ = f"measured_table[{self.path.name}]"
        if module is not None:
            estimate.__module__ = module
        return estimate


def _plain(values: Sequence[float]) -> list[int | float]:
    return [int(v) if float(v).is_integer() else v for v in values]


def _alias_groups(n: int, keys: list[tuple[float, ...]]) -> list[list[int]]:
    """Columns equal in every row form one axis (aten.mm's two k); the others are their own."""
    groups: list[list[int]] = []
    for i in range(n):
        for group in groups:
            j = group[0]
            if keys and all(k[i] == k[j] for k in keys):
                group.append(i)
                break
        else:
            groups.append([i])
    return groups


# --- loading -------------------------------------------------------------------------------------


def _number(text: str, where: str, column: str, positive: bool = True) -> float:
    try:
        value = float(text)
    except ValueError:
        raise MeasuredTableError(f"{where}: {column} is {text.strip()!r}, not a number") from None
    if not math.isfinite(value) or (positive and value <= 0):
        raise MeasuredTableError(
            f"{where}: {column} is {text.strip()!r}; it must be a positive finite number"
        )
    return value


def load_measured_table(path: str | Path, key: SIZE_KEY | None = None, op: Any = None) -> MeasuredTable:
    """Read and check a table; raise MeasuredTableError naming the file (and line) at fault."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise MeasuredTableError(f"{path}: no such measured table") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise MeasuredTableError(f"{path}: cannot read the measured table: {exc}") from None
    source: str | None = None
    header: list[str] | None = None
    points: dict[str, dict[tuple[float, ...], tuple[float, int]]] = {}
    time_col = dtype_col = -1
    size_cols: list[int] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        where = f"{path}, line {lineno}"
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith("#"):
            comment = stripped.lstrip("#").strip()
            if comment.lower().startswith("source:") and header is None:
                source = comment.split(":", 1)[1].strip() or None
            continue
        cells = [c.strip() for c in next(csv.reader([line]))]
        if header is None:
            header = cells
            if source is None:
                raise MeasuredTableError(
                    f"{path}: no source; begin the file with a line such as '# source: measurement, <tool>, "
                    f"<machine and software>, <date>' so every number says where it came from"
                )
            duplicates = sorted({c for c in header if header.count(c) > 1})
            if duplicates or "" in header:
                raise MeasuredTableError(
                    f"{where}: the header repeats or leaves empty a column name "
                    f"({', '.join(duplicates) or 'empty'})"
                )
            for needed in ("time_s", "dtype"):
                if needed not in header:
                    raise MeasuredTableError(
                        f"{where}: the header has no {needed} column; expected the size "
                        f"columns, then dtype and time_s, e.g. 'm,k,n,dtype,time_s'"
                    )
            time_col, dtype_col = header.index("time_s"), header.index("dtype")
            size_cols = [i for i in range(len(header)) if i not in (time_col, dtype_col)]
            if not size_cols:
                raise MeasuredTableError(
                    f"{where}: the header has no size column (anything besides dtype and time_s)"
                )
            continue
        if len(cells) != len(header):
            raise MeasuredTableError(
                f"{where}: {len(cells)} fields, but the header has {len(header)} ({','.join(header)})"
            )
        dtype = _canonical_dtype(cells[dtype_col])
        if dtype is None:
            raise MeasuredTableError(
                f"{where}: dtype {cells[dtype_col]!r} is not a torch dtype (e.g. bfloat16, float16, float32)"
            )
        sizes = tuple(_number(cells[i], where, header[i]) for i in size_cols)
        time_s = _number(cells[time_col], where, "time_s")
        seen = points.setdefault(dtype, {})
        if sizes in seen:
            raise MeasuredTableError(
                f"{where}: repeats the point of line {seen[sizes][1]} "
                f"({dtype} {_plain(sizes)}); keep one measurement per point"
            )
        seen[sizes] = (time_s, lineno)
    if header is None:
        raise MeasuredTableError(f"{path}: no header and no rows" + ("" if source else ", and no source"))
    if not points:
        raise MeasuredTableError(f"{path}: a header but no measured rows")
    assert source is not None  # a header without a source raised above
    return MeasuredTable(
        path=path, source=source, columns=tuple(header[i] for i in size_cols), points=points, key=key, op=op
    )


def _caller(stacklevel: int) -> tuple[str, Path | None]:
    frame = sys._getframe(stacklevel + 1)
    file = frame.f_globals.get("__file__")
    return frame.f_globals.get("__name__", "__main__"), Path(file).resolve().parent if file else None


def register_measured_table(
    op: Any,
    path: str | os.PathLike,
    device: str | None = None,
    *,
    key: SIZE_KEY | None = None,
    override: bool = False,
    _stacklevel: int = 1,
) -> MeasuredTable:
    """Declare a measured table as the estimator of ``op`` on devices matching ``device`` (name or glob).

    ``path`` is relative to the directory of the calling module (a pack's package, or a custom-op
    file's directory). The table is loaded now, so a bad one fails the declaring plugin, by name.
    The claim belongs to the calling module's plugin, like ``register_op_estimator``.
    """
    module, base = _caller(_stacklevel)
    path = Path(path)
    if not path.is_absolute():
        path = (base or Path.cwd()) / path
    table = load_measured_table(path, key=key, op=op)
    register_op_estimator(op, device=device, override=override)(table.estimator(module))
    return table


# --- writing -------------------------------------------------------------------------------------------


def write_measured_table(
    path: str | Path,
    rows: Iterable[tuple[Sequence[float], torch.dtype | str, float]],
    columns: Sequence[str],
    source: str,
) -> MeasuredTable:
    """Write ``(sizes, dtype, time_s)`` rows as a measured table with its source line; returns it loaded."""
    if not source or not source.strip():
        raise MeasuredTableError(f"{path}: a measured table needs a source (measurement, machine, date)")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8", newline="") as f:
        f.write(f"# source: {' '.join(source.split())}\n")
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow([*columns, "dtype", "time_s"])
        for sizes, dtype, time_s in rows:
            writer.writerow([*_plain([float(s) for s in sizes]), dtype_name(dtype), repr(float(time_s))])
    return load_measured_table(path)
