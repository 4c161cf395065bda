"""Dimension annotations (nnScaler's grammar): the model and its parser (fitting one to a call: ``binding``).

An annotation such as ``"m k+, k+ n -> m n"`` names each dimension of each input and output.
The same name means the same length. A bare name may be split across devices, ``+`` splits it
with a sum reduction (each device holds a partial result), ``^`` forbids splitting, a number is
a fixed length, ``*`` stands for any number of leading or trailing dimensions, ``?`` marks an
argument that is only ever replicated (a non-tensor, or an optional tensor), and ``(h t)`` is one
dimension made of hidden ones, whose lengths come from inference or same-named arguments.

Every fault is an :class:`AnnotationError` whose message shows the annotation with a caret.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from castcore.errors import CastcoreError

SPATIAL = ""  # may be split; every tensor holding it is split with it
SUM = "+"  # may be split; outputs lack it and are partial sums (an all-reduce follows)
FROZEN = "^"  # must not be split
DYNAMIC = "*"
REPLICATED = "?"
ARROW = "->"


class CustomOpError(CastcoreError, ValueError):
    """A user's registered op, its annotation, or the arguments given to partition or measure it, is wrong."""


class AnnotationError(CustomOpError):
    """A malformed annotation, or one that does not fit the inputs; shows the annotation and a caret."""

    def __init__(self, reason: str, annotation: str, position: int, op: str | None = None):
        position = max(0, min(position, len(annotation)))
        self.reason, self.annotation, self.position, self.op = reason, annotation, position, op
        where = f"{op}: " if op else ""
        super().__init__(f"{where}{reason}\n    {annotation}\n    {' ' * position}^")

    def for_op(self, op: str) -> AnnotationError:
        """The same error, naming the operator it belongs to."""
        return AnnotationError(self.reason, self.annotation, self.position, op)


@dataclass(frozen=True, slots=True)
class Atom:
    """One named, numeric or dynamic length with its partition mark ('', '+' or '^')."""

    name: str  # an identifier, a decimal string, or '*'
    mark: str = SPATIAL
    pos: int = field(default=0, compare=False)

    @property
    def numeric(self) -> bool:
        return self.name[0].isdecimal()

    @property
    def dynamic(self) -> bool:
        return self.name == DYNAMIC

    def __str__(self) -> str:
        return self.name if self.numeric else self.name + self.mark


@dataclass(frozen=True, slots=True)
class Dim:
    """One tensor dimension: a single atom, or a bracket of hidden atoms whose lengths multiply."""

    atoms: tuple[Atom, ...]
    bracketed: bool = False
    pos: int = field(default=0, compare=False)

    def __str__(self) -> str:
        inner = " ".join(str(a) for a in self.atoms)
        return f"({inner})" if self.bracketed else inner


@dataclass(frozen=True, slots=True)
class Shape:
    """One argument or result: its dims, or ``dims=None`` for '?' (replicated / not a tensor)."""

    dims: tuple[Dim, ...] | None
    pos: int = field(default=0, compare=False)

    @property
    def replicated(self) -> bool:
        return self.dims is None

    def atoms(self) -> list[Atom]:
        return [a for d in self.dims or () for a in d.atoms]

    def __str__(self) -> str:
        return REPLICATED if self.dims is None else " ".join(str(d) for d in self.dims)


@dataclass(frozen=True, slots=True)
class OpAnnotation:
    """A parsed annotation: input shapes (one per leading positional argument) and output shapes."""

    inputs: tuple[Shape, ...]
    outputs: tuple[Shape, ...]
    text: str = field(default="", compare=False)

    def __str__(self) -> str:
        return f"{', '.join(str(s) for s in self.inputs)} {ARROW} {', '.join(str(s) for s in self.outputs)}"

    def marks(self) -> dict[str, str]:
        """Each named dimension's mark, as the inputs give it ('^' anywhere wins over '')."""
        marks: dict[str, str] = {}
        for shape in self.inputs + self.outputs:
            for atom in shape.atoms():
                if atom.numeric or atom.dynamic:
                    continue
                if marks.get(atom.name) in (None, SPATIAL):
                    marks[atom.name] = atom.mark
        return marks

    def error(self, reason: str, pos: int) -> AnnotationError:
        return AnnotationError(reason, self.text or str(self), pos)


# ---------------------------------------------------------------------------------------------
# Parsing


def parse(text: str) -> OpAnnotation:
    """Parse and check an annotation; raise AnnotationError (a ValueError) with a caret on any fault."""
    if not isinstance(text, str):
        raise AnnotationError(
            f"an annotation is a string like 'm k+, k+ n -> m n', not {type(text).__name__}", repr(text), 0
        )
    parser = _Parser(text)
    annotation = parser.parse()
    _check(annotation)
    return annotation


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.i = 0

    def fail(self, reason: str, pos: int | None = None) -> AnnotationError:
        return AnnotationError(reason, self.text, self.i if pos is None else pos)

    def peek(self) -> str:
        return self.text[self.i] if self.i < len(self.text) else ""

    def skip_space(self) -> None:
        while self.i < len(self.text) and self.text[self.i].isspace():
            self.i += 1

    def parse(self) -> OpAnnotation:
        inputs = self.side(ending=ARROW)
        if not self.text.startswith(ARROW, self.i):
            raise self.fail("missing '->' between the inputs and the outputs")
        arrow = self.i
        self.i += len(ARROW)
        outputs = self.side(ending="")
        if self.i < len(self.text):  # side() stops only at '->' or the end
            raise self.fail("a second '->': an annotation has one, between inputs and outputs")
        if not inputs:
            raise self.fail("no inputs before '->': annotate at least one argument", arrow)
        if not outputs:
            raise self.fail("no outputs after '->': annotate at least one result", len(self.text))
        return OpAnnotation(tuple(inputs), tuple(outputs), self.text)

    def side(self, ending: str) -> list[Shape]:
        shapes: list[Shape] = []
        self.skip_space()
        if self.at_side_end():
            return shapes
        while True:
            shapes.append(self.shape())
            self.skip_space()
            if self.peek() == ",":
                self.i += 1
                self.skip_space()
                if self.at_side_end() or self.peek() == ",":
                    raise self.fail("an empty tensor annotation: write its dims, or '?' for a non-tensor")
                continue
            if self.at_side_end():
                return shapes
            raise self.fail(f"unexpected {self.peek()!r}")

    def at_side_end(self) -> bool:
        return self.i >= len(self.text) or self.text.startswith(ARROW, self.i)

    def shape(self) -> Shape:
        start = self.i
        if self.peek() == REPLICATED:
            self.i += 1
            self.skip_space()
            if not (self.at_side_end() or self.peek() == ","):
                raise self.fail(
                    "'?' stands for a whole argument; it cannot be combined with dims "
                    "(use '^' for a dim that must not be split)"
                )
            return Shape(None, start)
        dims: list[Dim] = []
        star: int | None = None
        while not (self.at_side_end() or self.peek() == ","):
            dim = self.dim()
            for atom in dim.atoms:
                if atom.dynamic:
                    if star is not None:
                        raise self.fail(
                            "a second '*' in one tensor: its split between the two is ambiguous", atom.pos
                        )
                    star = atom.pos
            dims.append(dim)
            self.skip_space()
        return Shape(tuple(dims), start)

    def dim(self) -> Dim:
        start = self.i
        c = self.peek()
        if c == "(":
            self.i += 1
            atoms: list[Atom] = []
            while True:
                self.skip_space()
                c = self.peek()
                if c == ")":
                    if not atoms:
                        raise self.fail("empty brackets: put the hidden dims inside, e.g. (h d)")
                    self.i += 1
                    self.separator()
                    return Dim(tuple(atoms), True, start)
                if c == "" or c == "," or self.text.startswith(ARROW, self.i):
                    raise self.fail("'(' is never closed", start)
                if c == "(":
                    raise self.fail("brackets cannot nest: list every hidden dim in one bracket")
                atom = self.atom(in_bracket=True)
                if atom.dynamic:
                    raise self.fail("'*' cannot be a hidden dim inside brackets", atom.pos)
                atoms.append(atom)
        if c == ")":
            raise self.fail("')' without a matching '('")
        atom = self.atom(in_bracket=False)
        return Dim((atom,), False, start)

    def atom(self, in_bracket: bool) -> Atom:
        start = self.i
        c = self.peek()
        if c == DYNAMIC:
            self.i += 1
            name = DYNAMIC
        elif c.isdecimal():
            while self.peek().isdecimal():
                self.i += 1
            if self.peek() == "_" or self.peek().isidentifier():
                raise self.fail("a dimension name cannot start with a digit", start)
            name = str(int(self.text[start : self.i]))
        elif c == "_" or c.isidentifier():
            self.i += 1
            while self.i < len(self.text) and self.text[start : self.i + 1].isidentifier():
                self.i += 1
            name = self.text[start : self.i]
        elif c in "+^":
            raise self.fail(f"'{c}' must directly follow a dimension name, as in 'k{c}'")
        elif c == REPLICATED:
            raise self.fail(
                "'?' stands for a whole argument; it cannot be a dim (use '^' for a dim "
                "that must not be split)"
            )
        elif c == "-":
            raise self.fail("'-' is only valid as part of '->'")
        else:
            raise self.fail(f"unexpected {c!r}: a dim is a name, a number, '*' or a bracket (h d)")
        mark = SPATIAL
        if self.peek() in ("+", "^"):
            mark = self.peek()
            if name == DYNAMIC:
                raise self.fail("'*' takes no '+' or '^': it stands for several dims")
            if mark == SUM and name[0].isdecimal():
                raise self.fail("a numeric dim is never split, so it cannot be '+'")
            self.i += 1
        if name[0].isdecimal():
            mark = FROZEN  # a fixed length is never split
        if not in_bracket or self.peek() != ")":
            self.separator()
        return Atom(name, mark, start)

    def separator(self) -> None:
        """After a dim: a space, ',', '->', ')' (inside brackets), '(' or the end must follow."""
        c = self.peek()
        if c == "" or c.isspace() or c in ",()" or self.text.startswith(ARROW, self.i):
            return
        if c in "+^":
            raise self.fail(f"a second mark '{c}': a dim takes one of '+' or '^'")
        raise self.fail(f"unexpected {c!r}: separate dims with spaces")


def _check(annotation: OpAnnotation) -> None:
    """Consistency across tensors: outputs use known names, '+' is used the same way everywhere."""
    seen: dict[str, Atom] = {}
    star_in_inputs = False
    for shape in annotation.inputs:
        for atom in shape.atoms():
            if atom.dynamic:
                star_in_inputs = True
                continue
            if atom.numeric:
                continue
            first = seen.setdefault(atom.name, atom)
            if (first.mark == SUM) != (atom.mark == SUM):
                raise annotation.error(
                    f"'{atom.name}' is marked '+' in one place and not in another: a "
                    "sum-reduced dim is '+' wherever it appears",
                    atom.pos,
                )
    for shape in annotation.outputs:
        for atom in shape.atoms():
            if atom.dynamic:
                if not star_in_inputs:
                    raise annotation.error(
                        "'*' in an output but in no input: its dims come from the inputs", atom.pos
                    )
                continue
            if atom.numeric:
                continue
            if atom.mark == SUM or seen.get(atom.name, atom).mark == SUM:
                raise annotation.error(
                    f"'{atom.name}' is sum-reduced ('+'), so no output can have it", atom.pos
                )
            if atom.name not in seen:
                raise annotation.error(
                    f"output dim '{atom.name}' appears in no input: use an input's dim or a number", atom.pos
                )
