"""What an estimator sees of one operator call: tensor metadata, never tensor data."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from castcore.devices.costs import PerformanceProperties


@dataclass(frozen=True, slots=True)
class TensorMeta:
    """Shape, dtype and layout of a tensor, with the few methods formulas read like torch code."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    stride: tuple[int, ...] = ()
    storage_offset: int = 0
    device: str = "cpu"
    # Which storage the tensor views (an id unique within one capture) and its size: for memory
    # liveness. Not part of equality, so identical calls on different buffers still match.
    storage: int = field(default=-1, compare=False)
    storage_nbytes: int = field(default=0, compare=False)

    @classmethod
    def of(cls, t: torch.Tensor, storage: int = -1) -> TensorMeta:
        strided = t.layout == torch.strided
        return cls(
            shape=tuple(int(s) for s in t.shape),
            dtype=t.dtype,
            stride=tuple(int(s) for s in t.stride()) if strided else (),
            storage_offset=int(t.storage_offset()) if strided else 0,
            device=str(t.device),
            storage=storage,
            storage_nbytes=int(t.untyped_storage().nbytes()) if strided and storage >= 0 else 0,
        )

    def numel(self) -> int:
        return math.prod(self.shape)

    def element_size(self) -> int:
        return self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        return self.numel() * self.element_size()

    def dim(self) -> int:
        return len(self.shape)

    def size(self, dim: int | None = None) -> tuple[int, ...] | int:
        return self.shape if dim is None else self.shape[dim]

    def __repr__(self) -> str:
        dims = "x".join(str(s) for s in self.shape) or "scalar"
        return f"{str(self.dtype).removeprefix('torch.')}[{dims}]"


def to_meta(value: Any, storage_of: Callable[[torch.Tensor], int] | None = None) -> Any:
    """Replace every tensor inside ``value`` by its TensorMeta; lists become tuples so the result hashes.

    ``storage_of`` numbers each tensor's storage (the capture passes one); without it storage is -1.
    """
    if isinstance(value, torch.Tensor):
        return TensorMeta.of(value, storage_of(value) if storage_of else -1)
    if isinstance(value, (list, tuple)):
        return tuple(to_meta(v, storage_of) for v in value)
    if isinstance(value, dict):
        return {k: to_meta(v, storage_of) for k, v in value.items()}
    return value


def tensors_in(value: Any, kind: type = TensorMeta) -> list:
    """Every instance of ``kind`` (TensorMeta, or torch.Tensor) inside a nested value, in order."""
    found: list = []
    _collect(value, kind, found)
    return found


_CONTAINERS = (list, tuple, dict)


def _collect(value: Any, kind: type, found: list) -> None:
    # Memory analysis walks every argument of every call: leaves are tested inline, not by a call each.
    if isinstance(value, kind):
        found.append(value)
        return
    items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else ()
    for v in items:
        if isinstance(v, kind):
            found.append(v)
        elif isinstance(v, _CONTAINERS):
            _collect(v, kind, found)


_SCHEMAS: dict[Any, dict[str, tuple[int, bool, bool, Any]]] = {}


def _schema_arguments(op: Any) -> dict[str, tuple[int, bool, bool, Any]]:
    """An op's arguments by name: position, keyword-only, whether it has a default, the default. Read from torch's
    schema once per op (each read of ``schema.arguments`` builds its objects anew)."""
    try:
        return _SCHEMAS[op]
    except KeyError:
        pass
    except TypeError:  # an op that cannot be a key: read it each time
        return _read_schema(op)
    found = _SCHEMAS[op] = _read_schema(op)
    return found


def _read_schema(op: Any) -> dict[str, tuple[int, bool, bool, Any]]:
    schema = getattr(op, "_schema", None)
    found: dict[str, tuple[int, bool, bool, Any]] = {}
    for position, arg in enumerate(schema.arguments if schema is not None else ()):
        if arg.name not in found:
            has_default = arg.has_default_value()
            found[arg.name] = (
                position,
                arg.kwarg_only,
                has_default,
                arg.default_value if has_default else None,
            )
    return found


def _hashable(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    if isinstance(value, tuple):
        return tuple(_hashable(v) for v in value)
    try:
        hash(value)
    except TypeError:
        return repr(value)
    return value


class CallKey:
    """An invoke's identity with its hash worked out once: the same key is looked up several times
    per call, and hashing its nested TensorMetas again each time costs more than the lookup."""

    __slots__ = ("value", "_hash")

    def __init__(self, value: tuple):
        self.value = value
        self._hash = hash(value)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return self is other or (
            type(other) is CallKey and self._hash == other._hash and self.value == other.value
        )

    def __repr__(self) -> str:
        return f"CallKey({self.value!r})"


@dataclass(slots=True)
class OpInvoke:
    """One captured operator call: the op, its arguments with TensorMeta for tensors, and where it ran.

    ``attrs`` carries facts the capture knew and the arguments do not say, such as the
    size of a collective's process group (``attrs["group_size"]``).
    """

    op: Any  # torch._ops.OpOverload, or any callable a test feeds in
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    out: Any = None
    module: str = ""
    index: int = 0
    attrs: dict = field(default_factory=dict)
    _key: Any = field(default=None, repr=False, compare=False)

    @property
    def name(self) -> str:
        """The operator's name as torch prints it, e.g. ``aten::mm`` (overload omitted when default)."""
        return op_name(self.op)

    @property
    def key(self) -> Any:
        """Hashable identity over the op and all metadata: identical calls resolve once."""
        if self._key is None:
            key = (self.op, self.args, tuple(self.kwargs.items()), self.out, tuple(self.attrs.items()))
            try:
                # the usual case: arguments are already tuples, TensorMetas and plain values
                self._key = CallKey(key)
            except TypeError:
                self._key = CallKey(
                    (
                        self.op,
                        _hashable(self.args),
                        _hashable(self.kwargs),
                        _hashable(self.out),
                        _hashable(self.attrs),
                    )
                )
        return self._key

    def argument(self, name: str, default: Any = None) -> Any:
        """An argument by its schema name, whether passed by position or keyword, else its default."""
        if name in self.kwargs:
            return self.kwargs[name]
        found = _schema_arguments(self.op).get(name)
        if found is None:
            return default
        position, kwarg_only, has_default, value = found
        if position < len(self.args) and not kwarg_only:
            return self.args[position]
        return value if has_default else default

    def inputs(self) -> list[TensorMeta]:
        found = tensors_in(self.args)
        if self.kwargs:
            _collect(self.kwargs, TensorMeta, found)
        return found

    def outputs(self) -> list[TensorMeta]:
        return tensors_in(self.out)

    def memory_access_properties(self) -> PerformanceProperties:
        """Properties with every input read once and every output written once, and no compute."""
        return PerformanceProperties(
            memory_read_bytes=sum(t.nbytes for t in self.inputs()),
            memory_write_bytes=sum(t.nbytes for t in self.outputs()),
        )

    # The seed RFC's spelling, so estimator files written for it port unchanged.
    get_memory_access_properties = memory_access_properties


def op_name(op: Any) -> str:
    """``aten::mm`` for aten.mm.default, ``aten::add.Tensor`` for other overloads."""
    schema = getattr(op, "_schema", None)
    if schema is None:
        return getattr(op, "__qualname__", repr(op))
    overload = schema.overload_name
    return f"{schema.name}.{overload}" if overload and overload != "default" else schema.name
