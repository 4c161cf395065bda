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
    Shape,
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
    annotation: str | Callable[..., str] | OpAnnotation,
    args: Sequence[Any],
    kwargs: Mapping[str, Any] | None = None,
) -> OpAnnotation:
    """The OpAnnotation for one call: a callable annotation is called with the inputs first."""
    if isinstance(annotation, OpAnnotation):
        return annotation
    text = annotation(*args, **(kwargs or {})) if callable(annotation) else annotation
    return parse(text)


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
    if len(args) < len(annotation.inputs):
        missing = annotation.inputs[len(args)]
        raise annotation.error(
            f"the annotation describes {len(annotation.inputs)} inputs but the call has "
            f"{len(args)} positional arguments",
            missing.pos,
        )
    fit = _Fit(annotation, kwargs or {})
    inputs = [fit.input(index, shape, args[index]) for index, shape in enumerate(annotation.inputs)]
    fit.solve_hidden()
    outputs = [fit.output(shape, allow_replicated_outputs) for shape in annotation.outputs]
    return Binding(
        annotation,
        fit.sizes,
        [dims for dims, _ in inputs],
        [dims for dims, _ in outputs],
        [shape for _, shape in inputs],
        [shape for _, shape in outputs],
        fit.marks(),
    )


class _Fit:
    """One call's fit in progress: each name's length and where it was fixed, '*''s dims, hidden dims to solve."""

    def __init__(self, annotation: OpAnnotation, kwargs: Mapping[str, Any]):
        self.annotation = annotation
        self.sizes: dict[str, int] = {}
        self.origin: dict[str, int] = {}  # name -> annotation position that fixed it (-1: an argument)
        self.star: tuple[int, ...] | None = None  # the lengths '*' stands for, once an input has it
        self.brackets: list[tuple[Dim, int]] = []  # hidden dims with their tensor dim's length
        for name, value in kwargs.items():
            if isinstance(value, int) and not isinstance(value, bool):
                self.sizes[name], self.origin[name] = int(value), -1

    def set_size(self, atom: Atom, value: int) -> None:
        """Record ``atom``'s length, or raise if a number or an earlier use says otherwise."""
        if atom.numeric:
            if int(atom.name) != value:
                raise self.annotation.error(
                    f"dim is fixed at {atom.name} but the tensor's is {value}", atom.pos
                )
            return
        known = self.sizes.get(atom.name)
        if known is None:
            self.sizes[atom.name], self.origin[atom.name] = value, atom.pos
        elif known != value:
            where = "its same-named argument" if self.origin[atom.name] == -1 else "an earlier use"
            raise self.annotation.error(f"'{atom.name}' is {value} here but {known} in {where}", atom.pos)

    def input(
        self, index: int, shape: Shape, value: Any
    ) -> tuple[list[tuple[str, ...]] | None, tuple[int, ...] | None]:
        """Fit input ``index`` to its tensor: the names of each of its dims, and its shape (None for '?')."""
        if shape.dims is None:
            return None, None
        tensor_shape = _shape_of(value)
        if tensor_shape is None:
            kind = "None" if value is None else type(value).__name__
            raise self.annotation.error(f"input {index} is {kind}, not a tensor: annotate it '?'", shape.pos)
        fixed = [d for d in shape.dims if not _is_star(d)]
        has_star = len(fixed) != len(shape.dims)
        if (len(tensor_shape) < len(fixed)) or (not has_star and len(tensor_shape) != len(fixed)):
            raise self.annotation.error(
                f"input {index} has {len(tensor_shape)} dims {list(tensor_shape)} but its "
                f"annotation {'at least ' if has_star else ''}{len(fixed)}",
                shape.pos,
            )
        dims: list[tuple[str, ...]] = []
        cursor = 0
        for dim in shape.dims:
            if _is_star(dim):
                count = len(tensor_shape) - len(fixed)
                self.fit_star(dim, tuple(tensor_shape[cursor : cursor + count]))
                dims += _star_names(count)
                cursor += count
                continue
            length = tensor_shape[cursor]
            cursor += 1
            dims.append(tuple(a.name for a in dim.atoms))
            if dim.bracketed and len(dim.atoms) > 1:
                self.brackets.append((dim, length))
            else:
                self.set_size(dim.atoms[0], length)
        return dims, tuple(tensor_shape)

    def fit_star(self, dim: Dim, got: tuple[int, ...]) -> None:
        """'*' stands for the same lengths in every input."""
        if self.star is None:
            self.star = got
        elif self.star != got:
            raise self.annotation.error(
                f"'*' is {list(got)} here but {list(self.star)} in an earlier input", dim.pos
            )

    def solve_hidden(self) -> None:
        """Give '*''s dims their lengths, then solve each bracket with one unknown until none is left."""
        for k, length in enumerate(self.star or ()):
            self.sizes[f"*{k}"] = length
        for dim, _ in self.brackets:  # numeric hidden dims are already known
            for atom in dim.atoms:
                if atom.numeric:
                    self.sizes[atom.name] = int(atom.name)
        pending = list(self.brackets)
        while pending:
            solved = [(dim, length) for dim, length in pending if self.solve_bracket(dim, length)]
            if not solved:
                dim, _ = pending[0]
                names = " or ".join(a.name for a in dim.atoms if a.name not in self.sizes)
                raise self.annotation.error(
                    f"cannot infer the hidden dims of {dim}: pass an argument named {names} with its length",
                    dim.pos,
                )
            for item in solved:
                pending.remove(item)

    def solve_bracket(self, dim: Dim, length: int) -> bool:
        """Check a bracket whose hidden dims are known, or give its one unknown the rest; False: two unknowns."""
        unknown = [a for a in dim.atoms if a.name not in self.sizes]
        known = math.prod(self.sizes[a.name] for a in dim.atoms if a.name in self.sizes)
        if len(unknown) > 1:
            return False
        if not unknown:
            if known != length:
                raise self.annotation.error(
                    f"hidden dims {dim} multiply to {known} but the tensor's dim is {length}", dim.pos
                )
            return True
        if known == 0 or length % known:
            raise self.annotation.error(
                f"dim of length {length} cannot be split as {dim} with the other "
                f"hidden dims multiplying to {known}",
                unknown[0].pos,
            )
        self.sizes[unknown[0].name], self.origin[unknown[0].name] = length // known, unknown[0].pos
        return True

    def output(self, shape: Shape, allow_replicated: bool) -> tuple[list[tuple[str, ...]], tuple[int, ...]]:
        """An output's names per dim and its shape (a '?' output, where allowed, has none and shape ())."""
        if shape.dims is None:
            if allow_replicated:
                return [], ()
            raise self.annotation.error(
                "castcore infers each output's shape from its dims; a '?' output has none "
                "(annotate its dims)",
                shape.pos,
            )
        dims: list[tuple[str, ...]] = []
        for dim in shape.dims:
            if _is_star(dim):
                dims += _star_names(len(self.star or ()))
                continue
            for atom in dim.atoms:
                if atom.numeric:
                    self.sizes.setdefault(atom.name, int(atom.name))
                elif atom.name not in self.sizes:  # only possible for names the inputs bind nowhere
                    raise self.annotation.error(f"cannot infer the length of '{atom.name}'", atom.pos)
            dims.append(tuple(a.name for a in dim.atoms))
        return dims, tuple(math.prod(self.sizes[n] for n in names) for names in dims)

    def marks(self) -> dict[str, str]:
        """Each name's mark: the annotation's, '*''s dims spatial, numbers frozen."""
        marks = dict(self.annotation.marks())
        for k in range(len(self.star or ())):
            marks[f"*{k}"] = SPATIAL
        for shape in self.annotation.inputs + self.annotation.outputs:
            for atom in shape.atoms():
                if atom.numeric:
                    marks[atom.name] = FROZEN
        return marks


def _is_star(dim: Dim) -> bool:
    return len(dim.atoms) == 1 and dim.atoms[0].dynamic


def _star_names(count: int) -> list[tuple[str, ...]]:
    """The names of the dims a '*' stands for: '*0', '*1', ..."""
    return [(f"*{k}",) for k in range(count)]


def _shape_of(value: Any) -> tuple[int, ...] | None:
    shape = getattr(value, "shape", None)
    if shape is None or isinstance(value, type):
        return None
    try:
        return tuple(int(s) for s in shape)
    except TypeError:
        return None
