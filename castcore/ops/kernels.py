"""The torch side of a ``castcore.register_op`` op: schema types, the real and fake kernels, the backward op.

The fake kernel builds outputs from the annotation; it runs the function itself (on stand-ins, not
recorded) only to learn values the annotation cannot give: its '?' outputs, and whether an output
annotated exactly like an input is that input returned (an in-place op).
"""

from __future__ import annotations

import collections.abc
import functools
import types
import typing
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from castcore.ops.annotations import AnnotationError, OpAnnotation
from castcore.recording.recorder import CaptureError

if TYPE_CHECKING:
    from castcore.ops.record import RegisteredOp

_LIBRARIES: dict[str, torch.library.Library] = {}


class AnnotationCaptureError(AnnotationError, CaptureError):
    """An annotation that does not fit the inputs, met while capturing: passes through the capture intact."""


_SCALARS = {int: "Scalar", float: "Scalar", bool: "Scalar", str: "str", torch.dtype: "ScalarType"}


def hint_type(hint: Any) -> str | None:
    """The schema type a parameter's type hint names, if castcore knows it."""
    if isinstance(hint, type):
        return "Tensor" if issubclass(hint, torch.Tensor) else _SCALARS.get(hint)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType) and len(args) == 2 and type(None) in args:
        inner = hint_type(next(a for a in args if a is not type(None)))
        return inner + "?" if inner and not inner.endswith(("?", "]")) else None
    if origin in (list, tuple, collections.abc.Sequence) and args:
        inner = hint_type(args[0])
        return inner + "[]" if inner in ("Tensor", "Scalar") else None
    return None


def declared_type(record: RegisteredOp, param: str, hints: dict[str, Any]) -> str:
    """A parameter's type in the op's first schema, defined at registration: its hint; else a tensor if
    the annotation gives it dims (or gives nothing and it has no default); else its default's type."""
    hinted = hint_type(hints.get(param))
    if hinted:
        return hinted
    index = record.params.index(param)
    parsed = record.parsed
    if parsed is not None and index < len(parsed.inputs) and not parsed.inputs[index].replicated:
        return "Tensor"
    if param in record.defaults:
        return value_type(record.defaults[param], param, record.qualname, strict=False)
    return "Tensor" if parsed is None else "Any"


def value_type(value: Any, param: str, qualname: str, strict: bool = True) -> str:
    if isinstance(value, torch.Tensor):
        return "Tensor"
    if value is None:
        return "Tensor?"
    if type(value) in _SCALARS:
        return _SCALARS[type(value)]
    if isinstance(value, (list, tuple)):
        kinds = {value_type(v, param, qualname, strict) for v in value} or {"Scalar"}
        if len(kinds) == 1 and (kind := kinds.pop()) in ("Tensor", "Scalar"):
            return f"{kind}[]"
    if not strict:
        return "Any"
    raise TypeError(
        f"{qualname}: argument {param!r} is a {type(value).__name__}; a torch op takes tensors, "
        "numbers, strings, dtypes, None and lists of these"
    )


def fits(value: Any, kind: str) -> bool:
    if value is None:
        return kind.endswith("?") or kind == "Any"
    try:
        actual = value_type(value, "", "")
    except TypeError:
        return False
    # Any takes plain values; a tensor there would be hidden from autograd, a dtype turned into a number.
    return actual in ("Scalar", "str", "Scalar[]") if kind == "Any" else actual == kind.rstrip("?")


def define(record: RegisteredOp, kinds: tuple[str, ...]) -> Any:
    """Define one overload of the op, with a fake impl computed from the annotation and, unless it
    mutates an input, a backward op."""
    ns, name = record.namespace, record.name
    overload = "default" if not record.overloads else f"v{len(record.overloads) + 1}"
    suffix = "" if overload == "default" else f".{overload}"
    lib = _LIBRARIES.get(ns)
    if lib is None:
        lib = _LIBRARIES[ns] = torch.library.Library(ns, "FRAGMENT")  # noqa: TOR901 - kept alive here
    args = [f"{kind} {param}" for param, kind in zip(record.params, kinds)]
    for slot, param in enumerate(record.mutates):
        index = record.params.index(param)
        args[index] = args[index].replace("Tensor", f"Tensor({chr(ord('a') + slot)}!)", 1)
    parsed = record.parsed
    returns = (
        "Any"
        if parsed is None
        else "(" + ", ".join("Any" if s.replicated else "Tensor" for s in parsed.outputs) + ")"
    )
    _schema(lib, f"{name}{suffix}({', '.join(args)}) -> {returns}", ns)
    qual = f"{ns}::{name}{suffix}"
    if record.mutates and parsed is not None:
        record.aliases[kinds] = _named_aliases(record, parsed)

    def real(*args: Any) -> Any:
        result = record.fn(*args)
        results = list(result) if isinstance(result, (tuple, list)) else [result]
        fitted = record.fit(args)
        outputs = fitted.annotation.outputs
        if len(results) != len(outputs):
            raise AnnotationError(
                f"{record.qualname} returned {len(results)} values but its annotation has "
                f"{len(outputs)} outputs",
                fitted.annotation.text,
                outputs[0].pos,
                record.qualname,
            )
        for index, (out, expected) in enumerate(zip(results, fitted.output_shapes)):
            if outputs[index].replicated:
                continue
            if not isinstance(out, torch.Tensor) or tuple(out.shape) != expected:
                got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
                raise AnnotationError(
                    f"output {index} is {got} but the annotation gives {expected}",
                    fitted.annotation.text,
                    outputs[index].pos,
                    record.qualname,
                )
        record.aliases.setdefault(kinds, _returned_inputs(results, args))
        return results[0] if len(outputs) == 1 else tuple(results)

    def fake(*args: Any) -> Any:
        try:
            fitted = record.fit(args)
        except AnnotationError as exc:
            raise AnnotationCaptureError(exc.reason, exc.annotation, exc.position, exc.op) from None
        outputs = fitted.annotation.outputs
        values: list[Any] = []
        replicated = any(s.replicated for s in outputs)
        could_alias = any(fitted.input_like(k) is not None for k in range(len(outputs)))
        if replicated or (could_alias and kinds not in record.aliases):
            values, found = _run_on_fakes(record, args, required=replicated)
            record.aliases.setdefault(kinds, found)
        aliases = record.aliases.get(kinds, {})
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        floats = [t.dtype for t in tensors if t.dtype.is_floating_point]
        default_dtype = functools.reduce(torch.promote_types, floats) if floats else tensors[0].dtype
        outs = []
        for index, (shape_anno, shape) in enumerate(zip(outputs, fitted.output_shapes)):
            if shape_anno.replicated:
                outs.append(values[index])
            elif index in aliases:
                outs.append(args[aliases[index]])
            else:
                same = fitted.input_like(index)
                outs.append(
                    tensors[0].new_empty(shape, dtype=default_dtype if same is None else args[same].dtype)
                )
        return outs[0] if len(outs) == 1 else tuple(outs)

    lib.impl(qual.split("::")[1], real, "CompositeExplicitAutograd")
    torch.library.register_fake(qual, fake, lib=lib)
    op = getattr(getattr(getattr(torch.ops, ns), name), overload)
    if not record.mutates and "Tensor" in {k.rstrip("?[]") for k in kinds}:  # autograd wants a functional op
        _differentiate(record, lib, qual, ", ".join(args))
    return op


def _schema(lib: torch.library.Library, decl: str, ns: str) -> None:
    try:
        lib.define(decl)
    except RuntimeError as exc:
        raise ValueError(
            f"register_op: torch refused the schema {ns}::{decl}: {str(exc).splitlines()[0]}"
        ) from None


def _named_aliases(record: RegisteredOp, parsed: OpAnnotation) -> dict[int, int]:
    """For ``mutates``: each changed input comes back as the first output annotated exactly like it."""
    found: dict[int, int] = {}
    for param in record.mutates:
        index = record.params.index(param)
        if index < len(parsed.inputs):
            text = str(parsed.inputs[index])
            k = next((k for k, s in enumerate(parsed.outputs) if str(s) == text and k not in found), None)
            if k is not None:
                found[k] = index
    return found


def _returned_inputs(results: Sequence[Any], args: Sequence[Any]) -> dict[int, int]:
    """Output index -> input index for every input returned as an output (an in-place op's result)."""
    return {
        k: j
        for k, out in enumerate(results)
        for j, arg in enumerate(args)
        if isinstance(out, torch.Tensor) and out is arg
    }


def _run_on_fakes(
    record: RegisteredOp, args: Sequence[Any], required: bool
) -> tuple[list[Any], dict[int, int]]:
    """Run the function itself on stand-ins of the fake inputs (not recorded: the capture's mode is not
    active inside a fake impl): the values of its '?' outputs, and which outputs are its inputs."""
    copies = [a.new_empty_strided(a.shape, a.stride()) if isinstance(a, torch.Tensor) else a for a in args]
    try:
        result = record.plain(*copies)
    except Exception as exc:
        if not required:
            return [], {}
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CaptureError(
            f"{record.qualname}: its '?' output is known only by running the function, which failed "
            f"on fake tensors ({reason}); return a value that does not depend on tensor data, or "
            "annotate the output's dims"
        ) from None
    values = list(result) if isinstance(result, (tuple, list)) else [result]
    found = _returned_inputs(values, copies)
    return [args[found[k]] if k in found else v for k, v in enumerate(values)], found


def _differentiate(record: RegisteredOp, lib: torch.library.Library, qual: str, args: str) -> None:
    """Give the overload a backward: one op, ``<name>_backward``, computing the inputs' gradients. Run for
    real, it recomputes the forward with autograd on (so an autograd Function's own backward runs)."""
    name, _, overload = qual.split("::")[1].partition(".")
    backward_name = f"{name}_backward" + (f".{overload}" if overload else "")
    _schema(lib, f"{backward_name}({args}, Tensor?[] grads, bool[] needs) -> Tensor?[]", record.namespace)

    def backward_real(*args: Any) -> list[torch.Tensor | None]:
        *inputs, grads, needs = args
        with torch.enable_grad():
            leaves = [a.detach().requires_grad_() if need else a for a, need in zip(inputs, needs)]
            result = record.fn(*leaves)
            outs = list(result) if isinstance(result, (tuple, list)) else [result]
            pairs = [
                (o, g)
                for o, g in zip(outs, grads)
                if g is not None and isinstance(o, torch.Tensor) and o.requires_grad
            ]
            wanted = [leaf for leaf, need in zip(leaves, needs) if need]
            found = iter(
                torch.autograd.grad([o for o, _ in pairs], wanted, [g for _, g in pairs], allow_unused=True)
                if pairs
                else [None] * len(wanted)
            )
        return [next(found) if need else None for need in needs]

    def backward_fake(*args: Any) -> list[torch.Tensor | None]:
        *inputs, _, needs = args
        return [a.new_empty_strided(a.shape, a.stride()) if need else None for a, need in zip(inputs, needs)]

    lib.impl(backward_name, backward_real, "CompositeExplicitAutograd")
    # its real kernel runs autograd itself
    lib.impl(backward_name, torch.library.fallthrough_kernel, "Autograd")
    torch.library.register_fake(f"{record.namespace}::{backward_name}", backward_fake, lib=lib)
    backward_op = getattr(
        getattr(getattr(torch.ops, record.namespace), f"{name}_backward"), overload or "default"
    )

    def setup_context(ctx, inputs, output):
        ctx.where = [i for i, a in enumerate(inputs) if isinstance(a, torch.Tensor)]
        ctx.others = [None if isinstance(a, torch.Tensor) else a for a in inputs]
        ctx.save_for_backward(*(inputs[i] for i in ctx.where))

    def backward(ctx, *grads):
        inputs = list(ctx.others)
        for i, t in zip(ctx.where, ctx.saved_tensors):
            inputs[i] = t
        grads = [g if isinstance(g, torch.Tensor) else None for g in grads]
        return tuple(backward_op(*inputs, grads, list(ctx.needs_input_grad)))

    torch.library.register_autograd(qual, backward, setup_context=setup_context, lib=lib)
