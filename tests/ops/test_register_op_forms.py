"""nnScaler's register_op guide, its code run as the guide writes it (only ``import nnscaler`` became
``import castcore as nnscaler``): every form makes later calls of the function one captured op, an
autograd Function's backward one more in a training step, and the op exists once registered."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import castcore
from castcore.cli.main import main
from castcore.ops.register import lookup

DEVICE_FILE = Path(__file__).parents[1] / "data" / "h100-sxm.toml"

CUSTOM_OPS = """
import torch

# file: custom_ops.py
def operator(x: torch.Tensor, w: torch.Tensor, h: float) -> torch.Tensor:
    out = torch.matmul(x, w)
    out = out.view(h, out.size(0) // h, out.size(1))
    return out
"""

MATMUL_MAIN = """
# file: main.py
import castcore as nnscaler
from custom_ops import operator
nnscaler.register_op('(h^ m^) kd+, kd+ n -> h^ m^ n', name='matmul_custom')(operator)
"""

INSTANCE_NORM = """
import torch
import torch.nn as nn
import castcore as nnscaler
# you write a new function to wrap the operator.
@nnscaler.register_op('n c h^ w^, c, c -> n c h^ w^', name='my_instance_norm')
def my_instance_norm(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor):
    return nn.functional.instance_norm(input, weight=weight, bias=bias)
"""

THIRD_PARTY = """
def func(x, b = 4):
    return x.reshape(x.shape[0] * b, x.shape[1] // b)
"""

# The guide's three forms for a function from elsewhere (the decorator's body, "...", written out).
FUNC_FORMS = {
    "call": """
import castcore as nnscaler
from third_party import func

nnscaler.register_op('a (b c) -> (a b) c')(func)
""",
    "decorator": """
import castcore as nnscaler
from third_party import func

@nnscaler.register_op('a (b c) -> (a b) c')
def func(x, b = 4):
    return x.reshape(x.shape[0] * b, x.shape[1] // b)
""",
    "anno_fn": """
import castcore as nnscaler
from third_party import func

def anno_fn(*inputs, **kwargs):
    return 'a (b c) -> (a b) c'

nnscaler.register_op(anno_fn)(func)
""",
}

# The guide's two examples of a '?' output (its placeholders written out); both are called op1.
DEPENDENT_OUTPUT = """
import torch
import castcore as nnscaler

def some_func(x):
    return x.sum(0)

@nnscaler.register_op('a^ b^ -> a^ b^, ?')
def op1(x: torch.Tensor):
    x = x * 2
    y = some_func(x)
    return x, y
"""

CONSTANT_OUTPUT = """
import torch
import castcore as nnscaler

@nnscaler.register_op('a b -> a b, ?')
def op1(x: torch.Tensor):
    x = x * 2
    y = 10
    return x, y
"""

INPLACE = """
import torch
from typing import Tuple
import castcore as nnscaler

# this is correct
@nnscaler.register_op('*, * -> *, *', name='inplace_operator')
def inplace_operator(x: torch.Tensor, y: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    x.add_(y)
    z = x + y
    return x, z
"""

OPTIONAL_REPLICATED = """
import torch
from typing import Optional
import castcore as nnscaler

@nnscaler.register_op('a^ b^, ? -> a^ b^', name='optional_tensor')
def optional_op(x: torch.Tensor, y: Optional[torch.Tensor]) -> torch.Tensor:
    out = torch.triu(x)
    if y is not None:
        out += y
    return out
"""

OPTIONAL_ANNO_FN = """
import torch
from typing import Optional
import castcore as nnscaler

def anno_fn(*inputs, **kwargs):
    if inputs[1] is None:
        return '*, ? -> *'
    else:
        return '*, * -> *'

@nnscaler.register_op(anno_fn, name='optional_tensor')
def optional_op(x: torch.Tensor, y: Optional[torch.Tensor]) -> torch.Tensor:
    if y is None:
        return x
    return x + y
"""

# The guide's torch.autograd.Function forms, with a forward and backward written out.
FUNCTION = """
class MyFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x @ w * SCALE

    @staticmethod
    def backward(ctx, grad):
        x, w = ctx.saved_tensors
        return grad @ w.t() * SCALE, x.t() @ grad * SCALE
"""
FUNCTION_FORMS = {
    "decorator": "import torch\nimport castcore as nnscaler\nSCALE = 2.0\nannotation = 'm k, k n -> m n'\n\n"
    "@nnscaler.register_op(annotation)" + FUNCTION,
    "class": "import torch\nimport castcore as nnscaler\nSCALE = 3.0\nannotation = 'm k, k n -> m n'\n"
    + FUNCTION
    + "\nnnscaler.register_op(annotation)(MyFunction)\n",
    "apply": "import torch\nimport castcore as nnscaler\nSCALE = 4.0\nannotation = 'm k, k n -> m n'\n"
    + FUNCTION
    + "\nnnscaler.register_op(annotation)(MyFunction.apply)\n",
}

COMPILED = """
import torch
import castcore as nnscaler

@torch.compile
def my_function(x: torch.Tensor) -> torch.Tensor:
    return x * 2

nnscaler.register_op('* -> *')(my_function)
"""


def load(folder: Path, main_name: str, main: str, **helpers: str):
    """Write the guide's files into ``folder`` and import ``main_name`` from there (its helpers fresh)."""
    folder.mkdir(parents=True)
    for name, text in {main_name: main, **helpers}.items():
        (folder / f"{name}.py").write_text(textwrap.dedent(text), encoding="utf-8")
    for name in helpers:
        sys.modules.pop(name, None)
    sys.path.insert(0, str(folder))
    try:
        return importlib.import_module(main_name)
    finally:
        sys.path.remove(str(folder))


def names(captured) -> list[str]:
    return [i.name for i in captured.invokes]


def session() -> castcore.Session:
    return castcore.Session(load_packs=[], device_files=[DEVICE_FILE])


def test_the_call_form_on_an_imported_function_makes_its_later_calls_one_op(tmp_path):
    guide = load(tmp_path / "matmul", "guide_matmul_main", MATMUL_MAIN, custom_ops=CUSTOM_OPS)
    x, w = torch.randn(8, 6), torch.randn(6, 5)
    captured = castcore.capture(lambda x, w: guide.operator(x, w, 2), x, w)
    assert names(captured) == ["castcore_user::matmul_custom"]
    assert captured.invokes[0].outputs()[0].shape == (2, 4, 5)
    custom_ops = sys.modules["custom_ops"]
    assert custom_ops.operator is guide.operator  # the defining module's name is the op too
    assert lookup(guide.operator).qualname == "castcore_user::matmul_custom"
    torch.testing.assert_close(guide.operator(x, w, 2), (x @ w).view(2, 4, 5))


def test_the_decorator_form(tmp_path):
    guide = load(tmp_path / "norm", "guide_instance_norm", INSTANCE_NORM)
    x, weight, bias = torch.randn(2, 3, 4, 4), torch.randn(3), torch.randn(3)
    assert names(castcore.capture(guide.my_instance_norm, x, weight, bias)) == [
        "castcore_user::my_instance_norm"
    ]
    torch.testing.assert_close(
        guide.my_instance_norm(x, weight, bias), F.instance_norm(x, weight=weight, bias=bias)
    )


@pytest.mark.parametrize("form", FUNC_FORMS)
def test_the_three_forms_for_a_function_from_elsewhere(tmp_path, form):
    guide = load(tmp_path / form, f"guide_func_{form}", FUNC_FORMS[form], third_party=THIRD_PARTY)
    (invoke,) = castcore.capture(guide.func, torch.empty(3, 8)).invokes
    assert invoke.name == lookup(guide.func).qualname and invoke.outputs()[0].shape == (12, 2)
    assert torch.equal(guide.func(torch.arange(16.0).view(2, 8)), torch.arange(16.0).view(8, 2))


def test_outputs_annotated_question_mark_keep_their_values(tmp_path):
    dependent = load(tmp_path / "dependent", "guide_dependent_output", DEPENDENT_OUTPUT).op1
    constant = load(tmp_path / "constant", "guide_constant_output", CONSTANT_OUTPUT).op1

    def step(t):
        x, total = dependent(t)
        y, ten = constant(x)
        return y * ten + total

    captured = castcore.capture(step, torch.empty(4, 3))
    assert names(captured)[:2] == [lookup(dependent).qualname, lookup(constant).qualname]
    first, second = captured.invokes[:2]
    assert first.out[1].shape == (3,) and second.out[1] == 10
    x = torch.ones(4, 3)
    y, total = dependent(x)
    assert torch.equal(y, 2 * x) and torch.equal(total, torch.full((3,), 8.0))
    assert constant(x)[1] == 10


def test_a_question_mark_output_that_needs_tensor_values_is_one_line(tmp_path):
    @castcore.register_op("a -> a, ?", name="forms_test::needs_values")
    def needs_values(x):
        return x, int(x.sum())

    with pytest.raises(
        castcore.CaptureError, match=r"forms_test::needs_values: its '\?' output .* fake tensors"
    ):
        castcore.capture(needs_values, torch.empty(3))
    assert needs_values(torch.ones(3))[1] == 3


def test_an_in_place_op_returns_its_changed_input_without_being_told(tmp_path):
    guide = load(tmp_path / "inplace", "guide_inplace", INPLACE)
    x, y = torch.zeros(3), torch.ones(3)
    changed, z = guide.inplace_operator(x, y)
    assert changed is x and torch.equal(x, torch.ones(3)) and torch.equal(z, 2 * x)
    (invoke,) = castcore.capture(guide.inplace_operator, torch.zeros(3), torch.ones(3)).invokes
    x_meta, y_meta = invoke.inputs()
    out_x, out_z = invoke.outputs()
    assert out_x.storage == x_meta.storage and out_z.storage not in (x_meta.storage, y_meta.storage)
    # The schema says x is changed in place (Tensor(a!)), as mutates=["x"] would; y is only read.
    x_arg, y_arg = torch.ops.castcore_user.inplace_operator.default._schema.arguments
    assert x_arg.alias_info is not None and x_arg.alias_info.is_write and y_arg.alias_info is None


def test_optional_tensor_replicated(tmp_path):
    guide = load(tmp_path / "optional", "guide_optional", OPTIONAL_REPLICATED)
    x = torch.ones(3, 3)
    for y in (None, torch.ones(3, 3)):
        (invoke,) = castcore.capture(guide.optional_op, x, y).invokes
        assert invoke.name == "castcore_user::optional_tensor" and invoke.outputs()[0].shape == (3, 3)
    assert torch.equal(guide.optional_op(x, x), torch.triu(x) + x)


def test_optional_tensor_with_an_annotation_function_in_a_fresh_process(tmp_path):
    # The guide gives both optional-tensor examples the same name: each runs in a process of its own.
    script = tmp_path / "guide_optional_anno_fn.py"
    script.write_text(
        OPTIONAL_ANNO_FN
        + textwrap.dedent("""
        x = torch.ones(2, 3)
        print([[i.name for i in nnscaler.capture(optional_op, x, y).invokes] for y in (None, x)])
        print(optional_op(x, None).tolist(), optional_op(x, x).tolist())
    """),
        encoding="utf-8",
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    ops, results = done.stdout.splitlines()
    assert ops == "[['castcore_user::optional_tensor'], ['castcore_user::optional_tensor']]"
    assert results == "[[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]] [[2.0, 2.0, 2.0], [2.0, 2.0, 2.0]]"


@pytest.mark.parametrize("form, scale", [("decorator", 2.0), ("class", 3.0), ("apply", 4.0)])
def test_autograd_function_forms_are_one_op_forward_and_one_backward(tmp_path, form, scale):
    guide = load(tmp_path / form, f"guide_function_{form}", FUNCTION_FORMS[form])
    function = guide.MyFunction
    assert isinstance(function, type)  # the class stays a class; its apply is the op
    op = lookup(function).qualname

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.empty(8, 4))

        def forward(self, x):
            return function.apply(x, self.w)

    assert names(castcore.capture(Model(), torch.empty(2, 8))) == [op]
    report = session().estimate(Model(), torch.empty(2, 8), train=True)
    recorded = [r.invoke.name for r in report.records]
    assert recorded.count(op) == 1 and recorded.count(f"{op}_backward") == 1

    x, w = torch.randn(2, 8, requires_grad=True), torch.randn(8, 4, requires_grad=True)
    function.apply(x, w).sum().backward()
    ones = torch.ones(2, 4)
    torch.testing.assert_close(x.grad, ones @ w.detach().t() * scale)  # the Function's own backward ran
    torch.testing.assert_close(w.grad, x.detach().t() @ ones * scale)


def test_two_autograd_functions_of_one_name_are_two_ops_each_running_its_own_forward(tmp_path):
    first = load(
        tmp_path / "one", "guide_function_one", FUNCTION_FORMS["class"].replace("SCALE = 3.0", "SCALE = 5.0")
    )
    second = load(
        tmp_path / "two", "guide_function_two", FUNCTION_FORMS["class"].replace("SCALE = 3.0", "SCALE = 7.0")
    )
    ops = {lookup(first.MyFunction).qualname, lookup(second.MyFunction).qualname}
    assert len(ops) == 2
    x, w = torch.ones(1, 2), torch.ones(2, 1)
    assert first.MyFunction.apply(x, w).item() == 10.0 and second.MyFunction.apply(x, w).item() == 14.0
    captured = castcore.capture(
        lambda x, w: (first.MyFunction.apply(x, w), second.MyFunction.apply(x, w)), x, w
    )
    assert set(names(captured)) == ops


def test_the_compiled_form(tmp_path):
    guide = load(tmp_path / "compiled", "guide_compiled", COMPILED)
    (invoke,) = castcore.capture(guide.my_function, torch.empty(4, 4, 2)).invokes
    assert invoke.name == "castcore_user::my_function" and invoke.outputs()[0].shape == (4, 4, 2)


def test_an_estimator_file_claims_the_op_it_registers_at_import_time(tmp_path):
    ops = tmp_path / "ops"
    ops.mkdir()
    (ops / "fused.py").write_text(
        textwrap.dedent("""
        import torch
        import castcore

        @castcore.register_op("m k+, k+ n -> m n", name="forms_test::fused")
        def fused(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return a @ b

        @castcore.register_op_estimator(torch.ops.forms_test.fused.default)  # before any call of the op
        def fused_time(invoke, device):
            return 0.25
    """),
        encoding="utf-8",
    )
    mine = castcore.Session(load_packs=[], device_files=[DEVICE_FILE], custom_op_dirs=[ops])
    report = mine.estimate(
        lambda a, b: torch.ops.forms_test.fused(a, b), torch.empty(4, 8), torch.empty(8, 2)
    )
    (record,) = report.records
    assert record.invoke.name == "forms_test::fused" and record.estimate.time_s == 0.25


INPUT_GEN = """
import torch
import castcore as nnscaler

def mock_select(x: torch.Tensor, selected_rows: torch.Tensor):
    return x[selected_rows, :]

def input_gen_fn(node):
    inputs = []
    row = None
    for i, t in enumerate(node.inputs()):
        if i == 1:
            inputs.append(torch.randint(low=0, high=row, size=t.shape, dtype=torch.int64, requires_grad=t.requires_grad))
        else:
            row = t.shape[0]
            inputs.append(torch.rand(t.shape, dtype=t.dtype, requires_grad=t.requires_grad))
    with open(__file__ + ".called", "w") as marker:
        marker.write("yes")
    return tuple(inputs)

nnscaler.register_op('a^ b^, c^ -> c^ b^', input_gen_fn=input_gen_fn)(mock_select)
"""


def test_castcore_measure_uses_an_input_gen_fn_in_the_guides_form(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("CASTCORE_LOAD_PACKS", "")
    ops = tmp_path / "select_ops.py"
    ops.write_text(INPUT_GEN, encoding="utf-8")
    assert (
        main(
            [
                "measure",
                f"{ops}:mock_select",
                "--input",
                "10x4:fp32",
                "--input",
                "6:int64",
                "--repeat",
                "2",
                "--device-file",
                str(DEVICE_FILE),
                "--json",
            ]
        )
        == 0
    )
    (row,) = json.loads(capsys.readouterr().out)["rows"]
    assert row["op"] == "castcore_user::mock_select" and row["error"] == "" and row["measured_s"] > 0
    assert Path(f"{ops}.called").read_text() == "yes"
