"""``castcore.register_op``: a plain function becomes a torch custom op whose fake impl is its annotation.

The op traces under ``castcore.capture`` as one opaque call (no hand-written ``register_fake``),
and the registry keeps the annotation so ``castcore.partition`` and ``castcore measure`` can use it.
"""

from __future__ import annotations

import functools
import inspect
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from castcore.ops.annotations import AnnotationError, OpAnnotation, parse
from castcore.ops.binding import bind, resolve
from castcore.recording.recorder import CaptureError

DEFAULT_NAMESPACE = "castcore_user"

_REGISTRY: dict[str, RegisteredOp] = {}        # "ns::name" -> record
_BY_OVERLOAD: dict[Any, RegisteredOp] = {}      # OpOverload -> record
_LIBRARIES: dict[str, torch.library.Library] = {}
_LOCK = threading.Lock()


class AnnotationCaptureError(AnnotationError, CaptureError):
    """An annotation that does not fit the inputs, met while capturing: passes through the capture intact."""


@dataclass(eq=False)
class RegisteredOp:
    """One registered function: its torch op, its annotation and how castcore calls it."""

    qualname: str                              # "ns::name"
    fn: Callable                               # what runs for real
    annotation: str | Callable                 # as given
    parsed: OpAnnotation | None                # None when the annotation is a callable of the inputs
    params: list[str]                          # parameter names, in order
    defaults: dict[str, Any]
    input_gen_fn: Callable | None = None
    mutates: tuple[str, ...] = ()
    overloads: dict[tuple, Any] = field(default_factory=dict)   # argument types -> OpOverload
    wrapper: Callable | None = None

    @property
    def namespace(self) -> str:
        return self.qualname.split("::")[0]

    @property
    def name(self) -> str:
        return self.qualname.split("::")[1]

    def annotation_for(self, args: Sequence[Any], kwargs: dict[str, Any] | None = None) -> OpAnnotation:
        """The parsed annotation for one call (a callable annotation is called with the inputs)."""
        try:
            return self.parsed or resolve(self.annotation, args, kwargs)
        except AnnotationError as exc:
            raise exc.for_op(self.qualname) from None

    def bind_all(self, args: Sequence[Any], kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
        kwargs = dict(kwargs or {})
        if len(args) > len(self.params):
            raise TypeError(f"{self.qualname} takes {len(self.params)} arguments but {len(args)} were given")
        bound = dict(zip(self.params, args))
        for name, value in kwargs.items():
            if name not in self.params:
                raise TypeError(f"{self.qualname} got an unexpected argument {name!r}")
            if name in bound:
                raise TypeError(f"{self.qualname} got multiple values for argument {name!r}")
            bound[name] = value
        for name in self.params:
            if name not in bound:
                if name not in self.defaults:
                    raise TypeError(f"{self.qualname} is missing argument {name!r}")
                bound[name] = self.defaults[name]
        return bound

    def output_shapes(self, *args: Any, **kwargs: Any) -> list[tuple[int, ...]]:
        """The shapes the annotation gives for a call with these arguments (tensors, or anything with .shape)."""
        return self.fit(args, kwargs).output_shapes

    def fit(self, args: Sequence[Any], kwargs: dict[str, Any] | None = None):
        """The annotation fitted to one call's arguments (a Binding), errors naming this op."""
        bound = self.bind_all(args, kwargs)
        values = [bound[p] for p in self.params]
        annotation = self.annotation_for(values, {})
        count = len(annotation.inputs)
        try:
            return bind(annotation, values[:count], dict(zip(self.params[count:], values[count:])))
        except AnnotationError as exc:
            raise exc.for_op(self.qualname) from None

    def overload(self, values: Sequence[Any]) -> Any:
        """The OpOverload for arguments of these types, defined on first use."""
        types = tuple(_schema_type(v, p, self.qualname) for v, p in zip(values, self.params))
        with _LOCK:
            if types not in self.overloads:
                self.overloads[types] = _define(self, types, values)
            return self.overloads[types]

    @property
    def default_overload(self) -> Any | None:
        return next(iter(self.overloads.values()), None)


def register_op(annotation: str | Callable, name: str | None = None, input_gen_fn: Callable | None = None,
                *, mutates: Sequence[str] = ()) -> Callable:
    """Register ``fn`` as a torch custom op described by a dimension ``annotation``.

    Use as ``@castcore.register_op("m k+, k+ n -> m n")`` or ``castcore.register_op(anno)(fn)``, on
    a module-level function, a ``torch.autograd.Function`` class (its ``apply`` is registered) or a
    ``torch.compile``d function. ``name`` is ``"op"`` (namespace ``castcore_user``) or ``"ns::op"``;
    by default the function's name. ``input_gen_fn(invoke) -> args | (args, kwargs)`` builds real
    inputs when castcore measures the op. ``mutates`` names arguments the function changes in place
    (it must also return them, as nnScaler requires). Returns a function that calls the op.
    """
    if isinstance(annotation, str):
        parsed = parse(annotation)
        for shape in parsed.outputs:
            if shape.replicated:
                raise AnnotationError("castcore infers each output's shape from its dims; a '?' output has none "
                                      "(annotate its dims)", annotation, shape.pos)
    elif callable(annotation):
        parsed = None
    else:
        raise TypeError(f"register_op takes an annotation string or a function returning one, not "
                        f"{type(annotation).__name__}")

    def decorate(target: Callable) -> Callable:
        fn, params, defaults, default_name = _callable_of(target)
        qualname = _qualname(name or default_name)
        unknown = [m for m in mutates if m not in params]
        if unknown:
            raise ValueError(f"register_op({qualname!r}): mutates names {unknown}, which are not parameters "
                             f"of {default_name} ({', '.join(params)})")
        if parsed is not None and len(parsed.inputs) > len(params):
            extra = parsed.inputs[len(params)]
            raise AnnotationError(f"{default_name} has {len(params)} parameters but the annotation describes "
                                  f"{len(parsed.inputs)} inputs", annotation, extra.pos, qualname)
        record = RegisteredOp(qualname, fn, annotation, parsed, params, defaults, input_gen_fn, tuple(mutates))
        with _LOCK:
            old = _REGISTRY.get(qualname)
            if old is not None and not _same_function(old.fn, fn):
                raise ValueError(f"register_op: {qualname} is already registered for "
                                 f"{getattr(old.fn, '__module__', '?')}.{getattr(old.fn, '__qualname__', old.fn)}; "
                                 f"pass name='...' to choose another name")
            if old is not None:  # the same function registered again (a re-import): keep the ops
                record.overloads = old.overloads
                for op in record.overloads.values():
                    _BY_OVERLOAD[op] = record
            _REGISTRY[qualname] = record

        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            bound = record.bind_all(args, kwargs)
            values = [bound[p] for p in record.params]
            return record.overload(values)(*values)

        call.__castcore_op__ = record  # type: ignore[attr-defined]
        call.apply = call  # type: ignore[attr-defined]  # so MyFunction.apply(...) keeps working
        record.wrapper = call
        return call

    return decorate


def registered_ops() -> dict[str, RegisteredOp]:
    """Every registered op by qualified name ("ns::name")."""
    return dict(_REGISTRY)


def lookup(target: Any) -> RegisteredOp:
    """The record of a registered op from its wrapper, OpOverload, OpOverloadPacket, record or "ns::name"."""
    if isinstance(target, RegisteredOp):
        return target
    record = getattr(target, "__castcore_op__", None)
    if record is not None:
        return record
    if isinstance(target, str):
        key = target if "::" in target else f"{DEFAULT_NAMESPACE}::{target}"
        key = key.split(".")[0]
        if key in _REGISTRY:
            return _REGISTRY[key]
        raise KeyError(f"no op {target!r} is registered with castcore.register_op; registered: "
                       f"{', '.join(_REGISTRY) or 'none'}")
    if target in _BY_OVERLOAD:
        return _BY_OVERLOAD[target]
    schema = getattr(target, "_schema", None)
    qualname = getattr(target, "_qualified_op_name", None) or (schema.name if schema is not None else None)
    if qualname in _REGISTRY:
        return _REGISTRY[qualname]
    raise KeyError(f"{target!r} was not registered with castcore.register_op")


# ---------------------------------------------------------------------------------------------

def _callable_of(target: Any) -> tuple[Callable, list[str], dict[str, Any], str]:
    """What to run, its parameter names and defaults, and a default op name."""
    if isinstance(target, type) and issubclass(target, torch.autograd.Function):
        sig = inspect.signature(target.forward)
        params = list(sig.parameters.values())[1:]  # drop ctx
        fn, label = target.apply, target.__name__
    elif callable(target):
        inner = getattr(target, "_torchdynamo_orig_callable", None) or target  # torch.compile
        fn, label = target, getattr(inner, "__name__", None) or type(inner).__name__
        try:
            sig = inspect.signature(inner)
        except (TypeError, ValueError):
            raise TypeError(f"register_op cannot read the parameters of {target!r}") from None
        params = list(sig.parameters.values())
    else:
        raise TypeError(f"register_op registers a function, a torch.autograd.Function or a torch.compile'd "
                        f"function, not {type(target).__name__}")
    names, defaults = [], {}
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise TypeError(f"register_op: {label} takes *{p.name}; name every parameter so the op has a "
                            "fixed signature")
        names.append(p.name)
        if p.default is not p.empty:
            defaults[p.name] = p.default
    return fn, names, defaults, label


def _qualname(name: str) -> str:
    ns, _, op = name.rpartition("::")
    ns = ns or DEFAULT_NAMESPACE
    for part in (ns, op):
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", part):
            raise ValueError(f"register_op: {name!r} is not a valid op name; use 'op' or 'namespace::op' "
                             "(letters, digits, underscores)")
    return f"{ns}::{op}"


def _same_function(a: Callable, b: Callable) -> bool:
    key = lambda f: (getattr(f, "__module__", None), getattr(f, "__qualname__", None))  # noqa: E731
    return a is b or key(a) == key(b)


def _schema_type(value: Any, param: str, qualname: str) -> str:
    if isinstance(value, torch.Tensor):
        return "Tensor"
    if value is None:
        return "Tensor?"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "SymInt"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "str"
    if isinstance(value, torch.dtype):
        return "ScalarType"
    if isinstance(value, (list, tuple)) and value:
        kinds = {_schema_type(v, param, qualname) for v in value}
        if len(kinds) == 1 and (kind := kinds.pop()) in ("Tensor", "SymInt", "float", "bool"):
            return f"{kind}[]"
    if isinstance(value, (list, tuple)) and not value:
        return "SymInt[]"
    raise TypeError(f"{qualname}: argument {param!r} is a {type(value).__name__}; a torch op takes tensors, "
                    "numbers, strings, dtypes, None and lists of these")


def _define(record: RegisteredOp, types: tuple[str, ...], values: Sequence[Any]) -> Any:
    """Define one overload of the op with a fake impl computed from the annotation."""
    ns, name = record.namespace, record.name
    overload = "default" if not record.overloads else f"v{len(record.overloads) + 1}"
    lib = _LIBRARIES.get(ns)
    if lib is None:
        lib = _LIBRARIES[ns] = torch.library.Library(ns, "FRAGMENT")  # noqa: TOR901 - kept alive here
    annotation = record.annotation_for(list(values), {})
    outputs = len(annotation.outputs)
    args = []
    for param, kind in zip(record.params, types):
        if param in record.mutates and kind.startswith("Tensor"):
            kind = kind.replace("Tensor", f"Tensor({chr(ord('a') + record.mutates.index(param))}!)", 1)
        args.append(f"{kind} {param}")
    returns = "Tensor" if outputs == 1 else "(" + ", ".join(["Tensor"] * outputs) + ")"
    decl = f"{name}{'' if overload == 'default' else '.' + overload}({', '.join(args)}) -> {returns}"
    try:
        lib.define(decl)
    except RuntimeError as exc:
        raise ValueError(f"register_op: torch refused the schema {ns}::{decl}: {str(exc).splitlines()[0]}") from None
    qual = f"{ns}::{name}" + ("" if overload == "default" else f".{overload}")

    def real(*args: Any) -> Any:
        result = record.fn(*args)
        results = list(result) if isinstance(result, (tuple, list)) else [result]
        fitted = record.fit(args)
        if len(results) != outputs:
            raise AnnotationError(f"{record.qualname} returned {len(results)} values but its annotation has "
                                  f"{outputs} outputs", fitted.annotation.text, fitted.annotation.outputs[0].pos,
                                  record.qualname)
        fixed = []
        for index, (out, expected) in enumerate(zip(results, fitted.output_shapes)):
            if not isinstance(out, torch.Tensor) or tuple(out.shape) != expected:
                got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
                raise AnnotationError(f"output {index} is {got} but the annotation gives {expected}",
                                      fitted.annotation.text, fitted.annotation.outputs[index].pos, record.qualname)
            # A custom op may not return its inputs: a changed input comes back as a copy.
            fixed.append(out.clone() if any(out is a for a in args) else out)
        return fixed[0] if outputs == 1 else tuple(fixed)

    def fake(*args: Any) -> Any:
        try:
            fitted = record.fit(args)
        except AnnotationError as exc:
            raise AnnotationCaptureError(exc.reason, exc.annotation, exc.position, exc.op) from None
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        floats = [t.dtype for t in tensors if t.dtype.is_floating_point]
        default_dtype = functools.reduce(torch.promote_types, floats) if floats else tensors[0].dtype
        texts = [str(s) for s in fitted.annotation.inputs]
        outs = []
        for shape_anno, shape in zip(fitted.annotation.outputs, fitted.output_shapes):
            same = texts.index(str(shape_anno)) if str(shape_anno) in texts else None  # e.g. an in-place result
            source = args[same] if same is not None and isinstance(args[same], torch.Tensor) else None
            dtype = source.dtype if source is not None else default_dtype
            outs.append(tensors[0].new_empty(shape, dtype=dtype))
        return outs[0] if outputs == 1 else tuple(outs)

    lib.impl(qual.split("::")[1], real, "CompositeExplicitAutograd")
    torch.library.register_fake(qual, fake, lib=lib)
    packet = getattr(getattr(torch.ops, ns), name)
    op = getattr(packet, overload)
    _BY_OVERLOAD[op] = record
    return op

