"""castcore.register_op: a function registered only by annotation traces as one op with the right shape."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import castcore
from castcore.ops.annotations import AnnotationError
from castcore.ops.register import lookup


@castcore.register_op("m k+, k+ n -> m n", name="test_ns::scaled_mm")
def scaled_mm(a, b, scale: float = 1.0):
    return (a @ b) * scale


@castcore.register_op("(h t) k -> h t k")
def split_heads(x, h: int = 8):
    return x.reshape(h, x.shape[0] // h, x.shape[1])


@castcore.register_op("*, * -> *, *", mutates=("x",))
def accumulate(x, y):
    x.add_(y)
    return x, x + y


def optional_anno(*inputs, **kwargs):
    return "*, ? -> *" if inputs[1] is None else "*, * -> *"


@castcore.register_op(optional_anno)
def maybe_add(x, y=None):
    return x if y is None else x + y


@castcore.register_op("a b, ? -> a b")
class Scale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, factor: float):
        return x * factor

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def _double(x):
    return x * 2


doubled = castcore.register_op("* -> *", name="test_ns::doubled")(torch.compile(_double, backend="eager"))


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.empty(64, 128))

    def forward(self, x):
        return split_heads(scaled_mm(x, self.w, 0.5), h=4)


def names(captured):
    return [i.name for i in captured.invokes]


def test_a_module_using_an_annotated_op_is_captured_as_one_op_each():
    with torch.device("meta"):
        block = Block()
    captured = castcore.capture(block, torch.empty(32, 64, device="meta"))
    assert names(captured) == ["test_ns::scaled_mm", "castcore_user::split_heads"]
    mm, heads = captured.invokes
    assert mm.outputs()[0].shape == (32, 128)
    assert heads.outputs()[0].shape == (4, 8, 128)
    assert mm.module == "Block"


def test_the_op_runs_for_real_and_matches_the_function():
    a, b = torch.randn(3, 4), torch.randn(4, 5)
    torch.testing.assert_close(scaled_mm(a, b, 2.0), (a @ b) * 2)
    assert split_heads(torch.randn(16, 3), h=2).shape == (2, 8, 3)
    assert isinstance(torch.ops.test_ns.scaled_mm.default, torch._ops.OpOverload)


def test_estimated_by_memory_only_fallback_unless_claimed(session):
    a = torch.empty(32, 64, device="meta")
    b = torch.empty(64, 128, device="meta")
    report = session.estimate(scaled_mm, a, b)
    (record,) = report.records
    assert record.invoke.name == "test_ns::scaled_mm"
    assert record.estimate.fallback and record.estimate.time_s > 0


def test_in_place_op_returns_the_changed_input():
    x, y = torch.zeros(3), torch.ones(3)
    changed, total = accumulate(x, y)
    assert torch.equal(x, torch.ones(3)) and torch.equal(changed, x) and torch.equal(total, 2 * x)
    schema = str(torch.ops.castcore_user.accumulate.default._schema)
    assert "Tensor(a!) x" in schema
    (invoke,) = castcore.capture(accumulate, x, y).invokes
    assert [o.shape for o in invoke.outputs()] == [(3,), (3,)]


def test_callable_annotation_and_optional_tensor():
    x = torch.ones(2, 3)
    assert torch.equal(maybe_add(x), x)
    assert torch.equal(maybe_add(x, x), 2 * x)
    assert castcore.capture(lambda t: maybe_add(t), x).invokes[0].outputs()[0].shape == (2, 3)
    assert castcore.capture(lambda t: maybe_add(t, t), x).invokes[0].outputs()[0].shape == (2, 3)


def test_autograd_function_and_compiled_function():
    x = torch.ones(2, 5)
    assert torch.equal(Scale.apply(x, 3.0), 3 * x)
    (invoke,) = castcore.capture(lambda t: Scale.apply(t, 2.0), x).invokes
    assert invoke.name == "castcore_user::Scale" and invoke.outputs()[0].shape == (2, 5)
    assert torch.equal(doubled(x), 2 * x)
    (invoke,) = castcore.capture(doubled, torch.ones(4, 4, 2)).invokes
    assert invoke.name == "test_ns::doubled" and invoke.outputs()[0].shape == (4, 4, 2)


def test_inputs_that_contradict_the_annotation_fail_with_a_caret():
    with pytest.raises(AnnotationError, match=r"(?s)'k' is 9 here but 4.*\^") as info:
        castcore.capture(scaled_mm, torch.empty(2, 4), torch.empty(9, 3))
    assert "test_ns::scaled_mm" in str(info.value)


def test_a_real_result_that_contradicts_the_annotation_is_reported():
    @castcore.register_op("a -> a", name="test_ns::wrong_shape")
    def wrong_shape(x):
        return x[:-1]

    with pytest.raises(AnnotationError, match="output 0 is"):
        wrong_shape(torch.ones(3))


def test_registration_errors():
    with pytest.raises(AnnotationError):
        castcore.register_op("a -> b")
    with pytest.raises(AnnotationError, match="1 parameters"):
        castcore.register_op("a, b -> a", name="test_ns::too_few")(lambda x: x)
    with pytest.raises(ValueError, match="not a valid op name"):
        castcore.register_op("a -> a", name="bad name")(lambda x: x)
    with pytest.raises(ValueError, match="already registered"):
        castcore.register_op("a -> a", name="test_ns::scaled_mm")(lambda x: x)


def test_lookup_by_wrapper_op_and_name():
    record = lookup(scaled_mm)
    assert lookup("test_ns::scaled_mm") is record
    assert lookup(torch.ops.test_ns.scaled_mm.default) is record
    assert lookup(torch.ops.test_ns.scaled_mm) is record
    assert record.output_shapes(torch.empty(2, 3), torch.empty(3, 4)) == [(2, 4)]


def test_the_op_exists_when_registered_and_hinted_calls_share_its_default_overload():
    @castcore.register_op("a b, ? -> a b", name="test_ns::hinted")
    def hinted(x: torch.Tensor, factor: float, flag: bool = False):
        return x * factor

    op = torch.ops.test_ns.hinted.default  # before any call
    assert str(op._schema) == "test_ns::hinted(Tensor x, Scalar factor, Scalar flag) -> Tensor"
    for factor in (2, 2.5):  # an int where the hint says float still is the default overload
        (invoke,) = castcore.capture(hinted, torch.empty(2, 3), factor).invokes
        assert invoke.op is op
    assert hinted(torch.ones(1, 1), 2)[0, 0].item() == 2


def test_a_training_step_records_the_ops_backward_as_one_op(session):
    with torch.device("meta"):
        block = Block()
    report = session.estimate(block, torch.empty(32, 64), train=True)
    recorded = [r.invoke.name for r in report.records]
    assert recorded.count("test_ns::scaled_mm_backward") == 1
    assert recorded.count("castcore_user::split_heads_backward") == 1
    backward = next(r.invoke for r in report.records if r.invoke.name == "test_ns::scaled_mm_backward")
    assert [t.shape for t in backward.outputs()] == [(64, 128)]  # only the weight wants a gradient

    # Run for real, the backward op recomputes the function with autograd: the decomposition's gradients.
    a, b = torch.randn(3, 4, requires_grad=True), torch.randn(4, 5, requires_grad=True)
    scaled_mm(a, b, 0.5).pow(2).sum().backward()
    a2, b2 = a.detach().requires_grad_(), b.detach().requires_grad_()
    ((a2 @ b2) * 0.5).pow(2).sum().backward()
    torch.testing.assert_close((a.grad, b.grad), (a2.grad, b2.grad))


@torch.library.custom_op("fwd_only_test::double", mutates_args=())
def forward_only(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@forward_only.register_fake
def _(x):
    return torch.empty_like(x)


_LIBRARY = torch.library.Library("fwd_only_test", "FRAGMENT")  # noqa: TOR901 - lives as long as the tests
_LIBRARY.define("triple(Tensor x) -> Tensor")
_LIBRARY.impl("triple", lambda x: x * 3, "CPU")
torch.library.register_fake("fwd_only_test::triple", lambda x: torch.empty_like(x), lib=_LIBRARY)


@pytest.mark.parametrize(
    "op, name",
    [(forward_only, "fwd_only_test::double"), (torch.ops.fwd_only_test.triple, "fwd_only_test::triple")],
)
def test_a_forward_only_custom_op_in_a_training_step_is_a_one_line_error(op, name):
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.empty(4, 5))

        def forward(self, x):
            return op(x @ self.w)

    session = castcore.Session(
        load_packs=[], device_files=[Path(__file__).parents[1] / "data" / "h100-sxm.toml"]
    )
    assert len(session.estimate(Model(), torch.empty(3, 4)).records) == 2  # forward only: fine
    with pytest.raises(castcore.CaptureError) as info:
        session.estimate(Model(), torch.empty(3, 4), train=True)
    message = str(info.value)
    assert "\n" not in message and name in message and "register_autograd" in message
