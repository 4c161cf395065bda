"""Element-wise ops, norms and softmax on the vector unit, in whole 32-byte blocks.

Operations per element are the core's (``castcore.pack.formulas``: an add is 1, an exp 4, ...), so the
pack and the core agree on FLOPs; what the pack adds is how the vector unit spends them:
- element-wise ops stream the flattened tensor: elements rounded up to one 32-byte block;
- row-wise ops (softmax, norms, reductions over the last dim) work row by row, so every row is rounded up
  to whole 32-byte blocks (a 4095-wide bf16 row costs 4096 lanes, a 100-wide fp32 row 104);
- the rate is the profile's vector rate for the dtype (bf16 runs at the fp32 rate on 910B/910C);
- the fixed cost per kernel is the profile's ``gp_op_cost_s``.
"""

from __future__ import annotations

import torch

from castcore import pack
from castcore.pack import formulas

from .hardware import padded_rows, round_up, block_elements, timed

aten = torch.ops.aten
DEVICES = "ascend-*"

ELEMENTWISE = [
    aten.add.Tensor, aten.add.Scalar, aten.sub.Tensor, aten.sub.Scalar, aten.mul.Tensor, aten.mul.Scalar,
    aten.div.Tensor, aten.div.Scalar, aten.neg.default, aten.exp.default, aten.rsqrt.default,
    aten.sqrt.default, aten.reciprocal.default, aten.pow.Tensor_Scalar, aten.silu.default, aten.gelu.default,
    aten.sigmoid.default, aten.tanh.default, aten.relu.default, aten.where.self, aten.maximum.default,
    aten.minimum.default, aten.clamp.default,
]


def vector_estimate(invoke, device, dtype, ops: float, detail: dict) -> pack.Estimate:
    props = invoke.memory_access_properties()
    return timed(device, vector={dtype: ops}, read_bytes=props.memory_read_bytes,
                 write_bytes=props.memory_write_bytes, detail=detail)


def elementwise(invoke, device):
    dtype = formulas.pointwise.compute_dtype(invoke)
    out = invoke.outputs()[0]
    per = formulas.pointwise.ops_per_element(invoke)
    lanes = round_up(out.numel(), block_elements(dtype))
    return vector_estimate(invoke, device, dtype, per * lanes,
                           {"ops_per_element": per, "elements": out.numel(), "padded_elements": lanes})


for _op in ELEMENTWISE:
    pack.register_op_estimator(_op, device=DEVICES)(elementwise)


def rowwise(invoke, device, x, per: float) -> pack.Estimate:
    lanes = padded_rows(x.shape, x.dtype)
    return vector_estimate(invoke, device, x.dtype, per * lanes,
                           {"ops_per_element": per, "elements": x.numel(), "padded_elements": lanes,
                            "padded_shape": "x".join(map(str, (*x.shape[:-1],
                                                               round_up(x.shape[-1], block_elements(x.dtype)))))})


@pack.register_op_estimator(aten._softmax.default, device=DEVICES)
@pack.register_op_estimator(aten._log_softmax.default, device=DEVICES)
@pack.register_op_estimator(aten._safe_softmax.default, device=DEVICES)
def softmax(invoke, device):
    return rowwise(invoke, device, invoke.args[0], formulas.reductions.SOFTMAX_OPS_PER_ELEMENT)


def _affine(invoke) -> int:
    return (invoke.argument("weight") is not None) + (invoke.argument("bias") is not None)


@pack.register_op_estimator(aten.native_layer_norm.default, device=DEVICES)
def layer_norm(invoke, device):
    return rowwise(invoke, device, invoke.args[0], 6 + _affine(invoke))  # mean 1, variance 3, normalise 2


@pack.register_op_estimator(aten._fused_rms_norm.default, device=DEVICES)
@pack.register_op_estimator(aten.rms_norm.default, device=DEVICES)
def rms_norm(invoke, device):
    return rowwise(invoke, device, invoke.args[0], 3 + _affine(invoke))  # mean of squares 2, scale 1


@pack.register_op_estimator(aten.mean.dim, device=DEVICES)
@pack.register_op_estimator(aten.sum.dim_IntList, device=DEVICES)
def reduce_last(invoke, device):
    x = invoke.args[0]
    per_in, per_out = formulas.reductions.REDUCTION_OPS.get(formulas.pointwise.base_name(invoke.op), (1, 0))
    out = invoke.outputs()[0]
    lanes = padded_rows(x.shape, x.dtype)
    return vector_estimate(invoke, device, x.dtype, per_in * lanes + per_out * out.numel(),
                           {"ops_per_element": per_in, "elements": x.numel(), "padded_elements": lanes})


@pack.register_op_estimator(torch.ops.castcore.quantize_per_token.default, device=DEVICES)
def dynamic_quant(invoke, device):
    """npu_dynamic_quant: a row's largest magnitude, then every element scaled, rounded and cast, row by row."""
    return rowwise(invoke, device, invoke.args[0], formulas.quantized.QUANTIZE)
