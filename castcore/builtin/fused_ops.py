"""The core's device-neutral fused operators: what a serving engine runs instead of the eager graph.

Each is a ``torch.library`` custom op in the ``castcore`` namespace with a reference implementation (so a
fused model computes what the eager one does, checked by the tests) and a fake one (so it captures on the
meta device as one call). Their work is counted in ``castcore.builtin.formulas.fused``; a pack may claim
any of them for its devices. ``castcore.deploy.kernels.fusing`` rewrites models to call them.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from castcore.plugins.replacements import declare_replaces


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float) -> torch.Tensor:
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return (normed * (offset + weight.float())).to(x.dtype)


@torch.library.custom_op("castcore::rms_norm", mutates_args=())
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float) -> torch.Tensor:
    """x / rms(x) * (offset + weight) over the last dimension, in fp32 inside, out in x's dtype
    (offset 1 for Gemma's norms, which scale by 1 + weight)."""
    return _rms(x, weight, eps, offset)


@rms_norm.register_fake
def _(x, weight, eps, offset):
    return torch.empty_like(x)


@torch.library.custom_op("castcore::add_rms_norm", mutates_args=())
def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, offset: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual): the residual add fused into the norm that follows it."""
    total = x + residual
    return _rms(total, weight, eps, offset), total


@add_rms_norm.register_fake
def _(x, residual, weight, eps, offset):
    return torch.empty_like(x), torch.empty_like(x)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


@torch.library.custom_op("castcore::rotary_embedding", mutates_args=())
def rotary_embedding(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary position embedding of queries and keys [batch, heads, seq, dim] by cos/sin [batch, seq, dim]
    (halves rotated, the Llama/NeoX layout), both in one kernel. cos/sin may hold each angle once, [batch, seq,
    dim / 2], as vLLM's cos/sin cache and gpt-oss do. ``interleaved``: the dimensions come in rotated pairs (x0,
    x1), (x2, x3), ... (DeepSeek's layout) and leave in the halves layout, as transformers'
    apply_rotary_pos_emb_interleave returns them."""
    if interleaved:
        q, k = (x.unflatten(-1, (-1, 2)).transpose(-1, -2).flatten(-2) for x in (q, k))
    if 2 * cos.shape[-1] == q.shape[-1]:
        cos, sin = torch.cat([cos, cos], dim=-1), torch.cat([sin, sin], dim=-1)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return ((q * cos + _rotate_half(q) * sin).to(q.dtype), (k * cos + _rotate_half(k) * sin).to(k.dtype))


@rotary_embedding.register_fake
def _(q, k, cos, sin, interleaved=False):
    return torch.empty_like(q), torch.empty_like(k)


@torch.library.custom_op("castcore::silu_and_mul", mutates_args=())
def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up, gate and up the two halves of the last dimension (a merged gate/up projection)."""
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


@silu_and_mul.register_fake
def _(x):
    return x.new_empty((*x.shape[:-1], x.shape[-1] // 2))


@torch.library.custom_op("castcore::gelu_and_mul", mutates_args=())
def gelu_and_mul(x: torch.Tensor, approximate: str) -> torch.Tensor:
    """gelu(gate) * up (GeGLU), gate and up the two halves of the last dimension."""
    gate, up = x.chunk(2, dim=-1)
    return F.gelu(gate, approximate=approximate) * up


@gelu_and_mul.register_fake
def _(x, approximate):
    return x.new_empty((*x.shape[:-1], x.shape[-1] // 2))


def kept_keys(q_len: int, kv_len: int, causal: bool, window: int, chunk: int = 0) -> int:
    """(query, key) pairs per head a causal (bottom-right aligned), optionally sliding-window or chunked, mask
    keeps. ``chunk``: the keys start at position 0 and each query sees only the keys of its own chunk."""
    if causal and chunk:

        def seen(n: int) -> int:  # pairs kept by the first n queries of a sequence: 1..chunk, 1..chunk, ...
            full, rest = divmod(n, chunk)
            return full * chunk * (chunk + 1) // 2 + rest * (rest + 1) // 2

        return seen(kv_len) - seen(kv_len - q_len)
    if not causal:
        return q_len * (min(kv_len, window) if window else kv_len)
    # Query row r sees n = kv_len - q_len + r + 1 keys (capped at the window): sum n over a..b.
    a, b = kv_len - q_len + 1, kv_len
    if not window or b <= window:
        return (a + b) * q_len // 2
    if a > window:
        return q_len * window
    return (a + window) * (window - a + 1) // 2 + (b - window) * window


@torch.library.custom_op("castcore::attention", mutates_args=())
def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    causal: bool,
    window: int,
    softcap: float,
    kv_per_query_head: bool = False,
    sinks: torch.Tensor | None = None,
    chunk: int = 0,
) -> torch.Tensor:
    """Flash attention with grouped KV heads: q [batch, heads, q_len, dim], k/v [batch, kv_heads, kv_len, dim]
    (in the cache's dtype, which may differ from q's) -> [batch, q_len, heads, v_dim]. ``causal`` aligns the
    last query with the last key; ``window`` > 0 keeps only that many most recent keys; ``softcap`` > 0 caps the
    scores with softcap * tanh(score / softcap). ``kv_per_query_head`` changes no result, only the cost: the
    kernel reads each K/V head once per query head of its group, not once for the group. ``sinks`` [heads]
    (gpt-oss): one learned logit per head that joins every row's softmax and attends to nothing. ``chunk`` > 0
    (Llama 4's chunked layers): the keys start at position 0 and a query sees only the keys of its own chunk."""
    group = q.shape[1] // k.shape[1]
    k = k.to(q.dtype).repeat_interleave(group, dim=1)
    v = v.to(q.dtype).repeat_interleave(group, dim=1)
    scores = (q @ k.transpose(-1, -2)).float() * scale
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    q_len, kv_len = q.shape[2], k.shape[2]
    query_pos = torch.arange(kv_len - q_len, kv_len).unsqueeze(1)
    key_pos = torch.arange(kv_len).unsqueeze(0)
    keep = torch.ones(q_len, kv_len, dtype=torch.bool)
    if causal:
        keep &= key_pos <= query_pos
    if window:
        keep &= key_pos > query_pos - window
    if chunk:
        keep &= key_pos // chunk == query_pos // chunk
    scores = scores.masked_fill(~keep, -math.inf)
    if sinks is not None:
        sink = sinks.float().view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
        scores = torch.cat([scores, sink], dim=-1).softmax(-1)[..., :-1]
    else:
        scores = scores.softmax(-1)
    return (scores.to(q.dtype) @ v).transpose(1, 2).contiguous()


@attention.register_fake
def _(q, k, v, scale, causal, window, softcap, kv_per_query_head=False, sinks=None, chunk=0):
    if sinks is not None and sinks.shape != (q.shape[1],):
        raise ValueError(f"attention sinks {tuple(sinks.shape)} do not match the {q.shape[1]} query heads")
    return q.new_empty((q.shape[0], q.shape[2], q.shape[1], v.shape[-1]))


@torch.library.custom_op("castcore::latent_attention", mutates_args=())
def latent_attention(
    q: torch.Tensor, latent: torch.Tensor, rank: int, scale: float, causal: bool
) -> torch.Tensor:
    """Multi-head latent attention in its absorbed form, as FlashMLA runs a decode: q [batch, heads, q_len,
    rank + rope] (the no-position part already multiplied into the latent space) against the cache's one latent
    entry per token, latent [batch, 1, kv_len, rank + rope], whose first ``rank`` columns are also the values ->
    [batch, q_len, heads, rank]. The cache is read once for every head."""
    return attention(q, latent, latent[..., :rank], scale, causal, 0, 0.0)


@latent_attention.register_fake
def _(q, latent, rank, scale, causal):
    return q.new_empty((q.shape[0], q.shape[2], q.shape[1], rank))


@torch.library.custom_op("castcore::varlen_attention", mutates_args=())
def varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    new: list[int],
    cached: list[int],
    scale: float,
    causal: bool,
    window: int,
    softcap: float,
    kv_per_query_head: bool = False,
    sinks: torch.Tensor | None = None,
    chunk: int = 0,
) -> torch.Tensor:
    """Attention over sequences packed in one row, as an engine's iteration runs it in one kernel: sequence i has
    ``new[i]`` queries in q [1, heads, sum(new), dim] and ``cached[i] + new[i]`` keys and values in k/v
    [1, kv_heads, sum(cached + new), dim], its queries the last of its keys -> [1, sum(new), heads, v_dim]."""
    outputs, q_at, kv_at = [], 0, 0
    for n, c in zip(new, cached):
        outputs.append(
            attention(
                q[:, :, q_at : q_at + n],
                k[:, :, kv_at : kv_at + c + n],
                v[:, :, kv_at : kv_at + c + n],
                scale,
                causal,
                window,
                softcap,
                kv_per_query_head,
                sinks,
                chunk,
            )
        )
        q_at, kv_at = q_at + n, kv_at + c + n
    return torch.cat(outputs, dim=1)


@varlen_attention.register_fake
def _(q, k, v, new, cached, scale, causal, window, softcap, kv_per_query_head=False, sinks=None, chunk=0):
    return q.new_empty((1, q.shape[2], q.shape[1], v.shape[-1]))


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


# The eager ops each fused op stands in for: a plugin's claim on one of these that the deployed view no longer
# runs anywhere is said to be unreached (castcore.plugins.audit.unreached_claims), never silently unused.
_REPLACES = {
    "castcore::rms_norm": (
        "aten::pow.Tensor_Scalar",
        "aten::mean.dim",
        "aten::rsqrt",
        "aten::mul.Tensor",
        "aten::_to_copy",
    ),
    "castcore::add_rms_norm": (
        "aten::add.Tensor",
        "aten::pow.Tensor_Scalar",
        "aten::mean.dim",
        "aten::rsqrt",
        "aten::mul.Tensor",
        "aten::_to_copy",
    ),
    "castcore::rotary_embedding": (
        "aten::mul.Tensor",
        "aten::add.Tensor",
        "aten::neg",
        "aten::cat",
        "aten::slice.Tensor",
    ),
    "castcore::silu_and_mul": ("aten::silu", "aten::mul.Tensor"),
    "castcore::gelu_and_mul": ("aten::gelu", "aten::mul.Tensor"),
    "castcore::attention": (
        "aten::_scaled_dot_product_flash_attention_for_cpu",
        "aten::_scaled_dot_product_efficient_attention",
        "aten::_scaled_dot_product_attention_math",
        "aten::bmm",
        "aten::_softmax",
        "aten::repeat_interleave.self_int",
        "aten::expand",
    ),
    "castcore::varlen_attention": (
        "aten::_scaled_dot_product_flash_attention_for_cpu",
        "aten::_scaled_dot_product_efficient_attention",
        "aten::_scaled_dot_product_attention_math",
        "aten::bmm",
        "aten::_softmax",
        "aten::repeat_interleave.self_int",
        "aten::expand",
    ),
    "castcore::latent_attention": (
        "aten::_scaled_dot_product_flash_attention_for_cpu",
        "aten::_scaled_dot_product_attention_math",
        "aten::bmm",
        "aten::_softmax",
        "aten::expand",
    ),
    "castcore::topk_softmax": ("aten::_softmax", "aten::topk", "aten::sum.dim_IntList", "aten::div.Tensor"),
    "castcore::grouped_topk": (
        "aten::sigmoid",
        "aten::topk",
        "aten::scatter_.value",
        "aten::masked_fill.Scalar",
        "aten::gather",
        "aten::sum.dim_IntList",
        "aten::div.Tensor",
        "aten::add.Tensor",
    ),
    "castcore::moe_permute": ("aten::sort", "aten::index.Tensor", "aten::one_hot", "aten::histc"),
    "castcore::moe_unpermute": ("aten::mul.Tensor", "aten::index_add_", "aten::sum.dim_IntList"),
    "castcore::clamped_swiglu": ("aten::clamp", "aten::sigmoid", "aten::mul.Tensor", "aten::add.Tensor"),
}

for _fused, _eager in _REPLACES.items():
    declare_replaces(_fused, _eager)

OPS = {
    name: getattr(torch.ops.castcore, name).default
    for name in (
        "rms_norm",
        "add_rms_norm",
        "rotary_embedding",
        "silu_and_mul",
        "gelu_and_mul",
        "attention",
        "varlen_attention",
        "latent_attention",
        "topk_softmax",
        "grouped_topk",
        "moe_permute",
        "moe_unpermute",
        "clamped_swiglu",
    )
}
