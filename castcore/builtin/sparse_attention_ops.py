"""The core's sparse-attention operators: DeepSeek-V3.2's DSA, where a lightweight indexer picks the keys each
query attends to and multi-head latent attention runs over those alone (DeepSeek-AI, "DeepSeek-V3.2-Exp: Boosting
Long-Context Efficiency with DeepSeek Sparse Attention", 2025, section 2.1).

Like every fused op (castcore.builtin.fused_ops), each has a reference implementation and a fake one; their work is
counted in ``castcore.builtin.formulas.sparse_attention``. A query sits at the end of its keys (bottom-right
aligned, as everywhere in castcore) and sees the keys up to its own position.
"""

from __future__ import annotations

import torch


def _visible(q_len: int, kv_len: int, device: torch.device) -> torch.Tensor:
    """[q_len, kv_len] True where a query sees a key."""
    keys = torch.arange(kv_len, device=device)
    return keys <= (torch.arange(q_len, device=device) + kv_len - q_len)[:, None]


@torch.library.custom_op("castcore::lightning_indexer", mutates_args=())
def lightning_indexer(
    q: torch.Tensor, weights: torch.Tensor, keys: torch.Tensor, scale: float, topk: int
) -> torch.Tensor:
    """The indexer's top-k (DeepGEMM's fp8_mqa_logits, then a top-k kernel): q [batch, q_len, heads, dim] and the
    cache's one indexer key per token, keys [batch, kv_len, dim]; a query's score for a key is the sum over its
    heads of weights [batch, q_len, heads] x relu(scale x q . k) -> the int32 positions of its
    min(topk, kv_len) best keys, [batch, q_len, k] (a key it cannot see scores -inf)."""
    scores = torch.relu(torch.einsum("bqhd,btd->bqht", q.float(), keys.float()) * scale)
    index = torch.einsum("bqht,bqh->bqt", scores, weights.float())
    index = index.masked_fill(~_visible(q.shape[1], keys.shape[1], q.device), float("-inf"))
    return index.topk(min(topk, keys.shape[1]), dim=-1).indices.to(torch.int32)


@lightning_indexer.register_fake
def _(q, weights, keys, scale, topk):
    return q.new_empty((q.shape[0], q.shape[1], min(topk, keys.shape[1])), dtype=torch.int32)


@torch.library.custom_op("castcore::sparse_latent_attention", mutates_args=())
def sparse_latent_attention(
    q: torch.Tensor, latent: torch.Tensor, indices: torch.Tensor, rank: int, scale: float
) -> torch.Tensor:
    """Absorbed multi-head latent attention over the latent entries the indexer picked (FlashMLA's sparse
    kernels, prefill and decode alike): q [batch, heads, q_len, rank + rope] (the no-position part multiplied
    into the latent space), latent [batch, 1, kv_len, rank + rope] whose first ``rank`` columns are also the
    values, indices [batch, q_len, k] -> [batch, q_len, heads, rank]. A picked key the query cannot see is left
    out."""
    batch, _, q_len, _ = q.shape
    kv_len = latent.shape[2]
    picked = torch.zeros((batch, q_len, kv_len), dtype=torch.bool, device=q.device)
    picked.scatter_(-1, indices.long(), True)
    kept = (picked & _visible(q_len, kv_len, q.device))[:, None]  # [batch, 1, q_len, kv_len]
    scores = torch.matmul(q.float(), latent.float().transpose(-1, -2)) * scale
    weights = scores.masked_fill(~kept, float("-inf")).softmax(-1)
    return torch.matmul(weights, latent[..., :rank].float()).transpose(1, 2).to(q.dtype)


@sparse_latent_attention.register_fake
def _(q, latent, indices, rank, scale):
    return q.new_empty((q.shape[0], q.shape[2], q.shape[1], rank))


@torch.library.custom_op("castcore::varlen_lightning_indexer", mutates_args=())
def varlen_lightning_indexer(
    q: torch.Tensor,
    weights: torch.Tensor,
    keys: torch.Tensor,
    new: list[int],
    cached: list[int],
    scale: float,
    topk: int,
) -> torch.Tensor:
    """lightning_indexer over sequences packed in one row, as an engine's iteration runs it: q [1, sum(new), heads,
    dim], weights [1, sum(new), heads], keys [1, sum(cached + new), dim] (each sequence's cached index keys and its
    new ones) -> [1, sum(new), topk] int32, each query's picks as positions among its own sequence's keys, -1 past
    the min(topk, keys) a sequence has."""
    out = torch.full((1, sum(new), topk), -1, dtype=torch.int32, device=q.device)
    q_at = kv_at = 0
    for n, c in zip(new, cached):
        picks = lightning_indexer(
            q[:, q_at : q_at + n], weights[:, q_at : q_at + n], keys[:, kv_at : kv_at + c + n], scale, topk
        )
        out[:, q_at : q_at + n, : picks.shape[-1]] = picks
        q_at, kv_at = q_at + n, kv_at + c + n
    return out


@varlen_lightning_indexer.register_fake
def _(q, weights, keys, new, cached, scale, topk):
    return q.new_empty((1, q.shape[1], topk), dtype=torch.int32)


@torch.library.custom_op("castcore::varlen_sparse_latent_attention", mutates_args=())
def varlen_sparse_latent_attention(
    q: torch.Tensor,
    latent: torch.Tensor,
    indices: torch.Tensor,
    new: list[int],
    cached: list[int],
    rank: int,
    scale: float,
) -> torch.Tensor:
    """sparse_latent_attention over sequences packed in one row: q [1, heads, sum(new), rank + rope], latent [1, 1,
    sum(cached + new), rank + rope], indices [1, sum(new), topk] as varlen_lightning_indexer gives them ->
    [1, sum(new), heads, rank]."""
    outputs, q_at, kv_at = [], 0, 0
    for n, c in zip(new, cached):
        picks = indices[:, q_at : q_at + n, : min(indices.shape[-1], c + n)]
        entries = latent[:, :, kv_at : kv_at + c + n]
        outputs.append(sparse_latent_attention(q[:, :, q_at : q_at + n], entries, picks, rank, scale))
        q_at, kv_at = q_at + n, kv_at + c + n
    return torch.cat(outputs, dim=1)


@varlen_sparse_latent_attention.register_fake
def _(q, latent, indices, new, cached, rank, scale):
    return q.new_empty((1, q.shape[2], q.shape[1], rank))


def picked_keys(q_len: int, kv_len: int, topk: int) -> int:
    """(query, key) pairs one sequence's queries attend to: each the fewer of ``topk`` and the keys it sees."""
    first = kv_len - q_len + 1  # the keys the first query sees; each next query sees one more
    below = max(0, min(q_len, topk - first + 1))  # the queries that see at most topk keys
    return below * first + below * (below - 1) // 2 + (q_len - below) * topk
