"""The core's fused operators for Mamba-2 state-space layers as engines run Nemotron-H's mixers (vLLM's and
SGLang's MambaMixer2): the selective scan with its recurrent state (``castcore::ssd_scan``; chunked over a prompt,
mamba_chunk_scan_combined, a state update over a decode step, selective_state_update), the same over a packed
row (``castcore::varlen_ssd_scan``), and the gated RMSNorm Mamba-2 runs after it, gate first and normalised by
groups (``castcore::gated_group_rms_norm``). The short convolution before the scan is
``castcore::causal_conv1d`` (castcore.builtin.recurrent_ops) with its bias.

A sequence's state is one [head_dim, state_size] matrix per head; an op takes the state a sequence starts from
and returns the one it ends with, so its read and write are the op's own traffic. Each op has a reference
implementation and a fake one; their work is counted in ``castcore.builtin.formulas.ssm``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def steps(dt: torch.Tensor, dt_bias: torch.Tensor, dt_min: float) -> torch.Tensor:
    """Each token's step size per head: softplus(dt + dt_bias), at least ``dt_min``, in fp32."""
    return F.softplus(dt.float() + dt_bias.float()).clamp(min=dt_min)


@torch.library.custom_op("castcore::ssd_scan", mutates_args=())
def ssd_scan(
    x: torch.Tensor,
    dt: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    a_log: torch.Tensor,
    d: torch.Tensor,
    dt_bias: torch.Tensor,
    state: torch.Tensor,
    chunk: int,
    dt_min: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mamba-2's selective state-space scan (Dao & Gu 2024, "Transformers are SSMs", the SSD layer): x [batch,
    seq, heads, head_dim], dt [batch, seq, heads], b and c [batch, seq, groups, state_size] (each group serving
    heads / groups heads), the per-head a_log, d and dt_bias, the state [batch, heads, head_dim, state_size]
    before the first token -> (out like x, the state after the last). Per token and head, with step
    s = ``steps(dt)`` and A = -exp(a_log): the state decays by exp(s A) and takes s x (outer) b; the output is
    the state read along c plus d x. ``chunk``: the tokens of a chunk of the chunked form a prompt runs as
    (the config's chunk_size), which computes the same numbers; this reference runs token by token, in fp32."""
    step = steps(dt, dt_bias, dt_min)
    group = x.shape[2] // b.shape[2]
    b, c = (t.float().repeat_interleave(group, dim=2) for t in (b, c))
    decay = (step * -a_log.float().exp()).exp()
    memory, outputs, x32 = state.float(), [], x.float()
    for t in range(x.shape[1]):
        written = (step[:, t, :, None] * x32[:, t])[..., None] * b[:, t, :, None, :]
        memory = memory * decay[:, t, :, None, None] + written
        outputs.append((memory * c[:, t, :, None, :]).sum(-1) + d.float()[:, None] * x32[:, t])
    return torch.stack(outputs, dim=1).to(x.dtype), memory.to(state.dtype)


@ssd_scan.register_fake
def _(x, dt, b, c, a_log, d, dt_bias, state, chunk, dt_min):
    return torch.empty_like(x), torch.empty_like(state)


@torch.library.custom_op("castcore::varlen_ssd_scan", mutates_args=())
def varlen_ssd_scan(
    x: torch.Tensor,
    dt: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    a_log: torch.Tensor,
    d: torch.Tensor,
    dt_bias: torch.Tensor,
    state: torch.Tensor,
    new: list[int],
    cached: list[int],
    chunk: int,
    dt_min: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``ssd_scan`` over sequences packed in one row, as an engine's iteration runs it: sequence i has ``new[i]``
    tokens of x, dt, b, c [1, sum(new), ...] over ``cached[i]`` earlier ones, whose state is state[i]
    ([sequences, heads, head_dim, state_size]) -> (out [1, sum(new), heads, head_dim], each sequence's state
    after its last token)."""
    outputs, states, at = [], [], 0
    for i, n in enumerate(new):
        part = slice(at, at + n)
        out, after = ssd_scan(
            x[:, part],
            dt[:, part],
            b[:, part],
            c[:, part],
            a_log,
            d,
            dt_bias,
            state[i : i + 1],
            chunk,
            dt_min,
        )
        outputs.append(out)
        states.append(after)
        at += n
    return torch.cat(outputs, dim=1), torch.cat(states)


@varlen_ssd_scan.register_fake
def _(x, dt, b, c, a_log, d, dt_bias, state, new, cached, chunk, dt_min):
    return torch.empty_like(x), torch.empty_like(state)


@torch.library.custom_op("castcore::gated_group_rms_norm", mutates_args=())
def gated_group_rms_norm(
    x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float, group_size: int
) -> torch.Tensor:
    """Mamba-2's gated norm (norm_before_gate=False): x times SiLU(gate), RMS-normalised over each ``group_size``
    channels of its last dimension, times weight; fp32 inside -> x's dtype."""
    gated = x.float() * F.silu(gate.float())
    grouped = gated.view(*gated.shape[:-1], -1, group_size)
    normed = grouped * torch.rsqrt(grouped.pow(2).mean(-1, keepdim=True) + eps)
    return (weight * normed.view(gated.shape).to(x.dtype)).to(x.dtype)


@gated_group_rms_norm.register_fake
def _(x, gate, weight, eps, group_size):
    return torch.empty_like(x)
