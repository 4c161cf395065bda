"""Nemotron-H's Mamba-2 mixers as engines run them (vLLM's and SGLang's MambaMixer2): the input projection into
the gate z, x B C and the steps dt, ``castcore::causal_conv1d`` (with its bias) over x, B and C with the
convolution's state, ``castcore::ssd_scan`` with its recurrent state (chunked over a prompt, a state update over
a decode step), ``castcore::gated_group_rms_norm`` (the gate first, then the norm by groups, as transformers'
NemotronHRMSNormGated and vLLM's Mixer2RMSNormGated run it) and the output projection.

Each layer keeps its states per sequence in transformers' linear-attention cache layer
(castcore.hf.cache.recurrent_state): the convolution's last ``conv_kernel - 1`` inputs and one [head_dim,
state_size] matrix per head in the config's ``mamba_ssm_cache_dtype``; a sequence with none starts from zeros.
In a mixed batch the convolution runs over the packed row and the scan in two calls, the decodes and the prompt
chunks (castcore.deploy.kernels.packing). Under tensor parallelism the input projection is split column-wise
(castcore.deploy.parallel.tensor_plan finds it by structure), which, with the heads and the groups dividing by the
devices (castcore.deploy.recurrent_layers refuses the rest), gives each device the width of vLLM's split: heads /
n heads of z, x and dt and n_groups / n groups of B and C; their counts are read from that width, and the
convolution weight and bias, A_log, D, dt_bias and the norm's weight are held whole and the device's slice used.
A tiny model with real weights gives transformers' logits rewritten (tests/deploy/test_mamba.py).
"""

from __future__ import annotations

import types

import torch
from torch import nn

from castcore.builtin import recurrent_ops, ssm_ops  # noqa: F401  (define the ops)
from castcore.deploy.kernels.packing import packed_chunks, packed_ssd_scan, packing_on
from castcore.hf.cache import keep_recurrent_state, mamba_share, recurrent_state, ssm_state_dtype

ops = torch.ops.castcore
PARTS = ("in_proj", "conv1d", "A_log", "D", "dt_bias", "norm", "out_proj", "n_groups", "ssm_state_size")


def is_mamba2_mixer(module: nn.Module) -> bool:
    """Nemotron-H's Mamba-2 mixer (transformers' NemotronHMamba2Mixer, checked 5.24.0)."""
    return type(module).__name__.startswith("NemotronH") and all(hasattr(module, name) for name in PARTS)


def rewrite(module: nn.Module) -> None:
    module.forward = types.MethodType(_forward, module)


def _forward(self, hidden_states, cache=None, attention_mask=None, cache_params=None, **kwargs):
    cache = cache if cache is not None else cache_params
    batch, seq = hidden_states.shape[:2]
    dim, size = self.head_dim, self.ssm_state_size
    projected = self.in_proj(hidden_states)
    heads, groups = mamba_share(self, projected.shape[-1])  # one device's share under tensor parallelism
    inner = heads * dim
    gate, xbc, dt = projected.split([inner, inner + 2 * groups * size, heads], dim=-1)
    channels, width = xbc.shape[-1], self.conv_kernel_size - 1
    dtype = ssm_state_dtype(self, hidden_states.dtype)
    packed = packing_on()  # a mixed batch (castcore.serving.mixed_batch): each sequence with its own states
    if packed:  # only shapes: the scan's states are made per set of sequences (packed_ssd_scan)
        conv_state = xbc.new_empty((len(packed_chunks()), channels, width))
        state = xbc.new_empty((1, heads, dim, size), dtype=dtype)
    else:
        conv_state, state = (recurrent_state(cache, self.layer_idx) if cache is not None else None) or (
            hidden_states.new_zeros((batch, channels, width)),
            hidden_states.new_zeros((batch, heads, dim, size), dtype=dtype),
        )
    bias = None if self.conv1d.bias is None else self.conv1d.bias[:channels]
    xbc, conv_state = ops.causal_conv1d(xbc, self.conv1d.weight[:channels, 0], conv_state, bias)
    x, b, c = xbc.split([inner, groups * size, groups * size], dim=-1)
    rows = (
        x.reshape(batch, seq, heads, dim),
        dt,
        b.reshape(batch, seq, groups, size),
        c.reshape(batch, seq, groups, size),
    )
    params = (self.A_log[:heads], self.D[:heads], self.dt_bias[:heads])
    limit = getattr(
        self, "time_step_limit", None
    )  # (time_step_min, inf) in 5.24.0; the config's (0, inf) in 5.5.0
    dt_min = float(limit[0]) if limit else 0.0
    if packed:
        out = packed_ssd_scan(*rows, params, state, self.chunk_size, dt_min)
    else:
        out, state = ops.ssd_scan(*rows, *params, state, self.chunk_size, dt_min)
        if cache is not None:
            keep_recurrent_state(cache, self.layer_idx, conv_state, state)
    out = ops.gated_group_rms_norm(
        out.reshape(batch, seq, inner),
        gate,
        self.norm.weight[:inner],
        self.norm.variance_epsilon,
        self.norm.group_size,
    )
    return self.out_proj(out.to(hidden_states.dtype))
