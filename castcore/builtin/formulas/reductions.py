"""Reductions, softmax, normalisations, scans, sorting, pooling and the NLL loss: vector work in the
dtype of the data, every input read and every output written once unless a formula says otherwise."""

from __future__ import annotations

import math

import torch

from castcore.builtin.formulas.pointwise import DIV, SQRT, TRANSCENDENTAL, base_name
from castcore.devices.costs import PerformanceProperties
from castcore.plugins.claims import register_op_properties
from castcore.recording.invoke import OpInvoke, TensorMeta

aten = torch.ops.aten

# Ops tagged ``reduction``: (vector ops per input element, per output element); default (1, 0): one
# add, max or compare per element read. The variance is a mean pass plus (x - mean)^2 accumulated.
REDUCTION_OPS: dict[str, tuple[int, int]] = {
    "mean": (1, 1),
    "var": (4, 1),
    "std": (4, 1 + SQRT),
    "var_mean": (4, 2),
    "std_mean": (4, 2 + SQRT),
    "logsumexp": (3 + TRANSCENDENTAL, 1 + TRANSCENDENTAL),  # max, subtract, exp, sum; then log, add max
    "norm": (2, SQRT),
    "linalg_vector_norm": (2, SQRT),  # x * x accumulated, then sqrt (p = 2)
}


def reduction_properties(invoke: OpInvoke) -> PerformanceProperties | None:
    ins, outs = invoke.inputs(), invoke.outputs()
    if not ins:
        return None
    per_input, per_output = REDUCTION_OPS.get(base_name(invoke.op), (1, 0))
    gp = per_input * ins[0].numel() + per_output * (outs[0].numel() if outs else 0)
    return invoke.memory_access_properties().add(ins[0].dtype, gp=gp)


def elementwise(invoke: OpInvoke, x: TensorMeta, ops_per_element: float) -> PerformanceProperties:
    """Inputs read and outputs written once, ``ops_per_element`` vector ops per element of ``x``."""
    return invoke.memory_access_properties().add(x.dtype, gp=ops_per_element * x.numel())


# Softmax: max, subtract, exp, sum, scale by the sum's reciprocal. log_softmax swaps the last step for
# subtracting the log of the sum: the same count.
SOFTMAX_OPS_PER_ELEMENT = 4 + TRANSCENDENTAL


@register_op_properties(aten._softmax.default)
@register_op_properties(aten._log_softmax.default)
@register_op_properties(aten._safe_softmax.default)
def _softmax(invoke: OpInvoke, device) -> PerformanceProperties:
    return elementwise(invoke, invoke.outputs()[0], SOFTMAX_OPS_PER_ELEMENT)


@register_op_properties(aten._softmax_backward_data.default)
def _softmax_backward(invoke: OpInvoke, device) -> PerformanceProperties:
    # y * (g - sum(g * y)): multiply-add into the sum, subtract, multiply.
    return elementwise(invoke, invoke.outputs()[0], 4)


@register_op_properties(aten._log_softmax_backward_data.default)
def _log_softmax_backward(invoke: OpInvoke, device) -> PerformanceProperties:
    # g - exp(y) * sum(g): the sum, the exp, a multiply-add.
    return elementwise(invoke, invoke.outputs()[0], 3 + TRANSCENDENTAL)


# Normalisation per element: statistics (mean: 1; variance: 3, or mean of squares for RMS: 2),
# normalise ((x - mean) * rstd: 2; x * rstd: 1), then 1 per affine weight and bias. Per-row terms
# (the rsqrt of the variance) are negligible and left out.
def _norm(invoke: OpInvoke, per_element: int) -> PerformanceProperties:
    affine = (invoke.argument("weight") is not None) + (invoke.argument("bias") is not None)
    return elementwise(invoke, invoke.argument("input"), per_element + affine)


@register_op_properties(aten.native_layer_norm.default)
@register_op_properties(aten.native_group_norm.default)
def _layer_norm(invoke: OpInvoke, device) -> PerformanceProperties:
    return _norm(invoke, 1 + 3 + 2)


@register_op_properties(aten._fused_rms_norm.default)
@register_op_properties(aten.rms_norm.default)
def _rms_norm(invoke: OpInvoke, device) -> PerformanceProperties:
    return _norm(invoke, 2 + 1)


@register_op_properties(aten.native_batch_norm.default)
@register_op_properties(aten._native_batch_norm_legit.default)
@register_op_properties(aten._native_batch_norm_legit.no_stats)
@register_op_properties(aten._native_batch_norm_legit_functional.default)
@register_op_properties(aten._native_batch_norm_legit_no_training.default)
def _batch_norm(invoke: OpInvoke, device) -> PerformanceProperties:
    # Inference normalises with the running statistics: no statistics pass.
    statistics = 1 + 3 if invoke.argument("training", False) else 0
    return _norm(invoke, statistics + 2)


# Backward per element: x_hat (2; 1 for RMS), g * weight, two row sums (1 + 2) and the input
# gradient's 3 combining ops; grad_weight sums g * x_hat (2), grad_bias sums g (1).
@register_op_properties(aten.native_layer_norm_backward.default)
@register_op_properties(aten.native_group_norm_backward.default)
@register_op_properties(aten.native_batch_norm_backward.default)
@register_op_properties(aten._fused_rms_norm_backward.default)
def _norm_backward(invoke: OpInvoke, device) -> PerformanceProperties:
    mask = tuple(invoke.argument("output_mask")) + (False,) * 3
    x_hat = 1 if base_name(invoke.op) == "_fused_rms_norm_backward" else 2
    grad_input = 6 + (invoke.argument("weight") is not None)
    per_element = x_hat + mask[0] * grad_input + mask[1] * 2 + mask[2] * 1
    return elementwise(invoke, invoke.argument("input"), per_element)


# Scans: one op per element along the scan (log-add-exp for logcumsumexp).
@register_op_properties(aten.cumsum.default)
@register_op_properties(aten.cumprod.default)
@register_op_properties(aten.cummax.default)
@register_op_properties(aten.cummin.default)
@register_op_properties(aten.logcumsumexp.default)
def _scan(invoke: OpInvoke, device) -> PerformanceProperties:
    per_element = 2 * TRANSCENDENTAL + 2 if base_name(invoke.op) == "logcumsumexp" else 1
    return elementwise(invoke, invoke.args[0], per_element)


@register_op_properties(aten.histc.default)
def _histc(invoke: OpInvoke, device) -> PerformanceProperties:
    # Per element: its bin ((x - min) * scale, floored, range-checked) and an add into that bin.
    return elementwise(invoke, invoke.args[0], 4)


@register_op_properties(aten.searchsorted.Tensor)
@register_op_properties(aten.bucketize.Tensor)
def _binary_search(invoke: OpInvoke, device) -> PerformanceProperties:
    # A binary search per element: log2(len(boundaries)) compares.
    boundaries = invoke.argument("sorted_sequence", invoke.argument("boundaries"))
    return elementwise(invoke, invoke.argument("self"), math.ceil(math.log2(max(boundaries.shape[-1], 2))))


def _rows(x: TensorMeta, dim: int) -> tuple[int, int]:
    """(rows, row length) of x along dim."""
    n = x.shape[dim] if x.dim() else 1
    return (x.numel() // n if n else 0), n


@register_op_properties(aten.sort.default)
@register_op_properties(aten.sort.stable)
@register_op_properties(aten.argsort.default)
@register_op_properties(aten.argsort.stable)
def _sort(invoke: OpInvoke, device) -> PerformanceProperties:
    # A comparison sort: n * log2(n) compares per sorted row of n.
    x = invoke.args[0]
    rows, n = _rows(x, invoke.argument("dim", -1))
    return invoke.memory_access_properties().add(x.dtype, gp=rows * n * math.log2(n) if n > 1 else 0)


@register_op_properties(aten.topk.default)
def _topk(invoke: OpInvoke, device) -> PerformanceProperties:
    # Selection through a heap of k: n * log2(k) compares per row (at least one per element).
    x, k = invoke.args[0], invoke.argument("k")
    rows, n = _rows(x, invoke.argument("dim", -1))
    return invoke.memory_access_properties().add(x.dtype, gp=rows * n * math.log2(max(k, 2)))


def _kernel_taps(invoke: OpInvoke) -> int:
    return math.prod(invoke.argument("kernel_size"))


@register_op_properties(aten.max_pool2d_with_indices.default)
@register_op_properties(aten.max_pool3d_with_indices.default)
@register_op_properties(aten.avg_pool2d.default)
@register_op_properties(aten.avg_pool3d.default)
def _pool(invoke: OpInvoke, device) -> PerformanceProperties:
    # One compare (max) or add (avg) per kernel tap per output element.
    return elementwise(invoke, invoke.outputs()[0], _kernel_taps(invoke))


@register_op_properties(aten.max_pool2d_with_indices_backward.default)
@register_op_properties(aten.max_pool3d_with_indices_backward.default)
def _max_pool_backward(invoke: OpInvoke, device) -> PerformanceProperties:
    # Zero grad_input, then add each grad_output element at its index; the forward input is not read.
    grad_output, indices, grad_input = invoke.args[0], invoke.argument("indices"), invoke.outputs()[0]
    props = PerformanceProperties(
        memory_read_bytes=grad_output.nbytes + indices.nbytes, memory_write_bytes=grad_input.nbytes
    )
    return props.add(grad_output.dtype, gp=grad_output.numel())


@register_op_properties(aten._adaptive_avg_pool2d.default)
@register_op_properties(aten._adaptive_avg_pool3d.default)
def _adaptive_avg_pool(invoke: OpInvoke, device) -> PerformanceProperties:
    # Each input element is added into (about) one window, then each output divided.
    x, out = invoke.args[0], invoke.outputs()[0]
    return invoke.memory_access_properties().add(x.dtype, gp=x.numel() + DIV * out.numel())


@register_op_properties(aten.avg_pool2d_backward.default)
@register_op_properties(aten._adaptive_avg_pool2d_backward.default)
def _avg_pool_backward(invoke: OpInvoke, device) -> PerformanceProperties:
    # Each grad_input element gathers from the windows covering it (about one): reads grad_output only.
    grad_output, grad_input = invoke.args[0], invoke.outputs()[0]
    props = PerformanceProperties(memory_read_bytes=grad_output.nbytes, memory_write_bytes=grad_input.nbytes)
    return props.add(grad_output.dtype, gp=grad_input.numel())


@register_op_properties(aten.nll_loss_forward.default)
@register_op_properties(aten.nll_loss2d_forward.default)
def _nll_loss(invoke: OpInvoke, device) -> PerformanceProperties:
    # Gathers one log-probability per target (and its class weight), and sums them.
    x, target, weight = invoke.args[0], invoke.args[1], invoke.argument("weight")
    touched = target.numel() * (x.element_size() + (weight.element_size() if weight is not None else 0))
    props = PerformanceProperties(
        memory_read_bytes=target.nbytes + touched, memory_write_bytes=sum(t.nbytes for t in invoke.outputs())
    )
    return props.add(x.dtype, gp=(1 + (weight is not None)) * target.numel())


@register_op_properties(aten.nll_loss_backward.default)
@register_op_properties(aten.nll_loss2d_backward.default)
def _nll_loss_backward(invoke: OpInvoke, device) -> PerformanceProperties:
    # Writes a zeroed grad_input of the input's shape with one value per target; the input is not read.
    grad_output, target, weight = invoke.args[0], invoke.argument("target"), invoke.argument("weight")
    grad_input = invoke.outputs()[0]
    read = (
        grad_output.nbytes
        + target.nbytes
        + (target.numel() * weight.element_size() if weight is not None else 0)
    )
    props = PerformanceProperties(memory_read_bytes=read, memory_write_bytes=grad_input.nbytes)
    return props.add(grad_input.dtype, gp=(1 + (weight is not None)) * target.numel())
