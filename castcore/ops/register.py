"""``castcore.register_op``: a plain function becomes a torch custom op whose fake impl is its annotation.

The op traces under ``castcore.capture`` as one opaque call (no hand-written ``register_fake``),
its backward as one more op (``<name>_backward``), and the registry keeps the annotation so
``castcore.partition`` and ``castcore measure`` can use it.
"""

from __future__ import annotations

import ast
import functools
import inspect
import itertools
import re
import sys
import textwrap
import threading
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from castcore.ops.annotations import parse
from castcore.ops.kernels import declared_type, define, fits, value_type
from castcore.ops.record import RegisteredOp

DEFAULT_NAMESPACE = "castcore_user"

_REGISTRY: dict[str, RegisteredOp] = {}  # "ns::name" -> record
_BY_ORIGIN: dict[tuple, RegisteredOp] = {}  # (file, line, qualified name) of what was registered -> record
_BY_OVERLOAD: dict[Any, RegisteredOp] = {}  # OpOverload -> record
_LOCK = threading.Lock()


def register_op(
    annotation: str | Callable[..., str],
    name: str | None = None,
    input_gen_fn: Callable | None = None,
    *,
    mutates: Sequence[str] = (),
) -> Callable:
    """Register ``fn`` as a torch custom op described by a dimension ``annotation``.

    Use as ``@castcore.register_op("m k+, k+ n -> m n")`` or ``castcore.register_op(anno)(fn)``, on
    a module-level function, a ``torch.autograd.Function`` (or its ``apply``) or a ``torch.compile``d
    function. The op exists as ``torch.ops.<ns>.<name>`` once this returns. ``name`` is ``"op"``
    (namespace ``castcore_user``) or ``"ns::op"``; by default the function's name (prefixed with its
    file's if another function has it). ``input_gen_fn(node)`` builds real inputs when castcore
    measures the op. ``mutates`` names arguments the function changes in place and returns.

    Returns a function calling the op; an autograd Function comes back itself, its ``apply`` now the
    op. The name ``fn`` in the registering module and in ``fn``'s own module, where it still refers
    to ``fn``, is pointed at the op too, so the form that ignores the result works.
    """
    if isinstance(annotation, str):
        parsed = parse(annotation)
    elif callable(annotation):
        parsed = None
    else:
        raise TypeError(
            f"register_op takes an annotation string or a function returning one, not "
            f"{type(annotation).__name__}"
        )

    def decorate(target: Callable) -> Callable:
        if getattr(getattr(target, "__castcore_op__", None), "wrapper", None) is target:
            return target  # already the op (MyFunction.apply once MyFunction is registered)
        function_class, fn, plain, signature_of, label, origin = _target_parts(target)
        params, defaults, hints = _parameters(signature_of, label, skip=int(_takes_ctx(function_class)))
        unknown = [m for m in mutates if m not in params]
        if unknown:
            raise ValueError(
                f"register_op({name or label!r}): mutates names {unknown}, which are not parameters "
                f"of {label} ({', '.join(params)})"
            )
        if parsed is not None and len(parsed.inputs) > len(params):
            extra = parsed.inputs[len(params)]
            raise parsed.error(
                f"{label} has {len(params)} parameters but the annotation describes "
                f"{len(parsed.inputs)} inputs",
                extra.pos,
            ).for_op(name or label)
        with _LOCK:
            record = _BY_ORIGIN.get(origin)
            if record is not None and (name is None or _qualname(name) == record.qualname):
                # The same function registered again (a re-import, another session loading its file).
                record.fn, record.plain, record.annotation, record.parsed = fn, plain, annotation, parsed
                record.input_gen_fn = input_gen_fn
            else:
                record = RegisteredOp(
                    _free_name(name, label, origin),
                    fn,
                    annotation,
                    parsed,
                    params,
                    defaults,
                    input_gen_fn,
                    tuple(mutates) or _changed_and_returned(plain, params),
                    plain=plain,
                    origin=origin,
                )
                _new_overload(record, tuple(declared_type(record, p, hints) for p in params))
                _REGISTRY[record.qualname] = _BY_ORIGIN[origin] = record

        @functools.wraps(plain)
        def call(*args: Any, **kwargs: Any) -> Any:
            bound = record.bind_all(args, kwargs)
            values = [bound[p] for p in record.params]
            return overload_for(record, values)(*values)

        call.apply = record.wrapper = call  # type: ignore[attr-defined]  # so MyFunction.apply(...) keeps working
        call.__castcore_op__ = record  # type: ignore[attr-defined]
        if function_class is not None:  # later MyFunction.apply(...) calls are the op
            setattr(function_class, "apply", staticmethod(call))  # the Function's own classmethod, replaced
            _mark(function_class, record)
            return function_class if target is function_class else call
        _mark(target, record)
        home = sys.modules.get(getattr(target, "__module__", None) or "")
        for namespace in (sys._getframe(1).f_globals, getattr(home, "__dict__", {})):
            if namespace.get(label) is target:  # register_op(anno)(fn) without assigning: fn is now the op
                namespace[label] = call
        return call

    return decorate


def overload_for(record: RegisteredOp, values: Sequence[Any]) -> Any:
    """The first OpOverload of ``record`` whose schema takes these arguments; one typed from them is defined if
    none does."""
    with _LOCK:
        for kinds, op in record.overloads.items():
            if all(fits(v, k) for v, k in zip(values, kinds)):
                return op
        return _new_overload(
            record, tuple(value_type(v, p, record.qualname) for v, p in zip(values, record.params))
        )


def lookup(target: Any) -> RegisteredOp:
    """The record of a registered op from its function (as returned or as registered), OpOverload,
    OpOverloadPacket, record or "ns::name"."""
    if isinstance(target, RegisteredOp):
        return target
    record = getattr(target, "__castcore_op__", None)
    if isinstance(record, RegisteredOp):
        return record
    if isinstance(target, str):
        key = target if "::" in target else f"{DEFAULT_NAMESPACE}::{target}"
        key = key.split(".")[0]
        if key in _REGISTRY:
            return _REGISTRY[key]
        raise KeyError(
            f"no op {target!r} is registered with castcore.register_op; registered: "
            f"{', '.join(_REGISTRY) or 'none'}"
        )
    if target in _BY_OVERLOAD:
        return _BY_OVERLOAD[target]
    schema = getattr(target, "_schema", None)
    qualname = getattr(target, "_qualified_op_name", None) or (schema.name if schema is not None else None)
    if qualname in _REGISTRY:
        return _REGISTRY[qualname]
    raise KeyError(f"{target!r} was not registered with castcore.register_op")


# ---------------------------------------------------------------------------------------------
# What was registered


def _target_parts(
    target: Any,
) -> tuple[type[torch.autograd.Function] | None, Callable, Callable, Callable, str, tuple]:
    """(autograd Function class or None, what runs, what runs on fakes, whose signature, label, origin)."""
    owner = getattr(target, "__self__", None)
    if isinstance(owner, type) and issubclass(owner, torch.autograd.Function) and target.__name__ == "apply":
        target = owner  # register_op(anno)(MyFunction.apply) registers MyFunction
    if isinstance(target, type) and issubclass(target, torch.autograd.Function):
        record = getattr(target, "__castcore_op__", None)  # registered before: its apply is already the op
        apply = record.fn if isinstance(record, RegisteredOp) else target.apply
        return target, apply, apply, target.forward, target.__name__, _origin(target.forward, target)
    if not callable(target):
        raise TypeError(
            f"register_op registers a function, a torch.autograd.Function or a torch.compile'd "
            f"function, not {type(target).__name__}"
        )
    inner = getattr(target, "_torchdynamo_orig_callable", None) or target  # torch.compile
    label = getattr(inner, "__name__", None) or type(inner).__name__
    return None, target, inner, inner, label, _origin(inner, inner)


def _origin(code_of: Any, named: Any) -> tuple:
    """Where the registered thing is written: its file and qualified name (a module name changes when a
    custom-op file is loaded again; the file does not)."""
    code = getattr(code_of, "__code__", None)
    place = (
        (code.co_filename, code.co_firstlineno)
        if code is not None
        else (getattr(named, "__module__", None), 0)
    )
    return *place, getattr(named, "__qualname__", None) or repr(named)


def _takes_ctx(function_class: type[torch.autograd.Function] | None) -> bool:
    """An autograd Function's forward takes ctx first unless it defines setup_context."""
    return (
        function_class is not None and function_class.setup_context is torch.autograd.Function.setup_context
    )


def _parameters(fn: Callable, label: str, skip: int) -> tuple[list[str], dict[str, Any], dict[str, Any]]:
    try:
        params = list(inspect.signature(fn).parameters.values())[skip:]
    except (TypeError, ValueError):
        raise TypeError(f"register_op cannot read the parameters of {label}") from None
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # a hint naming something not importable here: castcore types from the values instead
        hints = {}
    names, defaults = [], {}
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise TypeError(
                f"register_op: {label} takes *{p.name}; name every parameter so the op has a fixed signature"
            )
        names.append(p.name)
        if p.default is not p.empty:
            defaults[p.name] = p.default
    return names, defaults, hints


def _changed_and_returned(fn: Callable, params: list[str]) -> tuple[str, ...]:
    """Parameters ``fn`` changes in place (``x.add_(y)``, ``x[i] = v``, ``x.copy_(y)``) and returns as they are,
    as nnScaler's guide asks of an in-place op: they are the op's mutated arguments (``Tensor(a!)``), as if named
    in ``mutates``. Read from the source; none when it cannot be read."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return ()
    changed, returned, rebound = set(), set(), set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr.endswith("_")
            and not node.func.attr.startswith("_")
            and isinstance(node.func.value, ast.Name)
        ):
            changed.add(node.func.value.id)
        elif isinstance(node, (ast.Assign, ast.AugAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name):
                    changed.add(target.value.id)
                elif isinstance(target, ast.Name) and isinstance(node, ast.Assign):
                    rebound.add(target.id)  # no longer the argument it was
        elif isinstance(node, ast.Return) and node.value is not None:
            values = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
            returned |= {v.id for v in values if isinstance(v, ast.Name)}
    return tuple(p for p in params if p in changed and p in returned and p not in rebound)


def _mark(target: Any, record: RegisteredOp) -> None:
    """Let lookup() find the op from the function as registered too."""
    try:
        target.__castcore_op__ = record
    except (AttributeError, TypeError):
        pass


def _qualname(name: str) -> str:
    ns, _, op = name.rpartition("::")
    ns = ns or DEFAULT_NAMESPACE
    for part in (ns, op):
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", part):
            raise ValueError(
                f"register_op: {name!r} is not a valid op name; use 'op' or 'namespace::op' "
                "(letters, digits, underscores)"
            )
    return f"{ns}::{op}"


def _free_name(name: str | None, label: str, origin: tuple) -> str:
    """The op's name: ``name``; else the function's, or (taken by another function) its file's name and
    the function's, numbered from 2 if that is taken too."""
    if name is None:
        stem = re.sub(r"\W|^(?=\d)", "_", Path(str(origin[0])).stem)
        names = itertools.chain(
            [label, f"{stem}_{label}"], (f"{stem}_{label}_{n}" for n in itertools.count(2))
        )
        return next(q for q in map(_qualname, names) if q not in _REGISTRY)
    qualname = _qualname(name)
    if qualname in _REGISTRY:
        old = _REGISTRY[qualname]
        raise ValueError(
            f"register_op: {qualname} is already registered for {old.origin[2]} ({old.origin[0]}); "
            f"pass name='...' to choose another name"
        )
    return qualname


def _new_overload(record: RegisteredOp, kinds: tuple[str, ...]) -> Any:
    op = record.overloads[kinds] = define(record, kinds)
    _BY_OVERLOAD[op] = record
    return op
