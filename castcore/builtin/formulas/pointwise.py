"""Pointwise ops: vector operations per output element, from a small table; everything else is 1.

The counts are FLOP-style (a multiply-add is 2) and deliberately coarse: what matters is that
an ``exp`` or a ``gelu`` costs several times an ``add`` on a vector unit, not the exact
instruction mix of one vendor's math library.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from castcore.devices.costs import PerformanceProperties
from castcore.recording.invoke import OpInvoke

aten = torch.ops.aten

# The building blocks the table is made of.
DIV = 2  # a division or reciprocal: a reciprocal estimate and a Newton step
SQRT = 2  # sqrt, rsqrt: the same
TRANSCENDENTAL = 4  # exp, log, sin, erf...: range reduction plus a special-function or polynomial step
SIGMOID = TRANSCENDENTAL + 1 + DIV  # 1 / (1 + exp(-x))
TANH = TRANSCENDENTAL + 2 + DIV  # (1 - exp(-2x)) / (1 + exp(-2x))
SOFTPLUS = 2 * TRANSCENDENTAL + 2  # log1p(exp(x)), with the threshold compare and select
RANDOM = 4  # one draw of a counter-based generator (Philox), per element

# Vector operations per output element, by op name (every overload and the in-place form share it).
OPS_PER_ELEMENT: dict[str, int] = {
    "div": DIV,
    "true_divide": DIV,
    "reciprocal": DIV,
    "floor_divide": DIV + 1,
    "remainder": DIV + 2,
    "fmod": DIV + 2,
    "sqrt": SQRT,
    "rsqrt": SQRT,
    "exp": TRANSCENDENTAL,
    "exp2": TRANSCENDENTAL,
    "expm1": TRANSCENDENTAL,
    "log": TRANSCENDENTAL,
    "log2": TRANSCENDENTAL,
    "log10": TRANSCENDENTAL,
    "log1p": TRANSCENDENTAL,
    "sin": TRANSCENDENTAL,
    "cos": TRANSCENDENTAL,
    "tan": TRANSCENDENTAL,
    "atan": TRANSCENDENTAL,
    "erf": TRANSCENDENTAL,
    "erfc": TRANSCENDENTAL,
    "erfinv": TRANSCENDENTAL,
    "xlogy": TRANSCENDENTAL + 1,
    "atan2": TRANSCENDENTAL + DIV,
    "logit": TRANSCENDENTAL + DIV + 1,
    "sigmoid": SIGMOID,
    "tanh": TANH,
    "silu": SIGMOID + 1,
    "softplus": SOFTPLUS,
    "mish": SOFTPLUS + TANH + 1,
    "elu": TRANSCENDENTAL + 3,
    "celu": TRANSCENDENTAL + DIV + 3,
    "selu": TRANSCENDENTAL + 4,
    "hardswish": 4,
    "hardsigmoid": 3,
    "hardtanh": 2,
    "clamp": 2,
    "leaky_relu": 2,
    "lerp": 3,
    "addcmul": 3,
    "addcdiv": DIV + 2,
    "sigmoid_backward": 3,
    "tanh_backward": 3,  # g * y * (1 - y), g * (1 - y * y)
    "silu_backward": SIGMOID + 4,  # g * s * (1 + x * (1 - s)), s = sigmoid(x)
    "native_dropout_backward": 2,  # g * mask * scale
    "log_sigmoid_forward": SOFTPLUS,
    "log_sigmoid_backward": SIGMOID + 2,
    "softplus_backward": SIGMOID + 2,
    "mish_backward": SOFTPLUS + TANH + SIGMOID + 4,
    "glu": SIGMOID + 1,
    "glu_backward": SIGMOID + 4,
    "elu_backward": 3,
    "leaky_relu_backward": 2,
    "hardtanh_backward": 2,
    "hardsigmoid_backward": 3,
    "hardswish_backward": 4,
    "_prelu_kernel": 2,
}
# Elementwise ops torch does not tag ``pointwise`` in any overload.
UNTAGGED_POINTWISE = {
    "floor_divide",
    "hardswish",
    "hardswish_backward",
    "log_sigmoid_forward",
    "log_sigmoid_backward",
    "softplus_backward",
    "elu_backward",
    "leaky_relu_backward",
    "hardtanh_backward",
    "hardsigmoid_backward",
    "mish_backward",
    "_prelu_kernel",
    "glu",
    "glu_backward",
}

# gelu(x) = x/2 * (1 + erf(x/sqrt 2)), or with approximate="tanh": x/2 * (1 + tanh(c * (x + 0.044715 x^3)))
GELU = {"none": TRANSCENDENTAL + 4, "tanh": TANH + 7}
# The backward adds the density (an exp) to the forward's terms.
GELU_BACKWARD = {"none": 2 * TRANSCENDENTAL + 8, "tanh": TANH + 13}


def pow_ops(exponent: Any) -> int:
    """x ** e: a multiply for small whole powers, a square root for halves, else exp(e * log(x))."""
    if isinstance(exponent, (int, float)) and not isinstance(exponent, bool):
        if exponent in (0, 1, 2):
            return 1
        if exponent in (0.5, -0.5):
            return SQRT
        if float(exponent).is_integer() and abs(exponent) <= 4:
            return 2 + (DIV if exponent < 0 else 0)
    return 2 * TRANSCENDENTAL + 1


def base_name(op: Any) -> str:
    """``add`` for aten.add.Tensor and aten.add_.Tensor: the name the table and the families use."""
    name = op._schema.name.split("::")[-1]
    return name[:-1] if name.endswith("_") and not name.endswith("__") else name


def ops_per_element(invoke: OpInvoke) -> int:
    name = base_name(invoke.op)
    if name == "gelu":
        return GELU.get(invoke.argument("approximate", "none"), GELU["tanh"])
    if name == "gelu_backward":
        return GELU_BACKWARD.get(invoke.argument("approximate", "none"), GELU_BACKWARD["tanh"])
    if name == "pow":
        return pow_ops(invoke.argument("exponent"))
    return OPS_PER_ELEMENT.get(name, 1)


@functools.cache
def is_pointwise(op: Any) -> bool:
    """torch's ``pointwise`` tag, trusted for the whole op family: torch tags overloads unevenly
    (``masked_fill.Scalar`` has it, ``masked_fill.Tensor`` and ``masked_fill_`` do not)."""
    tags = getattr(op, "tags", ())
    if torch.Tag.pointwise in tags:
        return True
    if torch.Tag.reduction in tags or not hasattr(op, "_schema") or op.namespace != "aten":
        return False
    if base_name(op) in UNTAGGED_POINTWISE:
        return True
    packet = getattr(aten, base_name(op), None)
    return packet is not None and any(
        torch.Tag.pointwise in getattr(packet, o).tags for o in packet.overloads()
    )


def compute_dtype(invoke: OpInvoke) -> torch.dtype | None:
    """The dtype the work is done in: the result's, or the inputs' for a comparison's bool result."""
    outs = invoke.outputs()
    if not outs:
        return None
    if outs[0].dtype == torch.bool:
        ins = [t for t in invoke.inputs() if t.dtype != torch.bool]
        if ins:
            return ins[0].dtype
    return outs[0].dtype


def pointwise_properties(invoke: OpInvoke) -> PerformanceProperties | None:
    """ops_per_element for each element of the (broadcast) result; inputs read and result written once."""
    dtype = compute_dtype(invoke)
    if dtype is None:
        return None
    out = invoke.outputs()[0]
    return invoke.memory_access_properties().add(dtype, gp=ops_per_element(invoke) * out.numel())
