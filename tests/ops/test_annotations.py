"""The dimension-annotation grammar: parsing, caret errors, fitting to inputs, and fuzzing."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from castcore.ops.annotations import (
    FROZEN,
    SPATIAL,
    SUM,
    AnnotationError,
    Atom,
    Dim,
    OpAnnotation,
    Shape,
    parse,
)
from castcore.ops.binding import bind


def t(*shape):
    return SimpleNamespace(shape=shape)


@pytest.mark.parametrize(
    "text",
    [
        "m k+, k+ n -> m n",
        "n c h^ w^, c, c -> n c h^ w^",
        "(h^ m^) kd+, kd+ n -> h^ m^ n",
        "a (b c) -> (a b) c",
        "4 k+, k+ d -> 8 d",
        "* d^, s -> * s",
        "a^ b^, ? -> a^ b^",
        "*, * -> *, *",
        "a -> a",
    ],
)
def test_the_guide_examples_parse_and_print_back(text):
    assert str(parse(text)) == text


def test_marks_and_numeric_dims():
    anno = parse("b s^ 64, 64 k+ -> b s^")
    first = anno.inputs[0].dims
    assert [a.mark for d in first for a in d.atoms] == [SPATIAL, FROZEN, FROZEN]
    assert anno.marks() == {"b": SPATIAL, "s": FROZEN, "k": SUM}
    assert parse("x, ? -> x").inputs[1].replicated


def test_caret_points_at_the_fault():
    with pytest.raises(AnnotationError) as info:
        parse("m k+, k n -> m n")
    err = info.value
    assert isinstance(err, ValueError)
    assert err.position == 6
    lines = str(err).splitlines()
    assert lines[1].strip() == "m k+, k n -> m n"
    assert lines[2].index("^") - lines[1].index("m") == 6


@pytest.mark.parametrize(
    "text, position, words",
    [
        ("a b", 3, "missing '->'"),
        ("a -> b -> c", 7, "second '->'"),
        ("m k -> m n", 9, "appears in no input"),
        ("a -> a+", 5, "sum-reduced"),
        ("a+^ -> a", 2, "second mark"),
        ("(a (b)) -> a", 3, "cannot nest"),
        ("(a b -> a", 0, "never closed"),
        ("a) -> a", 1, "without a matching"),
        ("() -> a", 1, "empty brackets"),
        ("a, , b -> a", 3, "empty tensor"),
        ("4+ -> 4", 1, "numeric"),
        ("* b * -> b", 4, "second '*'"),
        ("*+ -> *", 1, "'*' takes no"),
        ("(a *) -> a", 3, "hidden dim"),
        ("a ? -> a", 2, "whole argument"),
        ("x -> *", 5, "in no input"),
        ("-> a", 0, "no inputs"),
        ("a ->", 4, "no outputs"),
        ("1a -> 1", 0, "start with a digit"),
        ("a+b -> a", 2, "separate dims"),
        ("a $ -> a", 2, "unexpected '$'"),
        ("a - > a", 2, "'->'"),
        ("+a -> a", 0, "must directly follow"),
    ],
)
def test_malformed_annotations(text, position, words):
    with pytest.raises(AnnotationError) as info:
        parse(text)
    assert info.value.position == position, str(info.value)
    assert words in info.value.reason


def test_shapes_are_inferred_from_inputs():
    assert bind(parse("m k+, k+ n -> m n"), [t(4, 8), t(8, 16)]).output_shapes == [(4, 16)]
    assert bind(parse("* d^, s -> * s"), [t(2, 3, 16), t(5)]).output_shapes == [(2, 3, 5)]
    assert bind(parse("* -> *"), [t()]).output_shapes == [()]
    assert bind(parse("4 k+, k+ d -> 8 d"), [t(4, 3), t(3, 7)]).output_shapes == [(8, 7)]
    assert bind(parse("a (b c) -> (a b) c"), [t(2, 12)], {"b": 3}).output_shapes == [(6, 4)]


def test_hidden_dims_come_from_same_named_arguments_or_inference():
    fitted = bind(parse("(h t) k -> h t k"), [t(1024, 8)], {"h": 8})
    assert fitted.output_shapes == [(8, 128, 8)] and fitted.sizes["t"] == 128
    # t is known from the second input, so h needs no argument
    assert bind(parse("(h t) k, t -> h k"), [t(12, 5), t(4)]).output_shapes == [(3, 5)]


@pytest.mark.parametrize(
    "text, args, kwargs, position, words",
    [
        ("m k+, k+ n -> m n", [t(4, 8), t(9, 2)], {}, 6, "is 9 here but 8"),
        ("(h t) k -> h t k", [t(1024, 8)], {}, 0, "pass an argument named h or t"),
        ("(h t) k -> h t k", [t(1000, 8)], {"h": 7}, 3, "cannot be split"),
        ("(h t) k -> h t k", [t(1024, 8)], {"h": 8, "t": 64}, 0, "multiply to 512"),
        ("a b -> a", [t(4)], {}, 0, "has 1 dims"),
        ("4 k -> k", [t(5, 2)], {}, 0, "fixed at 4"),
        ("a, b -> a", [t(3)], {}, 3, "1 positional"),
        ("a, b -> a", [t(3), None], {}, 3, "annotate it '?'"),
        ("* a, * -> *", [t(2, 3, 4), t(2, 4)], {}, 5, "'*' is [2, 4] here"),
        ("a -> a, ?", [t(3)], {}, 8, "'?' output"),
        ("a b -> a", [t(4, 3)], {"b": 5}, 2, "same-named argument"),
    ],
)
def test_annotations_inconsistent_with_inputs(text, args, kwargs, position, words):
    with pytest.raises(AnnotationError) as info:
        bind(parse(text), args, kwargs)
    assert info.value.position == position, str(info.value)
    assert words in info.value.reason, str(info.value)


# ---------------------------------------------------------------------------------------------
# Fuzzing


@given(st.text(max_size=40))
@settings(max_examples=400)
def test_any_text_parses_or_raises_annotation_error(text):
    try:
        parse(text)
    except AnnotationError as exc:
        assert 0 <= exc.position <= len(text)


@given(st.text(alphabet="ab_k1 2+^?*(),->\t", max_size=30))
@settings(max_examples=1000)
def test_grammar_soup_parses_or_raises_annotation_error(text):
    try:
        anno = parse(text)
    except AnnotationError as exc:
        assert 0 <= exc.position <= len(text)
    else:
        assert parse(str(anno)) == anno


NAMES = ["a", "b", "k", "m", "n", "h_1", "_x", "dim", "é", "ヘ"]


@st.composite
def annotations(draw):
    """A valid annotation as (text, expected OpAnnotation)."""
    summed = {n: draw(st.booleans()) for n in NAMES}
    frozen = {n: draw(st.booleans()) for n in NAMES}

    def atom(allow_star, in_output):
        kind = draw(st.sampled_from(["name", "name", "name", "number"] + (["star"] if allow_star else [])))
        if kind == "star":
            return Atom("*")
        if kind == "number":
            return Atom(str(draw(st.integers(0, 4096))), FROZEN)
        pool = [n for n in used if not summed[n]] if in_output else NAMES
        if not pool:
            return Atom(str(draw(st.integers(1, 64))), FROZEN)
        name = draw(st.sampled_from(pool))
        if not in_output:
            used.add(name)
        mark = SUM if summed[name] and not in_output else (FROZEN if frozen[name] else SPATIAL)
        return Atom(name, mark)

    def shape(in_output):
        if not in_output and draw(st.integers(0, 6)) == 0:
            return Shape(None)
        dims, star = [], False
        for _ in range(draw(st.integers(1, 4))):
            if draw(st.integers(0, 4)) == 0:
                atoms = tuple(atom(False, in_output) for _ in range(draw(st.integers(1, 3))))
                dims.append(Dim(atoms, True))
            else:
                a = atom(not star and (not in_output or star_in_inputs[0]), in_output)
                star = star or a.dynamic
                dims.append(Dim((a,)))
        if not in_output and star:
            star_in_inputs[0] = True
        return Shape(tuple(dims))

    used: set[str] = set()
    star_in_inputs = [False]
    inputs = tuple(shape(False) for _ in range(draw(st.integers(1, 3))))
    outputs = tuple(shape(True) for _ in range(draw(st.integers(1, 3))))
    expected = OpAnnotation(inputs, outputs)

    space = st.sampled_from([" ", "  ", "\t"])
    gap = st.sampled_from(["", " ", "  "])

    def render_dim(d):
        inner = draw(space).join(_atom_text(a, draw) for a in d.atoms)
        return f"({draw(gap)}{inner}{draw(gap)})" if d.bracketed else inner

    def render_shape(s):
        return "?" if s.replicated else draw(space).join(render_dim(d) for d in s.dims)

    def render_side(shapes):
        return f"{draw(gap)},{draw(gap)}".join(render_shape(s) for s in shapes)

    text = f"{draw(gap)}{render_side(inputs)}{draw(gap)}->{draw(gap)}{render_side(outputs)}{draw(gap)}"
    return text, expected


def _atom_text(a, draw):
    if a.numeric:
        return a.name + draw(st.sampled_from(["", "^"]))
    return a.name + a.mark


@given(annotations())
@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow])
def test_generated_annotations_round_trip(case):
    text, expected = case
    parsed = parse(text)
    assert parsed == expected
    assert parse(str(parsed)) == parsed


@given(
    annotations(),
    st.lists(st.lists(st.integers(0, 6), max_size=5), min_size=3, max_size=3),
    st.dictionaries(st.sampled_from(NAMES), st.integers(1, 4), max_size=3),
)
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
def test_fitting_random_shapes_never_crashes(case, shapes, kwargs):
    text, _ = case
    anno = parse(text)
    args = [t(*s) for s in shapes]
    try:
        fitted = bind(anno, args[: len(anno.inputs)], kwargs)
    except AnnotationError:
        return
    assert all(all(n >= 0 for n in shape) for shape in fitted.output_shapes)
