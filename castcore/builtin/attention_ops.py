"""The core's fused attention operators: flash attention with grouped KV heads, its packed-sequences and
latent (absorbed multi-head latent attention) forms, and the count of (query, key) pairs a mask keeps.

Like every fused op (castcore.builtin.fused_ops), each has a reference implementation and a fake one; their
work is counted in ``castcore.builtin.formulas.fused``.
"""

from __future__ import annotations

import math

import torch


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


@torch.library.custom_op("castcore::latent_entry", mutates_args=())
def latent_entry(compressed: torch.Tensor, k_rot: torch.Tensor) -> torch.Tensor:
    """A latent-attention cache entry, the compressed key-value beside the rotated key part: [.., rank + rope].
    The cache write that follows reads the two parts itself (vLLM's concat_and_cache_mla is one kernel), so a
    deployed step launches nothing for this (castcore.deploy.engine_step)."""
    return torch.cat([compressed, k_rot], dim=-1)


@latent_entry.register_fake
def _(compressed, k_rot):
    return compressed.new_empty((*compressed.shape[:-1], compressed.shape[-1] + k_rot.shape[-1]))


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


# vLLM's MLA backends run a sequence as a decode when it has at most 1 + the speculative tokens new ones (their
# reorder_batch_threshold; FlashMLA takes several queries a sequence): castcore takes up to 8 (7 draft tokens).
VERIFY_QUERIES = 8


def is_decode(new: int, cached: int) -> bool:
    """Whether a sequence of ``new`` tokens over ``cached`` ones runs as a decode step (or one verifying draft
    tokens) rather than as a prompt or its chunk: multi-head latent attention runs it absorbed rather than
    decompressed, linear attention recurrent rather than chunked."""
    return new == 1 or (cached > 0 and new <= VERIFY_QUERIES)


def decodes_and_prompts(chunks):
    """A batch's sequences (each with ``new`` and ``cached``) as its decodes and its prompt chunks (``is_decode``):
    the two sets of rows multi-head latent attention and linear attention run one kernel each over."""
    decodes = [c for c in chunks if is_decode(c.new, c.cached)]
    return decodes, [c for c in chunks if not is_decode(c.new, c.cached)] if len(decodes) < len(
        chunks
    ) else []


def latent_widths(q: torch.Tensor, latent: torch.Tensor, kv_b: torch.Tensor) -> tuple[int, int, int, int]:
    """(nope, rope, v_dim, rank) of a latent attention call: q [.., nope + rope], latent [.., rank + rope],
    kv_b [heads, nope + v_dim, rank]."""
    rank = kv_b.shape[-1]
    rope = latent.shape[-1] - rank
    nope = q.shape[-1] - rope
    return nope, rope, kv_b.shape[1] - nope, rank


@torch.library.custom_op("castcore::varlen_latent_attention", mutates_args=())
def varlen_latent_attention(
    q: torch.Tensor,
    latent: torch.Tensor,
    kv_b: torch.Tensor,
    new: list[int],
    cached: list[int],
    scale: float,
) -> torch.Tensor:
    """Multi-head latent attention over sequences packed in one row, as an engine's iteration runs it: q [1, heads,
    sum(new), nope + rope] (each head's full query), latent [1, 1, sum(cached + new), rank + rope] (each sequence's
    cached entries and its new ones), kv_b [heads, nope + v_dim, rank] (``kv_b_proj``'s weight per head) ->
    [1, sum(new), heads, v_dim]. A decode (``is_decode``) runs absorbed (its queries multiplied into the latent
    space, attention over the latent entries, the result multiplied out: FlashMLA's decode); a prompt chunk
    decompresses its keys and values through kv_b and runs flash attention. Both compute the
    same numbers; castcore.builtin.formulas.fused prices each as it runs."""
    nope, rope, v_dim, rank = latent_widths(q, latent, kv_b)
    outputs, q_at, kv_at = [], 0, 0
    for n, c in zip(new, cached):
        entries = latent[:, :, kv_at : kv_at + c + n].to(q.dtype)  # [1, 1, keys, rank + rope]
        unpacked = torch.einsum("bxkr,hdr->bhkd", entries[..., :rank], kv_b.to(q.dtype))
        key = torch.cat([unpacked[..., :nope], entries[..., rank:].expand(-1, q.shape[1], -1, -1)], dim=-1)
        outputs.append(attention(q[:, :, q_at : q_at + n], key, unpacked[..., nope:], scale, True, 0, 0.0))
        q_at, kv_at = q_at + n, kv_at + c + n
    return torch.cat(outputs, dim=1)


@varlen_latent_attention.register_fake
def _(q, latent, kv_b, new, cached, scale):
    return q.new_empty((1, q.shape[2], q.shape[1], latent_widths(q, latent, kv_b)[2]))
