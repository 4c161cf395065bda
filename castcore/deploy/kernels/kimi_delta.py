"""Kimi Linear's delta attention (KDA) layers as engines run them (vLLM's kimi_linear, flash-linear-attention's
``chunk_kda`` and ``fused_recurrent_kda``): the q, k and v projections, ``castcore::causal_conv1d`` over them with
the convolution's state, the per-channel forget gate (f_a, f_b), the write strength (b), ``castcore::gated_delta_rule``
with a decay per key channel (chunked over a prompt, recurrent over a decode step), the output gate (g_a, g_b) into
``castcore::gated_rms_norm`` (sigmoid-gated) and the output projection.

It is Qwen3-Next's Gated DeltaNet (castcore.deploy.kernels.linear_attention) with the decay per key channel instead
of per head, and as many key heads as value heads. Each layer keeps a fixed-size state per sequence in transformers'
linear-attention cache layer (castcore.hf.cache.recurrent_state); a sequence with none starts from zeros. A tiny
model with real weights gives transformers' logits rewritten (tests/deploy/test_kimi_delta.py).
"""

from __future__ import annotations

import types

import torch
from torch import nn

from castcore.builtin import recurrent_ops  # noqa: F401  (defines the ops)
from castcore.deploy.kernels.linear_attention import start_states
from castcore.deploy.kernels.packing import packed_delta_rule, packing_on
from castcore.hf.cache import keep_recurrent_state

ops = torch.ops.castcore
PARTS = (
    "q_proj",
    "k_proj",
    "v_proj",
    "conv1d",
    "forget_gate",
    "b_proj",
    "g_a_proj",
    "g_b_proj",
    "o_norm",
    "o_proj",
)


def is_kimi_delta_attention(module: nn.Module) -> bool:
    return all(hasattr(module, name) for name in PARTS)


def rewrite(module: nn.Module) -> None:
    module.forward = types.MethodType(_forward, module)
    module.castcore_recurrent = True  # no attention module of castcore::attention's (attention_modules_of)


def _forward(self, hidden_states, cache=None, attention_mask=None, cache_params=None, **kwargs):
    cache = cache if cache is not None else cache_params
    batch, seq = hidden_states.shape[:2]
    dim = self.head_dim
    mixed = torch.cat([proj(hidden_states) for proj in (self.q_proj, self.k_proj, self.v_proj)], dim=-1)
    heads = mixed.shape[-1] // (3 * dim)  # one device's share under tensor parallelism
    packed = packing_on()  # a mixed batch (castcore.serving.mixed_batch): each sequence with its own states
    conv_state, state = start_states(self, cache, mixed, (heads, dim, dim))
    mixed, conv_state = ops.causal_conv1d(mixed, self.conv1d.weight[: mixed.shape[-1], 0], conv_state)
    q, k, v = (x.reshape(batch, seq, heads, dim) for x in mixed.split([heads * dim] * 3, dim=-1))
    gate = self.forget_gate
    a = gate.f_b_proj(gate.f_a_proj(hidden_states)).view(batch, seq, heads, dim)
    b = self.b_proj(hidden_states)
    a_log, dt_bias = gate.A_log.reshape(-1)[:heads], gate.dt_bias.view(-1, dim)[:heads]
    if packed:
        out = packed_delta_rule(q, k, v, a, b, a_log, dt_bias, (heads, dim, dim))
    else:
        out, state = ops.gated_delta_rule(q, k, v, a, b, a_log, dt_bias, state)
    if cache is not None and not packed:
        keep_recurrent_state(cache, self.layer_idx, conv_state, state)
    out_gate = self.g_b_proj(self.g_a_proj(hidden_states)).view(batch, seq, heads, dim)
    out = ops.gated_rms_norm(out, out_gate, self.o_norm.weight, self.o_norm.variance_epsilon, True)
    return self.o_proj(out.reshape(batch, seq, heads * dim))
