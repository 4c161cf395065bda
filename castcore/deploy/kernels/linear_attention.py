"""Qwen3-Next's Gated DeltaNet layers as engines run them (vLLM's and SGLang's qwen3_next): the q/k/v/z and b/a
projections, ``castcore::causal_conv1d`` over q, k and v with the convolution's state, ``castcore::gated_delta_rule``
with its gates and recurrent state (chunked over a prompt, recurrent over a decode step), ``castcore::gated_rms_norm``
and the output projection.

Each layer keeps a fixed-size state per sequence, in transformers' linear-attention cache layer where there is one
(castcore.hf.cache.recurrent_state); a sequence with none starts from zeros. In a mixed batch
(castcore.serving.mixed_batch) the convolution runs over the packed row and the delta rule in two calls, the decodes
recurrent and the prompt chunks chunked (castcore.deploy.kernels.packing). Under tensor parallelism the
projections are split by key-head groups (castcore.deploy.parallel.tensor_plan finds them by structure), so the
head counts are read from a device's share of the projection, not the config; the convolution weight and the
per-head A_log and dt_bias are held whole and the device's slice used. A tiny model with real weights gives
transformers' logits rewritten (tests/deploy/test_linear_attention.py).
"""

from __future__ import annotations

import types
from typing import Any

import torch
from torch import nn

from castcore.builtin import recurrent_ops  # noqa: F401  (defines the ops)
from castcore.deploy.kernels.packing import packed_chunks, packed_delta_rule, packing_on
from castcore.hf.cache import keep_recurrent_state, recurrent_state

ops = torch.ops.castcore
PARTS = ("in_proj_qkvz", "in_proj_ba", "conv1d", "A_log", "dt_bias", "norm", "out_proj")


def is_gated_delta_net(module: nn.Module) -> bool:
    return all(hasattr(module, name) for name in PARTS)


def rewrite(module: nn.Module) -> None:
    module.forward = types.MethodType(_forward, module)


def start_states(self, cache, mixed: torch.Tensor, state: tuple[int, ...]) -> tuple[torch.Tensor, Any]:
    """The convolution's state and the recurrence's (one sequence's: ``state``) a layer starts from, for ``mixed``
    [batch, seq, channels]: in a packed row only the convolution's shape (packed_delta_rule makes the rule's per set
    of sequences; the rule's state is None), else the cache's where it holds them, else zeros."""
    channels, width = mixed.shape[-1], self.conv_kernel_size - 1
    if packing_on():
        return mixed.new_empty((len(packed_chunks()), channels, width)), None
    batch = mixed.shape[0]
    return (recurrent_state(cache, self.layer_idx) if cache is not None else None) or (
        mixed.new_zeros((batch, channels, width)),
        mixed.new_zeros((batch, *state)),
    )


def _forward(self, hidden_states, cache=None, attention_mask=None, cache_params=None, **kwargs):
    cache = cache if cache is not None else cache_params
    batch, seq = hidden_states.shape[:2]
    dk, dv, ratio = self.head_k_dim, self.head_v_dim, self.num_v_heads // self.num_k_heads
    qkvz = self.in_proj_qkvz(hidden_states)
    k_heads = qkvz.shape[-1] // (2 * dk + 2 * ratio * dv)  # one device's share under tensor parallelism
    v_heads = k_heads * ratio
    q, k, v, z = qkvz.view(batch, seq, k_heads, -1).split([dk, dk, ratio * dv, ratio * dv], dim=-1)
    b, a = self.in_proj_ba(hidden_states).view(batch, seq, k_heads, 2 * ratio).split([ratio, ratio], dim=-1)
    mixed = torch.cat([x.reshape(batch, seq, -1) for x in (q, k, v)], dim=-1)
    packed = packing_on()  # a mixed batch (castcore.serving.mixed_batch): each sequence with its own states
    conv_state, state = start_states(self, cache, mixed, (v_heads, dk, dv))
    mixed, conv_state = ops.causal_conv1d(mixed, self.conv1d.weight[: mixed.shape[-1], 0], conv_state)
    q, k, v = mixed.split([k_heads * dk, k_heads * dk, v_heads * dv], dim=-1)
    rows = (
        q.view(batch, seq, k_heads, dk),
        k.view(batch, seq, k_heads, dk),
        v.view(batch, seq, v_heads, dv),
        a.reshape(batch, seq, v_heads),
        b.reshape(batch, seq, v_heads),
        self.A_log[:v_heads],
        self.dt_bias[:v_heads],
    )
    if packed:
        return _projected(self, packed_delta_rule(*rows, (v_heads, dk, dv)), z, batch, seq, v_heads)
    out, state = ops.gated_delta_rule(*rows, state)
    if cache is not None:
        keep_recurrent_state(cache, self.layer_idx, conv_state, state)
    return _projected(self, out, z, batch, seq, v_heads)


def _projected(self, out, z, batch, seq, v_heads):
    """The gated norm and the output projection."""
    dv = self.head_v_dim
    out = ops.gated_rms_norm(
        out, z.reshape(batch, seq, v_heads, dv), self.norm.weight, self.norm.variance_epsilon
    )
    return self.out_proj(out.reshape(batch, seq, v_heads * dv))
