"""A capture as data: JSON that names only plain values, torch's dtype-like constants and registered operators.

The capture cache keeps captures on disk between runs. Reading one must never run code (a pickle can), so a
stored capture is JSON in which every list starts with a tag saying what it holds, and loading rebuilds only
the types below: a name that is not a torch dtype, device, layout or memory format, or an operator not
registered in this process, makes the whole entry unreadable (``StoredError``), never something else.
"""

from __future__ import annotations

import json
import math
import zlib
from types import SimpleNamespace
from typing import Any

import torch

from castcore.recording.invoke import OpInvoke, TensorMeta
from castcore.recording.recorder import Capture, no_cyclic_gc


class StoredError(ValueError):
    """Bytes that are not a stored capture this castcore can read (another format, cut, altered)."""


class Unstorable(TypeError):
    """A value with no stored form (an op that is a Python callable, an object in an argument)."""


_CONSTANTS = {"d": torch.dtype, "L": torch.layout, "M": torch.memory_format}


def _encode(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else ["f", repr(value)]
    if isinstance(value, TensorMeta):
        return [
            "T",
            list(value.shape),
            str(value.dtype).removeprefix("torch."),
            list(value.stride),
            value.storage_offset,
            value.device,
            value.storage,
            value.storage_nbytes,
        ]
    if isinstance(value, tuple):
        return ["(", *map(_encode, value)]
    if isinstance(value, list):
        return ["[", *map(_encode, value)]
    if isinstance(value, dict):
        return ["{", *([_encode(k), _encode(v)] for k, v in value.items())]
    if isinstance(value, SimpleNamespace):
        return ["N", *([k, _encode(v)] for k, v in vars(value).items())]
    if isinstance(value, torch.device):
        return ["D", str(value)]
    for tag, kind in _CONSTANTS.items():
        if isinstance(value, kind):
            return [tag, str(value).removeprefix("torch.")]
    if isinstance(value, torch._ops.OpOverload):
        return ["O", value._schema.name, value._overloadname]
    raise Unstorable(f"{type(value).__name__} has no stored form")


def _decode(value: Any) -> Any:
    # Most values are leaves, and a capture holds millions: lists' items are decoded in place, calling this only
    # for the items that are lists themselves.
    if value.__class__ is not list:
        return value
    if not value:
        raise StoredError("an untagged list")
    tag = value[0]
    if tag == "T":
        _, shape, dtype, stride, offset, device, storage, nbytes = value
        return TensorMeta(tuple(shape), _constant("d", dtype), tuple(stride), offset, device, storage, nbytes)
    if tag == "(":
        return tuple([v if v.__class__ is not list else _decode(v) for v in value[1:]])
    if tag == "[":
        return [v if v.__class__ is not list else _decode(v) for v in value[1:]]
    if tag == "{":
        return {_decode(k): _decode(v) for k, v in value[1:]}
    if tag == "N":
        return SimpleNamespace(**{k: _decode(v) for k, v in value[1:]})
    if tag == "f":
        return float(value[1])
    if tag == "D":
        return torch.device(value[1])
    if tag in _CONSTANTS:
        return _constant(tag, value[1])
    if tag == "O":
        return _operator(*value[1:])
    raise StoredError(f"unknown tag {tag!r}")


_FOUND: dict[tuple[str, str], Any] = {}  # (tag, name) -> the constant: looking one up in torch takes ~10 us


def _constant(tag: str, name: str) -> Any:
    found = _FOUND.get((tag, name))
    if found is None:
        found = getattr(torch, name, None) if isinstance(name, str) and name.isidentifier() else None
        if not isinstance(found, _CONSTANTS[tag]):
            raise StoredError(f"{name!r} is not a torch {_CONSTANTS[tag].__name__}")
        _FOUND[(tag, name)] = found
    return found


def _operator(name: str, overload: str) -> Any:
    """A registered operator by its schema name; never imports or creates anything."""
    namespace, _, op = name.partition("::")
    try:
        found = getattr(getattr(getattr(torch.ops, namespace), op), overload)
    except (AttributeError, RuntimeError):
        found = None
    if not isinstance(found, torch._ops.OpOverload):
        raise StoredError(f"operator {name}.{overload} is not registered in this process")
    return found


def _invoke(invoke: OpInvoke) -> list:
    if not isinstance(invoke.op, torch._ops.OpOverload):
        raise Unstorable(f"op {invoke.op!r} is not a registered operator")
    return [
        _encode(invoke.op),
        _encode(invoke.args),
        _encode(invoke.kwargs),
        _encode(invoke.out),
        invoke.module,
        invoke.index,
        _encode(invoke.attrs),
    ]


def _pairs(mapping: dict[int, int]) -> list[list[int]]:
    return [[k, v] for k, v in mapping.items()]


def dumps(entry: dict[str, Any]) -> bytes:
    """``entry`` (plain values, and a Capture under "capture") as compressed JSON; Unstorable if it has a value
    with no stored form."""
    plain = {k: _encode(v) for k, v in entry.items() if k != "capture"}
    captured: Capture = entry["capture"]
    plain["capture"] = {
        "invokes": [_invoke(i) for i in captured.invokes],
        "weights": _pairs(captured.weight_storages),
        "inputs": _pairs(captured.input_storages),
        "outputs": sorted(captured.output_storages),
        "state": _pairs(captured.state_storages),
    }
    return zlib.compress(json.dumps(plain, separators=(",", ":")).encode(), 1)


def loads(data: bytes) -> dict[str, Any]:
    """What ``dumps`` stored; StoredError for anything else. (The many small objects it makes all live on: full
    collections over them would cost more than the decoding.)"""
    with no_cyclic_gc():
        return _loads(data)


# A stored capture inflates about ten times (JSON at zlib level 1); one inflating far more is not castcore's, and
# inflating it whole would cost gigabytes before it is discarded.
INFLATION = 100
MOST_BYTES = 512 * 2**20


def _inflate(data: bytes) -> bytes:
    """``data`` decompressed, stopping as soon as it passes its bound; StoredError past it."""
    limit = min(MOST_BYTES, INFLATION * len(data) + 2**20)
    inflater = zlib.decompressobj()
    plain = inflater.decompress(data, limit)
    if inflater.unconsumed_tail or len(plain) >= limit:
        raise StoredError(f"it inflates past {limit / 2**20:,.0f} MiB")
    if not inflater.eof:
        raise StoredError("cut short: its compressed stream ends early")
    return plain


def _loads(data: bytes) -> dict[str, Any]:
    try:
        plain = json.loads(_inflate(data))
        stored = plain.pop("capture")
        entry = {k: _decode(v) for k, v in plain.items()}
        entry["capture"] = Capture(
            invokes=[
                OpInvoke(
                    op=_decode(op),
                    args=_decode(args),
                    kwargs=_decode(kwargs),
                    out=_decode(out),
                    module=module,
                    index=index,
                    attrs=_decode(attrs),
                )
                for op, args, kwargs, out, module, index, attrs in stored["invokes"]
            ],
            weight_storages=dict(stored["weights"]),
            input_storages=dict(stored["inputs"]),
            output_storages=set(stored["outputs"]),
            state_storages=dict(stored["state"]),
        )
    except StoredError:
        raise
    except RecursionError:
        raise StoredError("not a stored capture: nested too deep") from None
    except (zlib.error, UnicodeDecodeError, ValueError, TypeError, KeyError, AttributeError) as exc:
        raise StoredError(f"not a stored capture ({type(exc).__name__}: {exc})") from None
    return entry
