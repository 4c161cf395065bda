"""DeepSeek-V3.2's sparse attention (DSA) as its serving kernels run it: multi-head latent attention whose queries
each attend only to the ``index_topk`` (2048) keys a lightweight indexer picks.

Per layer and step: the indexer's own queries (``wq_b`` over the query's low-rank activation, 64 heads of 128) and
one key per token (``wk``, a LayerNorm, rotary on its first dims in halves), cached beside the latent entry; its
per-head weights (``weights_proj``); ``castcore::lightning_indexer`` scores every key each query sees and keeps the
best; then ``castcore::sparse_latent_attention`` runs absorbed (each head's query multiplied into the latent space,
attention over the picked latent entries, the result multiplied out by ``kv_b_proj``'s value half), for prompts and
decode steps alike, as DeepSeek's FlashMLA sparse kernels do. The main cache holds one latent entry per token, as
for DeepSeek-V3 (castcore.deploy.kernels.latent).

``rewrite`` gives transformers' DeepSeek-V3.2 attention modules this forward; a tiny model with real weights gives
transformers' own logits (tests/deploy/test_sparse_attention.py).
"""

from __future__ import annotations

import types

import torch
from torch import nn

from castcore.builtin import sparse_attention_ops  # noqa: F401  (defines the torch.ops.castcore ops)
from castcore.deploy.kernels.latent import PARTS, absorbed, latent_head, merge_down_projections
from castcore.deploy.kernels.packing import packed_sparse_latent, packing_on

ops = torch.ops.castcore


def is_sparse_latent_attention(module: nn.Module) -> bool:
    """transformers' MLA attention with a DSA indexer (DeepseekV32Attention)."""
    indexer = getattr(module, "indexer", None)
    return all(hasattr(module, name) for name in PARTS) and all(
        hasattr(indexer, name) for name in ("index_topk", "wq_b", "wk", "k_norm", "weights_proj")
    )


def rewrite(module: nn.Module) -> None:
    module.forward = types.MethodType(_forward, module)
    module.castcore_latent = True  # its cache entry is the latent one (castcore.hf.cache.kv_written)
    merge_down_projections(module)


def _indexer_inputs(self, hidden_states, q_resid, cos, sin) -> tuple[torch.Tensor, ...]:
    """The indexer's queries [batch, seq, heads, dim], its new keys [batch, seq, dim] and its per-head weights."""
    indexer, rope = self.indexer, self.config.qk_rope_head_dim
    batch, seq = hidden_states.shape[:2]
    q = indexer.wq_b(q_resid).view(batch, seq, indexer.n_heads, indexer.head_dim).transpose(1, 2)
    k = indexer.k_norm(indexer.wk(hidden_states)).view(batch, 1, seq, indexer.head_dim)
    q_rot, k_rot = ops.rotary_embedding(q[..., :rope], k[..., :rope], cos, sin, False)
    q = torch.cat([q_rot, q[..., rope:]], dim=-1).transpose(1, 2)  # [batch, seq, heads, dim]
    keys = torch.cat([k_rot, k[..., rope:]], dim=-1).view(batch, seq, indexer.head_dim)
    return q, keys, indexer.weights_proj(hidden_states) * indexer.n_heads**-0.5


def _forward(
    self,
    hidden_states,
    position_embeddings=None,
    attention_mask=None,
    cache=None,
    past_key_values=None,
    **kwargs,
):
    batch, seq = hidden_states.shape[:2]
    cache = cache if cache is not None else past_key_values
    q_nope, q_rot, q_resid, latent = latent_head(self, hidden_states, position_embeddings, cache, True)
    q, keys, weights = _indexer_inputs(self, hidden_states, q_resid, *position_embeddings)
    indexer, rank, scale = self.indexer, self.config.kv_lora_rank, float(self.scaling)
    index_scale, topk = float(indexer.softmax_scale), int(indexer.index_topk)
    if packing_on():  # a mixed batch (castcore.serving.mixed_batch): each sequence's own keys, in two sets

        def attend(query):
            return packed_sparse_latent(query, q, weights, rank, scale, index_scale, topk)

    else:
        if cache is not None and hasattr(cache, "update_indexer"):
            keys = cache.update_indexer(keys, self.layer_idx)
        picked = ops.lightning_indexer(q, weights, keys, index_scale, topk)

        def attend(query):
            return ops.sparse_latent_attention(query, latent, picked, rank, scale)

    out = absorbed(self, q_nope, q_rot, attend)
    return self.o_proj(out.reshape(batch, seq, -1)), None
