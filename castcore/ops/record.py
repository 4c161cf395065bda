"""What ``castcore.register_op`` keeps of one registered function: its torch op's overloads, its annotation,
and how a call's arguments bind to it. The registry and the definition of overloads are castcore.ops.register's."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from castcore.ops.annotations import AnnotationError, OpAnnotation
from castcore.ops.binding import Binding, bind, resolve


@dataclass(eq=False)
class RegisteredOp:
    """One registered function: its torch op, its annotation and how castcore calls it."""

    qualname: str  # "ns::name"
    fn: Callable  # what runs for real
    annotation: str | Callable[..., str]  # as given
    parsed: OpAnnotation | None  # None when the annotation is a callable of the inputs
    params: list[str]  # parameter names, in order
    defaults: dict[str, Any]
    input_gen_fn: Callable | None = None
    mutates: tuple[str, ...] = ()
    overloads: dict[tuple, Any] = field(default_factory=dict)  # argument types -> OpOverload
    wrapper: Callable | None = None
    plain: Callable = field(kw_only=True)  # fn without torch.compile: what runs on fake tensors
    origin: tuple = ()  # where the registered function is written (_origin)
    # Per overload, which outputs are inputs returned (output index -> input index), once known.
    aliases: dict[tuple, dict[int, int]] = field(default_factory=dict)

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

    def fit(self, args: Sequence[Any], kwargs: dict[str, Any] | None = None) -> Binding:
        """The annotation fitted to one call's arguments (a '?' output has shape ()), errors naming this op."""
        bound = self.bind_all(args, kwargs)
        values = [bound[p] for p in self.params]
        annotation = self.annotation_for(values, {})
        count = len(annotation.inputs)
        try:
            return bind(
                annotation,
                values[:count],
                dict(zip(self.params[count:], values[count:])),
                allow_replicated_outputs=True,
            )
        except AnnotationError as exc:
            raise exc.for_op(self.qualname) from None
