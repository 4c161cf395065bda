"""Multi-head latent attention (MLA: DeepSeek-V3/R1, Kimi K2) as serving engines run it.

MLA caches one latent entry per token and layer, ``kv_lora_rank + qk_rope_head_dim`` wide (576 for DeepSeek-V3),
shared by every head and replicated on every tensor-parallel rank. Engines (vLLM's MLA backends, SGLang with
FlashMLA) run it two ways:

- a prompt decompresses the latent entries into per-head keys and values (``kv_b_proj`` over every key) and
  runs ordinary flash attention (``castcore::attention``, query/key head dim 192, value head dim 128);
- a decode step keeps the cache compressed: each head's no-position query is multiplied into the latent space
  (a per-head batched product with ``kv_b_proj``'s key half), attention runs over the latent entries
  (``castcore::latent_attention``, one read of the cache for all heads), and the result is multiplied out by
  ``kv_b_proj``'s value half. That is far cheaper per step than decompressing the whole cache.

Either way the query's and the entry's down-projections run as one GEMM (``merge_down_projections``) and the entry
is written by the cache write alone (``castcore::latent_entry``, hoisted as vLLM's concat_and_cache_mla does it).
Kimi Linear's latent attention rotates nothing (``is_nope``) and runs the same.

In a mixed batch (castcore.serving.mixed_batch) both run in one iteration: the decode sequences absorbed and the
prompt chunks decompressed, each set in one ``castcore::varlen_latent_attention`` call
(castcore.deploy.kernels.packing).

``rewrite`` gives transformers' DeepSeek-V3 attention modules this forward. The numbers are the module's: a tiny
model with real weights gives the same logits rewritten and eager (tests/deploy/test_latent.py).
"""

from __future__ import annotations

import inspect
import types

import torch
from torch import nn

from castcore.builtin.attention_ops import is_decode
from castcore.deploy.kernels.qkv import merged_linear
from castcore.deploy.kernels.packing import packed_latent_attention, packing_on

ops = torch.ops.castcore
PARTS = ("kv_a_proj_with_mqa", "kv_a_layernorm", "kv_b_proj", "o_proj")


def is_latent_attention(module: nn.Module) -> bool:
    """transformers' MLA attention with cos/sin rotary tables (DeepSeek-V3's; DeepSeek-V2 rotates with complex
    frequencies and keeps its own forward), or with no rotary at all (Kimi Linear's: ``is_nope``)."""
    config = getattr(module, "config", None)
    return (
        all(hasattr(module, name) for name in PARTS)
        and isinstance(getattr(config, "kv_lora_rank", None), int)
        and (hasattr(config, "rope_interleave") or is_nope(module))
    )


def is_nope(module: nn.Module) -> bool:
    """Latent attention whose keys and queries are never rotated: Kimi Linear's, whose class's forward takes no
    rotary tables (its delta-attention layers' decay carries position; its checkpoint says ``mla_use_nope``)."""
    return "position_embeddings" not in inspect.signature(type(module).forward).parameters


def rewrite(module: nn.Module) -> None:
    module.forward = types.MethodType(_forward, module)
    module.castcore_latent = True  # its cache entry is the latent one (castcore.hf.cache.kv_written)
    merge_down_projections(module)


def merge_down_projections(module: nn.Module) -> None:
    """q_a_proj and kv_a_proj_with_mqa, which read the same hidden states, as one projection ``qkv_a_proj``
    (vLLM's fused_qkv_a_proj, TensorRT-LLM's fused_a): one GEMM where there were two. Only plain linears, so
    a projection a pack swapped in stays as it is."""
    parts = [getattr(module, name, None) for name in ("q_a_proj", "kv_a_proj_with_mqa")]
    if not all(type(part) is nn.Linear for part in parts):
        return
    q_a, kv_a = parts
    if (q_a.bias is None) != (kv_a.bias is None):
        return
    module.qkv_a_proj = merged_linear(parts)
    module.castcore_q_a_width = q_a.out_features
    del module.q_a_proj, module.kv_a_proj_with_mqa


def absorbed_weight(
    kv_b_proj: nn.Module, heads: int, rows: int, rank: int, dtype: torch.dtype
) -> torch.Tensor:
    """``kv_b_proj``'s weight as [heads, nope + v_dim, rank] for the absorbed products: one device's shard of a
    tensor-parallel weight. A quantized projection's is held in the model dtype beside it, as vLLM dequantizes
    it once at load for these products (allocating it here is free: no kernel runs)."""
    weight = getattr(kv_b_proj, "weight", None)
    if weight is None:
        return torch.empty((heads, rows, rank), dtype=dtype)
    return (weight.to_local() if hasattr(weight, "to_local") else weight).view(heads, rows, rank)


def latent_head(self, hidden_states, position_embeddings, cache, interleave: bool):
    """The head every latent-attention forward shares: the queries [batch, heads, seq, nope + rope] split into
    their no-position and rotated parts, the compressed query (None with a plain ``q_proj``; V3.2's indexer reads
    it), and the latent entry [batch, 1, seq, rank + rope], written once into ``cache`` (then the whole cache's
    entries) when there is one. ``interleave``: rotary on interleaved pairs rather than halves."""
    config = self.config
    nope, rope, rank = config.qk_nope_head_dim, config.qk_rope_head_dim, config.kv_lora_rank
    batch, seq = hidden_states.shape[:2]
    if hasattr(self, "qkv_a_proj"):  # merged (merge_down_projections)
        q_a, kv_a = self.qkv_a_proj(hidden_states).split([self.castcore_q_a_width, rank + rope], dim=-1)
        q_resid = self.q_a_layernorm(q_a)
    else:
        q_plain = getattr(self, "q_proj", None) is not None
        q_resid = None if q_plain else self.q_a_layernorm(self.q_a_proj(hidden_states))
        kv_a = self.kv_a_proj_with_mqa(hidden_states)
    q = self.q_proj(hidden_states) if q_resid is None else self.q_b_proj(q_resid)
    q_nope, q_rot = q.view(batch, seq, -1, nope + rope).transpose(1, 2).split([nope, rope], dim=-1)
    compressed, k_rot = kv_a.split([rank, rope], dim=-1)
    compressed = self.kv_a_layernorm(compressed).view(batch, 1, seq, rank)
    k_rot = k_rot.view(batch, 1, seq, rope)
    if not is_nope(self):
        cos, sin = position_embeddings
        q_rot, k_rot = ops.rotary_embedding(q_rot, k_rot, cos, sin, interleave)
    if cache is None:
        return q_nope, q_rot, q_resid, torch.cat([compressed, k_rot], dim=-1)
    # the cache entry, written once; the values slot holds nothing: the entry is the keys
    latent, _ = cache.update(ops.latent_entry(compressed, k_rot), compressed[..., :0], self.layer_idx)
    return q_nope, q_rot, q_resid, latent


def absorbed(self, q_nope, q_rot, attend) -> torch.Tensor:
    """Attention run absorbed, as a decode step (and every V3.2 step) runs it: each head's no-position query
    multiplied into the latent space by kv_b_proj's key half, ``attend(query)`` over the latent entries ->
    [batch, seq, heads, rank], multiplied out by the value half -> [batch, seq, heads, v_dim]."""
    config = self.config
    nope, v_dim, rank = config.qk_nope_head_dim, config.v_head_dim, config.kv_lora_rank
    batch, heads, seq = q_nope.shape[:3]
    kv_b = absorbed_weight(self.kv_b_proj, heads, nope + v_dim, rank, q_nope.dtype)
    into_latent = torch.bmm(q_nope.transpose(0, 1).reshape(heads, batch * seq, nope), kv_b[:, :nope])
    out = attend(torch.cat([into_latent.view(heads, batch, seq, rank).transpose(0, 1), q_rot], dim=-1))
    out = torch.bmm(out.permute(2, 0, 1, 3).reshape(heads, batch * seq, rank), kv_b[:, nope:].transpose(1, 2))
    return out.view(heads, batch, seq, v_dim).permute(1, 2, 0, 3)


def _forward(
    self,
    hidden_states,
    position_embeddings=None,
    attention_mask=None,
    cache=None,
    past_key_values=None,
    **kwargs,
):
    config = self.config
    nope, rope, v_dim, rank = (
        config.qk_nope_head_dim,
        config.qk_rope_head_dim,
        config.v_head_dim,
        config.kv_lora_rank,
    )
    batch, seq = hidden_states.shape[:2]
    cache = cache if cache is not None else past_key_values
    q_nope, q_rot, _, latent = latent_head(
        self, hidden_states, position_embeddings, cache, bool(getattr(config, "rope_interleave", False))
    )
    heads = q_nope.shape[1]
    scale = float(getattr(self, "scaling", (nope + rope) ** -0.5))
    if (
        packing_on()
    ):  # a mixed batch (castcore.serving.mixed_batch): its decodes absorbed, its prompts decompressed
        kv_b = absorbed_weight(self.kv_b_proj, heads, nope + v_dim, rank, hidden_states.dtype)
        queries = q_nope.new_empty((*q_nope.shape[:-1], nope + rope))  # only its shape is read
        out = packed_latent_attention(queries, kv_b, rank + rope, scale)
        return self.o_proj(out.reshape(batch, seq, heads * v_dim)), None
    if cache is not None and is_decode(seq, latent.shape[2] - seq):
        out = absorbed(
            self, q_nope, q_rot, lambda query: ops.latent_attention(query, latent, rank, scale, True)
        )
    else:  # decompressed: every key's latent entry through kv_b_proj (an fp8 cache dequantized first)
        keys, whole = latent.shape[2], latent.to(hidden_states.dtype)
        k_nope, values = (
            self.kv_b_proj(whole[:, 0, :, :rank])
            .view(batch, keys, heads, nope + v_dim)
            .transpose(1, 2)
            .split([nope, v_dim], dim=-1)
        )
        key = torch.cat([k_nope, whole[:, :, :, rank:].expand(batch, heads, keys, rope)], dim=-1)
        out = ops.attention(torch.cat([q_nope, q_rot], dim=-1), key, values, scale, True, 0, 0.0, False)
    return self.o_proj(out.reshape(batch, seq, heads * v_dim)), None
