"""Work of the core's sparse-attention operators (castcore.builtin.sparse_attention_ops), as DeepSeek's kernels run
DeepSeek-V3.2's attention.

The indexer scores every key a query sees, with all its index heads, in fp8 where the device has an fp8 matrix
rate (DeepGEMM's ``fp8_mqa_logits``; the indexer's key cache holds each token's key in fp8 with one fp32 scale
per 128: DeepSeek-V3.2-Exp's inference code, deepseek-ai/DeepSeek-V3.2-Exp inference/model.py ``Indexer``, and
vLLM's indexer cache), then a top-k kernel keeps the best ``topk``. The attention then runs absorbed over the
latent entries each query picked: scores over rank + rope columns and values over rank columns per (query, key)
pair and head, the picked entries gathered once per query for all its heads (FlashMLA's sparse kernels), at most
the whole cache once from memory."""

from __future__ import annotations

import torch

from castcore.builtin import sparse_attention_ops  # noqa: F401  (defines the ops)
from castcore.builtin.attention_ops import kept_keys
from castcore.builtin.formulas.attention import SOFTMAX_OPS_PER_SCORE
from castcore.builtin.formulas.matmul import product_dtype
from castcore.builtin.sparse_attention_ops import picked_keys
from castcore.devices.costs import PerformanceProperties
from castcore.plugins.claims import register_op_properties
from castcore.recording.invoke import OpInvoke

FP8 = torch.float8_e4m3fn
SCALE_GROUP = 128  # index-key elements per fp32 scale
ops = torch.ops.castcore


def _sequences(invoke: OpInvoke, q_len: int, kv_len: int) -> list[tuple[int, int]]:
    """(queries, keys) of each sequence of a call: the batch's rows alike, or a packed row's own lengths."""
    if invoke.name.startswith("castcore::varlen_"):
        return [(n, c + n) for n, c in zip(invoke.argument("new"), invoke.argument("cached"))]
    return [(q_len, kv_len)] * invoke.args[0].shape[0]


@register_op_properties(ops.lightning_indexer.default)
@register_op_properties(ops.varlen_lightning_indexer.default)
def _lightning_indexer(invoke: OpInvoke, device) -> PerformanceProperties:
    """Per (query, key) pair it sees: a product over each index head's dim, a relu and a weighted sum over the
    heads; then the top-k over the pair's scores. The keys are read as the fp8 cache holds them."""
    q, _, keys = invoke.args[:3]
    _, q_len, heads, dim = q.shape
    pairs = sum(kept_keys(n, kv, True, 0) for n, kv in _sequences(invoke, q_len, keys.shape[1]))
    fp8 = "float8_e4m3fn" in getattr(device, "mma_flops", {})
    props = invoke.memory_access_properties()
    if fp8:  # 1 byte a key element and 4 per 128 of them, where the model dtype was counted
        props.memory_read_bytes -= keys.nbytes - round(keys.numel() * (1 + 4 / SCALE_GROUP))
    props.launches = 2  # the scores, then the top-k
    props.add(FP8 if fp8 else product_dtype(invoke, q.dtype), mma=2 * pairs * heads * dim)
    return props.add(torch.float32, gp=pairs * (2 * heads + 1))  # relu and weighted sum per head, the top-k


@register_op_properties(ops.sparse_latent_attention.default)
@register_op_properties(ops.varlen_sparse_latent_attention.default)
def _sparse_latent_attention(invoke: OpInvoke, device) -> PerformanceProperties:
    q, latent, indices = invoke.args[:3]
    _, heads, q_len, dim = q.shape
    rank, topk = invoke.argument("rank"), indices.shape[-1]
    picked = [(picked_keys(n, kv, topk), kv) for n, kv in _sequences(invoke, q_len, latent.shape[2])]
    pairs = heads * sum(p for p, _ in picked)
    props = invoke.memory_access_properties()
    # each query gathers its picks, which its heads share; from memory, at most its sequence's cache once
    gathered = sum(min(p, kv) for p, kv in picked) * dim * latent.dtype.itemsize
    props.memory_read_bytes -= latent.nbytes - gathered
    props.kernel = "attention"
    props.add(product_dtype(invoke, q.dtype), mma=2 * pairs * (dim + rank))
    return props.add(torch.float32 if q.dtype.itemsize == 1 else q.dtype, gp=SOFTMAX_OPS_PER_SCORE * pairs)
