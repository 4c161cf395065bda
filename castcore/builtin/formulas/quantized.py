"""The core's quantized operators (castcore.builtin.quantized_ops): the matrix unit's work in the dtype the
product runs in, the (de)quantization's vector work, and the bytes of what each kernel reads and writes."""

from __future__ import annotations

import torch

from castcore.builtin.formulas.matmul import (
    GROUPED,
    grouped_mm_properties,
    matmul_properties,
    routed_experts,
    scaled_mm_properties,
)
from castcore.builtin.quantized_ops import OPS, in_features
from castcore.devices.costs import PerformanceProperties
from castcore.plugins.claims import register_op_properties
from castcore.recording.invoke import OpInvoke

# A weight-only kernel moves each code into a float with bit operations, then applies the scale (and the int4
# offset) with one fused multiply-add: 2 operations per weight element, once per call.
DEQUANTIZE = 2
# Per activation element: its magnitude and the running maximum for the row's scale, the multiply by the
# reciprocal scale, and the round and clamp to the code range.
QUANTIZE = 1 + 1 + 1 + 2


@register_op_properties(OPS["weight_only_linear"])
def _weight_only_linear(invoke: OpInvoke, device) -> PerformanceProperties:
    """2*M*N*K on the matrix unit in the activations' dtype (the weight is dequantized to it), and the
    dequantization of every weight element; x, the packed weight, its scales and the bias read once, the output
    written once: the weight is never written back in the activations' dtype."""
    x, qweight = invoke.args[:2]
    has_bias = invoke.argument("bias") is not None
    props = matmul_properties(invoke, x, extra_gp_per_output=int(has_bias))
    return props.add(x.dtype, gp=DEQUANTIZE * qweight.shape[0] * x.shape[-1])


@register_op_properties(OPS["weight_only_grouped_mm"])
def _weight_only_grouped_mm(invoke: OpInvoke, device) -> PerformanceProperties:
    """As weight_only_linear per expert, over the experts the rows are expected to touch (their weights and
    scales are all that is read and dequantized; see matmul.routed_experts)."""
    x, qweight, scales = invoke.args[:3]
    rows, columns = x.shape
    experts, out_features = qweight.shape[:2]
    touched = routed_experts(invoke, experts, rows)
    props = invoke.memory_access_properties()
    props.memory_read_bytes -= (qweight.nbytes + scales.nbytes) * (1 - touched / max(1, experts))
    props.kernel = GROUPED
    return props.add(
        x.dtype, mma=2 * rows * out_features * columns, gp=DEQUANTIZE * touched * out_features * columns
    )


@register_op_properties(OPS["quantize_per_token"])
@register_op_properties(OPS["quantize_per_token_group"])
@register_op_properties(OPS["quantize_blocks"])
def _quantize_per_token(invoke: OpInvoke, device) -> PerformanceProperties:
    """The same vector work per element whether a row has one scale or one per group of columns."""
    x = invoke.args[0]
    return invoke.memory_access_properties().add(x.dtype, gp=QUANTIZE * x.numel())


@register_op_properties(OPS["int8_scaled_mm"])
def _int8_scaled_mm(invoke: OpInvoke, device) -> PerformanceProperties:
    """As torch._scaled_mm (matmul.py): int8 products on the matrix unit, the epilogue on the fp32 accumulators."""
    return scaled_mm_properties(invoke)


@register_op_properties(OPS["dequantize_int_mm"])
def _dequantize_int_mm(invoke: OpInvoke, device) -> PerformanceProperties:
    """Two multiplies per int32 accumulator (the token's scale, the channel's) and the bias add, in fp32."""
    acc = invoke.args[0]
    has_bias = invoke.argument("bias") is not None
    return invoke.memory_access_properties().add(torch.float32, gp=(2 + has_bias) * acc.numel())


@register_op_properties(OPS["int8_scaled_grouped_mm"])
def _int8_scaled_grouped_mm(invoke: OpInvoke, device) -> PerformanceProperties:
    """As torch._scaled_grouped_mm: int8 products on the matrix unit, the scales applied to the accumulators."""
    return grouped_mm_properties(invoke, (invoke.argument("scale_b"),))


def _block_scaled_work(props: PerformanceProperties, invoke: OpInvoke, b, rows: int, weights: float):
    """The product at the matrix unit's rate for the activations' format, a's dtype: fp4 by fp4 at the fp4 rate;
    fp8 activations by fp4 weights at the fp8 one (Blackwell's kind::mxf8f6f4 MMA runs at the FP8 rate, its
    kind::mxf4 and mxf4nvf4 at twice that: "Blackwell SM100 GEMMs", CUTLASS documentation,
    https://docs.nvidia.com/cutlass/media/docs/cpp/blackwell_functionality.html, read 2026-11-27). The block
    scales apply inside the MMA; int4 weights are converted to fp8 in registers (DEQUANTIZE per element of the
    ``weights`` read); the epilogue scales each fp32 accumulator (and alpha, and the bias)."""
    a, out = invoke.args[0], invoke.outputs()[0]
    extra = 1 + (invoke.argument("alpha") is not None) + (invoke.argument("bias") is not None)
    props.add(a.dtype, mma=2 * rows * b.shape[-2] * in_features(b))
    if b.dtype == torch.uint8:
        props.add(out.dtype, gp=DEQUANTIZE * weights)
    return props.add(torch.float32, gp=extra * out.numel())


@register_op_properties(OPS["block_scaled_mm"])
def _block_scaled_mm(invoke: OpInvoke, device) -> PerformanceProperties:
    a, b = invoke.args[:2]
    props = invoke.memory_access_properties()
    props.matmuls.append((1, a.shape[0], b.shape[0], in_features(b)))
    return _block_scaled_work(props, invoke, b, a.shape[0], b.shape[0] * in_features(b))


@register_op_properties(OPS["block_scaled_grouped_mm"])
def _block_scaled_grouped_mm(invoke: OpInvoke, device) -> PerformanceProperties:
    """As block_scaled_mm per expert, over the experts the rows are expected to touch (see matmul.routed_experts)."""
    a, b, _, scale_b = invoke.args[:4]
    touched = routed_experts(invoke, b.shape[0], a.shape[0])
    props = invoke.memory_access_properties()
    props.memory_read_bytes -= (b.nbytes + scale_b.nbytes) * (1 - touched / max(1, b.shape[0]))
    props.kernel = GROUPED
    return _block_scaled_work(props, invoke, b, a.shape[0], touched * b.shape[1] * in_features(b))
