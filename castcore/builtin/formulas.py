"""The core's op_properties formulas for aten operators.

Conventions: one multiply-add is 2 operations; matrix products count on the matrix unit
(``mma_ops``) in the dtype of their inputs; everything else on the vector unit (``gp_ops``).
Memory is every input read once and every output written once unless a formula says otherwise.
"""

from __future__ import annotations

import math

import torch

from ..claims import register_op_properties
from ..invoke import OpInvoke
from ..properties import PerformanceProperties

aten = torch.ops.aten


def _matmul_props(invoke: OpInvoke, a, extra_gp_per_output: int = 0) -> PerformanceProperties:
    """2*M*N*K per (broadcast) batch: the output's element count times the shared dim K = a.shape[-1]."""
    out = invoke.outputs()[0]
    props = invoke.memory_access_properties()
    return props.add(a.dtype, mma=2 * out.numel() * a.shape[-1], gp=extra_gp_per_output * out.numel())


@register_op_properties(aten.mm.default)
@register_op_properties(aten.bmm.default)
@register_op_properties(aten.matmul.default)
def _matmul(invoke: OpInvoke, device) -> PerformanceProperties:
    return _matmul_props(invoke, invoke.args[0])


@register_op_properties(aten.addmm.default)
@register_op_properties(aten.baddbmm.default)
def _addmm(invoke: OpInvoke, device) -> PerformanceProperties:
    # out = beta * self + alpha * (a @ b): one extra add per output element.
    return _matmul_props(invoke, invoke.args[1], extra_gp_per_output=1)


@register_op_properties(aten.linear.default)
def _linear(invoke: OpInvoke, device) -> PerformanceProperties:
    has_bias = invoke.argument("bias") is not None
    return _matmul_props(invoke, invoke.args[0], extra_gp_per_output=int(has_bias))


def causal_pairs(q_len: int, kv_len: int) -> int:
    """(query, key) pairs a causal mask keeps, upper-left aligned as torch's is_causal: key j <= query i."""
    if q_len <= kv_len:
        return q_len * (q_len + 1) // 2
    return kv_len * (kv_len + 1) // 2 + (q_len - kv_len) * kv_len


# Vector operations per attention score: scale, running max, subtract, exp, sum.
SOFTMAX_OPS_PER_SCORE = 5

_ATTENTION_OPS = [
    aten._scaled_dot_product_flash_attention_for_cpu.default,
    aten._scaled_dot_product_flash_attention.default,
    aten._scaled_dot_product_efficient_attention.default,
    aten._scaled_dot_product_cudnn_attention.default,
    aten._scaled_dot_product_attention_math.default,
    aten.scaled_dot_product_attention.default,
]


def attention_properties(invoke: OpInvoke) -> PerformanceProperties:
    """Scores and weighted sum as two matrix products over the pairs attention keeps.

    A causal call counts only the unmasked pairs (about half of a square attention), the
    work a causal-aware kernel does. GQA needs no special case: FLOPs follow the query heads.
    """
    q, k, v = invoke.args[:3]
    *batch, q_len, head_dim = q.shape
    kv_len, v_dim = k.shape[-2], v.shape[-1]
    heads = math.prod(batch)
    pairs = causal_pairs(q_len, kv_len) if invoke.argument("is_causal", False) else q_len * kv_len
    props = invoke.memory_access_properties()
    return props.add(q.dtype, mma=2 * heads * pairs * (head_dim + v_dim), gp=SOFTMAX_OPS_PER_SCORE * heads * pairs)


def _attention(invoke: OpInvoke, device) -> PerformanceProperties:
    return attention_properties(invoke)


for _op in _ATTENTION_OPS:
    register_op_properties(_op)(_attention)


def _memory_only(invoke: OpInvoke, device) -> PerformanceProperties:
    return invoke.memory_access_properties()


# Pure data movement: memory-only is the formula, not a fallback.
for _op in (aten._to_copy.default, aten.clone.default, aten.copy_.default, aten.cat.default,
            aten.stack.default, aten.contiguous.default):
    register_op_properties(_op)(_memory_only)


@register_op_properties(aten.embedding.default)
def _embedding(invoke: OpInvoke, device) -> PerformanceProperties:
    # Reads only the gathered rows of the table, not all of it.
    indices, out = invoke.args[1], invoke.outputs()[0]
    return PerformanceProperties(memory_read_bytes=indices.nbytes + out.nbytes, memory_write_bytes=out.nbytes)


# Allocation without initialisation: no work at all.
_FREE = {aten.empty.memory_format, aten.empty_strided.default, aten.new_empty.default,
         aten.empty_like.default, aten._unsafe_view.default, torch.ops.prim.device.default}
# Fills: write the output, read nothing.
_FILLS = {aten.zeros.default, aten.ones.default, aten.full.default, aten.arange.default, aten.arange.start,
          aten.arange.start_step, aten.scalar_tensor.default, aten.new_ones.default, aten.new_zeros.default,
          aten.new_full.default, aten.zeros_like.default, aten.ones_like.default, aten.full_like.default,
          aten.fill_.Scalar}


def by_tag(invoke: OpInvoke) -> PerformanceProperties | None:
    """Properties for whole families of ops, recognised from torch's own op metadata."""
    op = invoke.op
    if getattr(op, "is_view", False) or op in _FREE:
        return PerformanceProperties()
    if op in _FILLS:
        return PerformanceProperties(memory_write_bytes=sum(t.nbytes for t in invoke.outputs()))
    tags = getattr(op, "tags", ())
    if torch.Tag.pointwise in tags:
        outs = invoke.outputs()
        if not outs:
            return None
        return invoke.memory_access_properties().add(outs[0].dtype, gp=outs[0].numel())
    if torch.Tag.reduction in tags:
        ins = invoke.inputs()
        if not ins:
            return None
        return invoke.memory_access_properties().add(ins[0].dtype, gp=ins[0].numel())
    return None
