"""Every scaled-dot-product attention kernel, forward and backward, counted over the (query, key)
pairs it keeps.

Forward: scores S = Q K^T and the weighted sum P V, two matrix products.
Backward (FlashAttention's algorithm, and torch's FlopCounterMode): recompute S, then dP = dO V^T,
dV = P^T dO, dQ = dS K, dK = dS^T Q: five products, 2.5x the forward when the head dims are equal.
GQA needs no special case: the work follows the query heads; K and V are read at their own size.
"""

from __future__ import annotations

import math

import torch

from castcore.builtin.formulas.matmul import product_dtype
from castcore.builtin.formulas.pointwise import TRANSCENDENTAL
from castcore.devices.costs import PerformanceProperties
from castcore.plugins.claims import register_op_properties
from castcore.recording.invoke import OpInvoke

aten = torch.ops.aten

# Vector operations per kept score. Forward: scale, running max, subtract, exp, sum.
SOFTMAX_OPS_PER_SCORE = 4 + TRANSCENDENTAL
# Backward: scale, subtract the log-sum-exp, exp (recomputing P), then dS = P * (dP - D) and its scale.
SOFTMAX_BACKWARD_OPS_PER_SCORE = 5 + TRANSCENDENTAL


def causal_pairs(q_len: int, kv_len: int, bottom_right: bool = False) -> int:
    """(query, key) pairs a causal mask keeps: key j <= query i, upper-left aligned as torch's is_causal.

    ``bottom_right`` aligns the last query with the last key instead (key j <= i + kv_len - q_len), as
    xformers' custom_mask_type=2 and a decode step over a KV cache do.
    """
    offset = kv_len - q_len if bottom_right else 0
    # Row i keeps min(kv_len, max(0, i + offset + 1)) keys: none before row lo, all of them from row hi.
    lo = min(q_len, max(0, -offset))
    hi = min(q_len, max(lo, kv_len - offset - 1))
    partial = (hi - lo) * (offset + 1) + (hi - lo) * (lo + hi - 1) // 2
    return partial + (q_len - hi) * kv_len


def _dims(invoke: OpInvoke, layout: str) -> tuple[int, int, int, int, int]:
    """(sequences x query heads, q_len, kv_len, qk head dim, v head dim) for the call."""
    q, k, v = invoke.argument("query"), invoke.argument("key"), invoke.argument("value")
    if layout == "bhsd":  # the SDPA ops: (batch..., heads, seq, dim)
        return math.prod(q.shape[:-2]), q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1]
    # The flash / xformers kernels: (batch, seq, heads, dim), or sequences packed as (tokens, heads, dim)
    # with cumulative lengths; only the lengths' sum is known then, so the sequences count as equal.
    cum_q = invoke.argument("cum_seq_q", invoke.argument("cu_seqlens_q"))
    seqs = max(1, cum_q.numel() - 1) if cum_q is not None else q.shape[0]
    q_tokens, kv_tokens = math.prod(q.shape[:-2]), math.prod(k.shape[:-2])
    return seqs * q.shape[-2], q_tokens // seqs, kv_tokens // seqs, q.shape[-1], v.shape[-1]


def _kept_pairs(invoke: OpInvoke, q_len: int, kv_len: int) -> int:
    mask_type = invoke.argument("custom_mask_type")  # xformers: 0 none, 1 causal top-left, 2 bottom-right
    if mask_type is not None:
        return causal_pairs(q_len, kv_len, bottom_right=mask_type == 2) if mask_type else q_len * kv_len
    return causal_pairs(q_len, kv_len) if invoke.argument("is_causal", False) else q_len * kv_len


def attention_properties(
    invoke: OpInvoke, layout: str = "bhsd", backward: bool = False
) -> PerformanceProperties:
    """Matrix work over the kept pairs only (a causal call keeps about half), softmax work per kept score,
    one more vector op per score for an explicit mask or bias; every input read and output written once."""
    heads, q_len, kv_len, qk_dim, v_dim = _dims(invoke, layout)
    pairs = heads * _kept_pairs(invoke, q_len, kv_len)
    products = 3 * qk_dim + 2 * v_dim if backward else qk_dim + v_dim
    softmax = SOFTMAX_BACKWARD_OPS_PER_SCORE if backward else SOFTMAX_OPS_PER_SCORE
    masked = any(invoke.argument(name) is not None for name in ("attn_mask", "attn_bias", "bias"))
    props = invoke.memory_access_properties()
    props.kernel = "attention"
    return props.add(
        product_dtype(invoke, invoke.argument("query").dtype),
        mma=2 * pairs * products,
        gp=(softmax + masked) * pairs,
    )


_FORWARD_BHSD = [
    aten._scaled_dot_product_flash_attention_for_cpu.default,
    aten._scaled_dot_product_flash_attention.default,
    aten._scaled_dot_product_flash_attention.quantized,
    aten._scaled_dot_product_efficient_attention.default,
    aten._scaled_dot_product_cudnn_attention.default,
    aten._scaled_dot_product_fused_attention_overrideable.default,
    aten._scaled_dot_product_attention_math.default,
    aten._scaled_dot_product_attention_math_for_mps.default,
    aten.scaled_dot_product_attention.default,
]
_BACKWARD_BHSD = [
    aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
    aten._scaled_dot_product_flash_attention_backward.default,
    aten._scaled_dot_product_efficient_attention_backward.default,
    aten._scaled_dot_product_cudnn_attention_backward.default,
    aten._scaled_dot_product_fused_attention_overrideable_backward.default,
]
_FORWARD_BSHD = [
    aten._flash_attention_forward.default,
    aten._flash_attention_forward.quantized,
    aten._flash_attention_forward_no_dropout_inplace.default,
    aten._efficient_attention_forward.default,
]
_BACKWARD_BSHD = [aten._flash_attention_backward.default, aten._efficient_attention_backward.default]


def _forward(invoke: OpInvoke, device) -> PerformanceProperties:
    return attention_properties(invoke, "bhsd")


def _backward(invoke: OpInvoke, device) -> PerformanceProperties:
    return attention_properties(invoke, "bhsd", backward=True)


def _kernel_forward(invoke: OpInvoke, device) -> PerformanceProperties:
    return attention_properties(invoke, "bshd")


def _kernel_backward(invoke: OpInvoke, device) -> PerformanceProperties:
    return attention_properties(invoke, "bshd", backward=True)


for _ops, _fn in (
    (_FORWARD_BHSD, _forward),
    (_BACKWARD_BHSD, _backward),
    (_FORWARD_BSHD, _kernel_forward),
    (_BACKWARD_BSHD, _kernel_backward),
):
    for _op in _ops:
        register_op_properties(_op)(_fn)
