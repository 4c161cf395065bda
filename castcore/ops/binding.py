"""Fitting a dimension annotation to an actual call: each name's length, and the outputs' shapes."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from castcore.ops.annotations import (
    FROZEN,
    SPATIAL,
    Atom,
    Dim,
    OpAnnotation,
    parse,
)


@dataclass(slots=True)
class Binding:
    """An annotation fitted to inputs: every dim's length and each tensor's dim names."""

    annotation: OpAnnotation
    sizes: dict[str, int]  # name -> length (also '*0', '*1', ... for '*')
    inputs: list[list[tuple[str, ...]] | None]  # per input: per dim, the names it is made of
    outputs: list[list[tuple[str, ...]]]
    input_shapes: list[tuple[int, ...] | None]
    output_shapes: list[tuple[int, ...]]
    marks: dict[str, str]  # name -> '', '+', '^'

    def shape_of(
        self, dims: list[tuple[str, ...]], sizes: Mapping[str, int] | None = None
    ) -> tuple[int, ...]:
        sizes = self.sizes if sizes is None else sizes
        # A number in an annotation (``8 d``) is its own length, whatever the inputs were.
        return tuple(math.prod(int(n) if n.isdigit() else sizes[n] for n in names) for names in dims)

    def input_like(self, output: int) -> int | None:
        """The first tensor input annotated exactly like output ``output``: the input it may be, returned
        changed in place (its dtype is the output's)."""
        text = str(self.annotation.outputs[output])
        return next(
            (
                i
                for i, shape in enumerate(self.annotation.inputs)
                if not shape.replicated and str(shape) == text
            ),
            None,
        )


def resolve(
    annotation: str | Callable | OpAnnotation,
    args: Sequence[Any],
    kwargs: Mapping[str, Any] | None = None,
    names: Sequence[str] = (),
) -> OpAnnotation:
    """The OpAnnotation for one call: a callable annotation is called with the inputs first."""
    if isinstance(annotation, OpAnnotation):
        return annotation
    if callable(annotation):
        annotation = annotation(*args, **(kwargs or {}))
    return parse(annotation)


def bind(
    annotation: OpAnnotation,
    args: Sequence[Any],
    kwargs: Mapping[str, Any] | None = None,
    allow_replicated_outputs: bool = False,
) -> Binding:
    """Fit ``annotation`` to the call's arguments and infer every output shape.

    ``args`` are the leading positional arguments the input shapes describe (tensors, or anything
    with a ``shape``); ``kwargs`` are the remaining named arguments, whose integer values give the
    lengths of same-named hidden dims.
    """
    kwargs = dict(kwargs or {})
    if len(args) < len(annotation.inputs):
        missing = annotation.inputs[len(args)]
        raise annotation.error(
            f"the annotation describes {len(annotation.inputs)} inputs but the call has "
            f"{len(args)} positional arguments",
            missing.pos,
        )
    sizes: dict[str, int] = {}
    origin: dict[str, int] = {}  # name -> annotation position that fixed it, for messages
    for name, value in kwargs.items():
        if isinstance(value, int) and not isinstance(value, bool):
            sizes[name] = int(value)
            origin[name] = -1
    star: tuple[int, ...] | None = None
    brackets: list[tuple[Dim, int]] = []
    input_dims: list[list[tuple[str, ...]] | None] = []
    input_shapes: list[tuple[int, ...] | None] = []

    def set_size(atom: Atom, value: int) -> None:
        if atom.numeric:
            if int(atom.name) != value:
                raise annotation.error(f"dim is fixed at {atom.name} but the tensor's is {value}", atom.pos)
            return
        known = sizes.get(atom.name)
        if known is None:
            sizes[atom.name], origin[atom.name] = value, atom.pos
        elif known != value:
            where = "its same-named argument" if origin[atom.name] == -1 else "an earlier use"
            raise annotation.error(f"'{atom.name}' is {value} here but {known} in {where}", atom.pos)

    for index, shape in enumerate(annotation.inputs):
        value = args[index]
        if shape.replicated:
            input_dims.append(None)
            input_shapes.append(None)
            continue
        tensor_shape = _shape_of(value)
        if tensor_shape is None:
            kind = "None" if value is None else type(value).__name__
            raise annotation.error(f"input {index} is {kind}, not a tensor: annotate it '?'", shape.pos)
        fixed = [d for d in shape.dims if not (len(d.atoms) == 1 and d.atoms[0].dynamic)]
        has_star = len(fixed) != len(shape.dims)
        if (len(tensor_shape) < len(fixed)) or (not has_star and len(tensor_shape) != len(fixed)):
            raise annotation.error(
                f"input {index} has {len(tensor_shape)} dims {list(tensor_shape)} but its "
                f"annotation {'at least ' if has_star else ''}{len(fixed)}",
                shape.pos,
            )
        dims_of_input: list[tuple[str, ...]] = []
        cursor = 0
        for dim in shape.dims:
            if len(dim.atoms) == 1 and dim.atoms[0].dynamic:
                count = len(tensor_shape) - len(fixed)
                got = tuple(tensor_shape[cursor : cursor + count])
                if star is None:
                    star = got
                elif star != got:
                    raise annotation.error(
                        f"'*' is {list(got)} here but {list(star)} in an earlier input", dim.pos
                    )
                dims_of_input += [(f"*{k}",) for k in range(count)]
                cursor += count
                continue
            length = tensor_shape[cursor]
            cursor += 1
            dims_of_input.append(tuple(a.name for a in dim.atoms))
            if dim.bracketed and len(dim.atoms) > 1:
                brackets.append((dim, length))
            else:
                set_size(dim.atoms[0], length)
        input_dims.append(dims_of_input)
        input_shapes.append(tuple(tensor_shape))

    for k, length in enumerate(star or ()):
        sizes[f"*{k}"] = length
    for dim, length in brackets:  # numeric hidden dims are already known
        for atom in dim.atoms:
            if atom.numeric:
                sizes[atom.name] = int(atom.name)
    pending = list(brackets)
    while pending:
        progress = False
        for dim, length in list(pending):
            unknown = [a for a in dim.atoms if a.name not in sizes]
            known = math.prod(sizes[a.name] for a in dim.atoms if a.name in sizes)
            if len(unknown) > 1:
                continue
            pending.remove((dim, length))
            progress = True
            if not unknown:
                if known != length:
                    raise annotation.error(
                        f"hidden dims {dim} multiply to {known} but the tensor's dim is {length}", dim.pos
                    )
                continue
            if known == 0 or length % known:
                raise annotation.error(
                    f"dim of length {length} cannot be split as {dim} with the other "
                    f"hidden dims multiplying to {known}",
                    unknown[0].pos,
                )
            sizes[unknown[0].name], origin[unknown[0].name] = length // known, unknown[0].pos
        if not progress:
            dim, _ = pending[0]
            names = " or ".join(a.name for a in dim.atoms if a.name not in sizes)
            raise annotation.error(
                f"cannot infer the hidden dims of {dim}: pass an argument named {names} with its length",
                dim.pos,
            )

    output_dims: list[list[tuple[str, ...]]] = []
    output_shapes: list[tuple[int, ...]] = []
    for shape in annotation.outputs:
        if shape.replicated:
            if allow_replicated_outputs:
                output_dims.append([])
                output_shapes.append(())
                continue
            raise annotation.error(
                "castcore infers each output's shape from its dims; a '?' output has none "
                "(annotate its dims)",
                shape.pos,
            )
        dims_of_output: list[tuple[str, ...]] = []
        for dim in shape.dims:
            if len(dim.atoms) == 1 and dim.atoms[0].dynamic:
                dims_of_output += [(f"*{k}",) for k in range(len(star or ()))]
                continue
            for atom in dim.atoms:
                if atom.numeric:
                    sizes.setdefault(atom.name, int(atom.name))
                elif atom.name not in sizes:  # only possible for names the inputs bind nowhere
                    raise annotation.error(f"cannot infer the length of '{atom.name}'", atom.pos)
            dims_of_output.append(tuple(a.name for a in dim.atoms))
        output_dims.append(dims_of_output)
        output_shapes.append(tuple(math.prod(sizes[n] for n in names) for names in dims_of_output))

    marks = {name: mark for name, mark in annotation.marks().items()}
    for k in range(len(star or ())):
        marks[f"*{k}"] = SPATIAL
    for shape in annotation.inputs + annotation.outputs:
        for atom in shape.atoms():
            if atom.numeric:
                marks[atom.name] = FROZEN
    return Binding(annotation, sizes, input_dims, output_dims, input_shapes, output_shapes, marks)


def _shape_of(value: Any) -> tuple[int, ...] | None:
    shape = getattr(value, "shape", None)
    if shape is None or isinstance(value, type):
        return None
    try:
        return tuple(int(s) for s in shape)
    except TypeError:
        return None
