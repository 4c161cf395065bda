"""Deployed attention kernels: ``castcore::attention`` in place of transformers' attention functions (or a
model's own causal ``_attn``), and ``castcore::rotary_embedding`` in place of the model's rotary embedding of
queries and keys. castcore.deploy.kernels.fusing decides where they apply.
"""

from __future__ import annotations

import inspect

import torch
from torch import nn

from castcore.builtin import fused_ops  # noqa: F401  (defines the torch.ops.castcore ops)
from castcore.deploy.kernels.packing import packed_attention
from castcore.hf.attention import (
    ATTENTION,
    FUSED_ATTENTION,
    attention_chunk,
    castcore_attention,
    register_attention,
    sdpa_mask,
)
from castcore.hf.configs import set_attention
from castcore.hf.rotary import half_angle_rotary

ops = torch.ops.castcore


def _fused_mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, attention_mask=None, **kwargs):
    """No mask tensor without padding: the fused kernel applies causality and the sliding window itself."""
    if attention_mask is None:
        return None
    return sdpa_mask(
        batch_size, q_length, kv_length, q_offset, kv_offset, attention_mask=attention_mask, **kwargs
    )


def _fused_attention(
    module,
    query,
    key,
    value,
    attention_mask,
    dropout=0.0,
    scaling=None,
    softcap=None,
    sliding_window=None,
    s_aux=None,
    **kwargs,
):
    if attention_mask is not None or dropout:  # padding or dropout: the eager path prices them
        return castcore_attention(
            module,
            query,
            key,
            value,
            attention_mask,
            dropout=dropout,
            scaling=scaling,
            softcap=softcap,
            sliding_window=sliding_window,
            s_aux=s_aux,
            **kwargs,
        )
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    options = (
        float(scale),
        bool(getattr(module, "is_causal", True)),
        int(sliding_window or 0),
        float(softcap or 0.0),
        bool(getattr(module, "castcore_kv_per_query_head", False)),
        s_aux,
        attention_chunk(module),
    )
    # a mixed batch's sequences, each at its own KV length
    out = packed_attention(query, key, value, *options)
    return (ops.attention(query, key, value, *options) if out is None else out), None


def fused_own_attn(self, query, key, value, attention_mask=None, *args, **kwargs):
    # castcore builds these models without padding, so the mask the model made is the causal one the op applies.
    out = ops.attention(
        query,
        key,
        value,
        1.0 / float(self.scale_attn),
        True,
        0,
        0.0,
        bool(getattr(self, "castcore_kv_per_query_head", False)),
    )
    return out.transpose(1, 2), None  # back to [batch, heads, seq, dim], which the model then merges


def use_fused_attention(model: nn.Module) -> bool:
    """Switch every config on castcore's attention path to the fused one; False when the model has its own."""
    register_attention(FUSED_ATTENTION, _fused_attention, _fused_mask)
    return set_attention(model, FUSED_ATTENTION, only_from=ATTENTION)


def fused_rotary(original):
    if original.__name__ == "apply_rotary_emb":
        return _fused_complex_rotary(original)
    signature = inspect.signature(original)
    half = half_angle_rotary(original)

    def apply_rotary_pos_emb(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        q, k, cos, sin = (bound.arguments[n] for n in ("q", "k", "cos", "sin"))
        width = cos.shape[-1] * (2 if half else 1)  # gpt-oss holds each angle once, as the op may take them
        if (
            bound.arguments["unsqueeze_dim"] != 1
            or cos.dim() != 3
            or q.dim() != 4
            or width != q.shape[-1]
            or bound.arguments.get("position_ids") is not None
        ):
            return original(*args, **kwargs)  # a partial or differently laid out rotary: priced as it runs
        return ops.rotary_embedding(q, k, cos, sin)

    return apply_rotary_pos_emb


def _fused_complex_rotary(original):
    """Llama 4's rotary: q and k [batch, seq, heads, dim] in rotated pairs times complex angles [batch, seq,
    dim / 2]. The op returns them in the halves layout, the same permutation of both, which changes no score."""

    def apply_rotary_emb(xq, xk, freqs_cis):
        if xq.dim() != 4 or freqs_cis.dim() != 3 or 2 * freqs_cis.shape[-1] != xq.shape[-1]:
            return original(xq, xk, freqs_cis)
        q, k = ops.rotary_embedding(
            xq.transpose(1, 2), xk.transpose(1, 2), freqs_cis.real, freqs_cis.imag, True
        )
        return q.transpose(1, 2), k.transpose(1, 2)

    return apply_rotary_emb
