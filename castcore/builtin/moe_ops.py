"""The core's fused mixture-of-experts operators: the routers (softmax top-k, DeepSeek-V3's grouped top-k), the
dispatch and combine around the grouped GEMMs, and gpt-oss's clamped SwiGLU between them.

Like every fused op (castcore.builtin.fused_ops), each has a reference implementation and a fake one; their
work is counted in ``castcore.builtin.formulas.fused``; ``castcore.deploy.kernels.moe`` rewrites models to call them.
"""

from __future__ import annotations

import math

import torch


@torch.library.custom_op("castcore::topk_softmax", mutates_args=())
def topk_softmax(logits: torch.Tensor, k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """A mixture-of-experts router in one kernel: softmax over the experts (fp32), top k, optionally
    renormalised to sum to 1 -> (weights fp32 [tokens, k], expert indices int64 [tokens, k])."""
    weights, indices = logits.float().softmax(-1).topk(k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(-1, keepdim=True)
    return weights, indices


@topk_softmax.register_fake
def _(logits, k, renormalize):
    shape = (*logits.shape[:-1], k)
    return logits.new_empty(shape, dtype=torch.float32), logits.new_empty(shape, dtype=torch.int64)


@torch.library.custom_op("castcore::grouped_topk", mutates_args=())
def grouped_topk(
    logits: torch.Tensor,
    bias: torch.Tensor,
    groups: int,
    top_groups: int,
    k: int,
    renormalize: bool,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V3's router in one kernel (vLLM's grouped_topk): sigmoid scores, the correction ``bias`` added to
    choose by; the ``top_groups`` of ``groups`` expert groups with the best sum of their two best; the top k
    experts among those; their scores (renormalised to sum to 1) times ``scale`` -> (weights fp32 [tokens, k],
    expert indices int64 [tokens, k])."""
    scores = logits.float().sigmoid()
    choice = scores + bias
    experts = logits.shape[-1]
    by_group = choice.view(-1, groups, experts // groups)
    best = by_group.topk(2, dim=-1)[0].sum(-1).topk(top_groups, dim=-1, sorted=False)[1]
    kept = torch.zeros_like(by_group[..., 0]).scatter_(1, best, 1).bool().unsqueeze(-1).expand_as(by_group)
    indices = choice.masked_fill(~kept.reshape(-1, experts), -math.inf).topk(k, dim=-1, sorted=False)[1]
    weights = scores.gather(1, indices)
    if renormalize:
        weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
    return weights * scale, indices


@grouped_topk.register_fake
def _(logits, bias, groups, top_groups, k, renormalize, scale):
    shape = (*logits.shape[:-1], k)
    return logits.new_empty(shape, dtype=torch.float32), logits.new_empty(shape, dtype=torch.int64)


@torch.library.custom_op("castcore::moe_permute", mutates_args=())
def moe_permute(
    hidden: torch.Tensor, expert_ids: torch.Tensor, experts: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A mixture-of-experts dispatch in one kernel: every token's top-k copies sorted by expert ->
    (rows [tokens x k, hidden], order [tokens x k]: the flat (token, k) index of each row, offsets [experts]:
    the end row of each expert's group, int32, as torch._grouped_mm takes them)."""
    top_k = expert_ids.shape[-1]
    flat = expert_ids.reshape(-1)
    order = torch.sort(flat, stable=True).indices
    offsets = torch.cumsum(torch.bincount(flat, minlength=experts), 0).to(torch.int32)
    return hidden[order // top_k], order, offsets


@moe_permute.register_fake
def _(hidden, expert_ids, experts):
    rows = expert_ids.numel()
    return (
        hidden.new_empty((rows, hidden.shape[-1])),
        expert_ids.new_empty((rows,), dtype=torch.int64),
        expert_ids.new_empty((experts,), dtype=torch.int32),
    )


@torch.library.custom_op("castcore::moe_unpermute", mutates_args=())
def moe_unpermute(
    rows: torch.Tensor,
    order: torch.Tensor,
    weights: torch.Tensor,
    bias: torch.Tensor | None = None,
    offsets: torch.Tensor | None = None,
) -> torch.Tensor:
    """The combine of moe_permute's rows in one kernel: each token's k expert outputs (plus its expert's ``bias``
    [experts, hidden], the rows grouped by ``offsets``) weighted by the router and summed -> [tokens, hidden] in
    the rows' dtype."""
    tokens, top_k = weights.shape
    if bias is not None:
        rows = rows + bias[_row_experts(offsets, rows.shape[0])]
    out = torch.zeros(tokens * top_k, rows.shape[-1], dtype=torch.float32, device=rows.device)
    out[order] = rows.float() * weights.reshape(-1)[order].unsqueeze(-1).float()
    return out.view(tokens, top_k, -1).sum(1).to(rows.dtype)


@moe_unpermute.register_fake
def _(rows, order, weights, bias=None, offsets=None):
    return rows.new_empty((weights.shape[0], rows.shape[-1]))


def _row_experts(offsets: torch.Tensor, rows: int) -> torch.Tensor:
    """The expert of each row of rows grouped by expert, from the groups' cumulative end rows."""
    counts = torch.diff(offsets.long(), prepend=offsets.new_zeros(1).long())
    return torch.repeat_interleave(
        torch.arange(len(offsets), device=offsets.device), counts, output_size=rows
    )


@torch.library.custom_op("castcore::clamped_swiglu", mutates_args=())
def clamped_swiglu(
    gate_up: torch.Tensor, bias: torch.Tensor, offsets: torch.Tensor, alpha: float, limit: float
) -> torch.Tensor:
    """gpt-oss's expert activation in one kernel (vLLM's swigluoai_and_mul, with the first grouped GEMM's bias,
    which engines add in that GEMM's epilogue): rows grouped by expert (``offsets``) plus their expert's bias
    [experts, 2 x inter], gate and up interleaved along the last dimension; gate clamped above at ``limit``, up
    to [-limit, limit]; (up + 1) * gate * sigmoid(alpha * gate) -> [rows, inter]."""
    x = gate_up + bias[_row_experts(offsets, gate_up.shape[0])]
    gate, up = x[..., ::2].clamp(max=limit), x[..., 1::2].clamp(-limit, limit)
    return (up + 1) * gate * torch.sigmoid(gate * alpha)


@clamped_swiglu.register_fake
def _(gate_up, bias, offsets, alpha, limit):
    return gate_up.new_empty((*gate_up.shape[:-1], gate_up.shape[-1] // 2))
