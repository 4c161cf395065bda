"""The core's fused operators for linear attention as engines run Qwen3-Next's Gated DeltaNet layers: the short
causal convolution over q, k and v with its state, the gated delta rule with its recurrent state, and the gated
RMSNorm after it.

Each keeps a fixed-size state per sequence instead of a KV cache: the convolution's last ``width - 1`` inputs, and
one [key_dim, value_dim] matrix per value head. An op takes the state a sequence starts from and returns the one it
ends with, so the state's read and write are the op's own traffic. Like every fused op (castcore.builtin.fused_ops),
each has a reference implementation and a fake one; their work is counted in ``castcore.builtin.formulas.recurrent``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


@torch.library.custom_op("castcore::causal_conv1d", mutates_args=())
def causal_conv1d(
    x: torch.Tensor, weight: torch.Tensor, state: torch.Tensor, bias: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [batch, seq, channels] through a depthwise causal convolution of weight [channels, width] (plus bias
    [channels], Mamba-2's), the sequence's previous ``width - 1`` inputs in state [batch, channels, width - 1]
    (zeros for a new one), then SiLU -> (out [batch, seq, channels], the state after the last token)."""
    history = torch.cat([state.to(x.dtype), x.transpose(1, 2)], dim=-1)
    bias = None if bias is None else bias.to(x.dtype)
    out = F.conv1d(history, weight.to(x.dtype).unsqueeze(1), bias, groups=x.shape[-1])
    return F.silu(out).transpose(1, 2).contiguous(), history[..., -state.shape[-1] :].to(
        state.dtype
    ).contiguous()


@causal_conv1d.register_fake
def _(x, weight, state, bias=None):
    return torch.empty_like(x), torch.empty_like(state)


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def gates(
    a: torch.Tensor, b: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(log decay g, write strength beta) from the projections a, b [..., value_heads] and the layer's per-head
    A_log and dt_bias: g = -exp(A_log) x softplus(a + dt_bias), beta = sigmoid(b), in fp32. Kimi Linear's
    per-channel decay: a [..., value_heads, key_dim] and dt_bias [value_heads, key_dim], A_log still per head."""
    rate = a_log.float().exp()
    rate = rate[:, None] if a.dim() > b.dim() else rate
    return -rate * F.softplus(a.float() + dt_bias.float()), b.float().sigmoid()


@torch.library.custom_op("castcore::gated_delta_rule", mutates_args=())
def gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    a_log: torch.Tensor,
    dt_bias: torch.Tensor,
    state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule (Gated DeltaNet) with its gates: q, k [batch, seq, k_heads, key_dim] (L2-normalised
    inside, each serving value_heads / k_heads value heads), v [batch, seq, value_heads, value_dim], a and b
    [batch, seq, value_heads] made into the log decay and write strength (``gates``), the state [batch,
    value_heads, key_dim, value_dim] before the first token -> (out [batch, seq, value_heads, value_dim], the state
    after the last). Per token: the state decays by exp(g), takes beta x (v - its read along k) along k, and is
    read along q / sqrt(key_dim). Kimi Linear's delta attention (KDA) decays each key channel by its own gate: a
    [batch, seq, value_heads, key_dim] and dt_bias [value_heads, key_dim] (``gates``)."""
    g, beta = gates(a, b, a_log, dt_bias)
    group = v.shape[2] // k.shape[2]
    q, k = (_l2norm(x.float()).repeat_interleave(group, dim=2) for x in (q, k))
    q = q / q.shape[-1] ** 0.5
    memory, outputs = state.float(), []
    for t in range(q.shape[1]):
        decay = g[:, t].exp()
        memory = memory * (decay[..., None] if g.dim() == 4 else decay[..., None, None])
        read = (memory * k[:, t, :, :, None]).sum(-2)
        delta = (v[:, t].float() - read) * beta[:, t, :, None]
        memory = memory + k[:, t, :, :, None] * delta[:, :, None, :]
        outputs.append((memory * q[:, t, :, :, None]).sum(-2))
    return torch.stack(outputs, dim=1).to(v.dtype), memory.to(state.dtype)


@gated_delta_rule.register_fake
def _(q, k, v, a, b, a_log, dt_bias, state):
    return torch.empty_like(v), torch.empty_like(state)


@torch.library.custom_op("castcore::gated_rms_norm", mutates_args=())
def gated_rms_norm(
    x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float, sigmoid: bool = False
) -> torch.Tensor:
    """RMSNorm of x over its last dimension times weight, times SiLU(gate) (``sigmoid``: sigmoid(gate), Kimi
    Linear's, the norm and weight kept in fp32 as it keeps them), in fp32 inside -> x's dtype."""
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    if sigmoid:
        return (weight.float() * normed * gate.float().sigmoid()).to(x.dtype)
    return (weight * normed.to(x.dtype) * F.silu(gate.float())).to(x.dtype)


@gated_rms_norm.register_fake
def _(x, gate, weight, eps, sigmoid=False):
    return torch.empty_like(x)


@torch.library.custom_op("castcore::varlen_gated_delta_rule", mutates_args=())
def varlen_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    a_log: torch.Tensor,
    dt_bias: torch.Tensor,
    state: torch.Tensor,
    new: list[int],
    cached: list[int],
) -> tuple[torch.Tensor, torch.Tensor]:
    """``gated_delta_rule`` over sequences packed in one row, as an engine's iteration runs it: sequence i has
    ``new[i]`` tokens of q, k, v, a, b [1, sum(new), ...] over ``cached[i]`` earlier ones, whose state is state[i]
    ([sequences, value_heads, key_dim, value_dim]) -> (out [1, sum(new), value_heads, value_dim], the states
    after each sequence's last token)."""
    outputs, states, at = [], [], 0
    for i, n in enumerate(new):
        part = slice(at, at + n)
        out, after = gated_delta_rule(
            q[:, part], k[:, part], v[:, part], a[:, part], b[:, part], a_log, dt_bias, state[i : i + 1]
        )
        outputs.append(out)
        states.append(after)
        at += n
    return torch.cat(outputs, dim=1), torch.cat(states)


@varlen_gated_delta_rule.register_fake
def _(q, k, v, a, b, a_log, dt_bias, state, new, cached):
    return torch.empty_like(v), torch.empty_like(state)
