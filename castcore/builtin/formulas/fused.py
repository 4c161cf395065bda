"""The core's fused operators (castcore.builtin.fused_ops): the same work as the eager ops they replace,
with the memory traffic of one kernel: inputs read once, outputs written once, no intermediates."""

from __future__ import annotations

import math

import torch

from castcore.builtin.formulas.attention import SOFTMAX_OPS_PER_SCORE
from castcore.builtin.formulas.matmul import product_dtype
from castcore.builtin.formulas.pointwise import GELU, SIGMOID, TANH
from castcore.builtin.formulas.reductions import SOFTMAX_OPS_PER_ELEMENT
from castcore.builtin.attention_ops import is_decode, kept_keys, latent_widths
from castcore.builtin.fused_ops import OPS
from castcore.devices.costs import PerformanceProperties
from castcore.plugins.claims import register_op_properties
from castcore.recording.invoke import OpInvoke

RMS_NORM = 2 + 1 + 1  # mean of squares, scale by the reciprocal RMS, times the weight (per element)
ROTARY = 3  # x * cos + rotate_half(x) * sin: two multiplies and an add per element (the negation is free)
SILU_AND_MUL = SIGMOID + 1 + 1  # silu(gate) = gate * sigmoid(gate), times up


def _vector(invoke: OpInvoke, x, ops: float) -> PerformanceProperties:
    return invoke.memory_access_properties().add(x.dtype, gp=ops)


# rotary_qk_norm: a deployed step hoists it into the rotary kernel; this is its work where it runs alone
@register_op_properties(OPS["rotary_qk_norm"])
@register_op_properties(OPS["rms_norm"])
def _rms_norm(invoke: OpInvoke, device) -> PerformanceProperties:
    x = invoke.args[0]
    return _vector(invoke, x, RMS_NORM * x.numel())


@register_op_properties(OPS["add_rms_norm"])
def _add_rms_norm(invoke: OpInvoke, device) -> PerformanceProperties:
    x = invoke.args[0]
    return _vector(invoke, x, (1 + RMS_NORM) * x.numel())


@register_op_properties(OPS["rotary_embedding"])
def _rotary(invoke: OpInvoke, device) -> PerformanceProperties:
    q, k = invoke.args[:2]
    return _vector(invoke, q, ROTARY * (q.numel() + k.numel()))


@register_op_properties(OPS["kv_cache_write"])
def _kv_cache_write(invoke: OpInvoke, device) -> PerformanceProperties:
    # the new keys and values read, written in place at their positions: nothing else of the cache is touched
    keys, values, position, key, value = invoke.args[:5]
    return PerformanceProperties(
        memory_read_bytes=position.nbytes + key.nbytes + value.nbytes,
        memory_write_bytes=key.numel() * keys.element_size() + value.numel() * values.element_size(),
    )


@register_op_properties(OPS["silu_and_mul"])
def _silu_and_mul(invoke: OpInvoke, device) -> PerformanceProperties:
    return _vector(invoke, invoke.args[0], SILU_AND_MUL * invoke.outputs()[0].numel())


@register_op_properties(OPS["clamped_swiglu"])
def _clamped_swiglu(invoke: OpInvoke, device) -> PerformanceProperties:
    # per output element: two bias adds, two clamps, alpha * gate, its sigmoid, gate times that, up + 1, the product
    return _vector(invoke, invoke.args[0], (SIGMOID + 7) * invoke.outputs()[0].numel())


@register_op_properties(OPS["gelu_and_mul"])
def _gelu_and_mul(invoke: OpInvoke, device) -> PerformanceProperties:
    per_element = GELU.get(invoke.argument("approximate"), GELU["none"]) + 1
    return _vector(invoke, invoke.args[0], per_element * invoke.outputs()[0].numel())


@register_op_properties(OPS["attention"])
def _attention(invoke: OpInvoke, device) -> PerformanceProperties:
    """Two products over the kept (query, key) pairs, softmax per kept score (and a tanh for a soft cap);
    q, k and v read once at their own dtype (a cache in fp8 is read as fp8), the output written once. A kernel
    without grouped-KV sharing (``kv_per_query_head``) reads k and v once per query head instead. Keys no query
    of a causal call can see (before a sliding window or the queries' chunk) are not read: a decode step over a
    long cache reads only its window."""
    q, k, v = invoke.args[:3]
    batch, heads, q_len, _ = q.shape
    causal, window, chunk = invoke.argument("causal"), invoke.argument("window"), invoke.argument("chunk")
    props = _attention_properties(invoke, batch * heads * kept_keys(q_len, k.shape[2], causal, window, chunk))
    kv_len = k.shape[2]
    first = kv_len - q_len  # the first query's position, bottom-right aligned
    start = max(0, first - window + 1) if window else (first // chunk * chunk if chunk else 0)
    if causal and start > 0:
        per_group = heads // k.shape[1] if invoke.argument("kv_per_query_head") else 1
        props.memory_read_bytes -= per_group * (k.nbytes + v.nbytes) * min(start, kv_len) / kv_len
    return props


@register_op_properties(OPS["varlen_attention"])
def _varlen_attention(invoke: OpInvoke, device) -> PerformanceProperties:
    """``attention``'s work summed over the packed sequences, each its queries against its own keys, in one kernel;
    and the new tokens' keys and values written to the cache (an engine's cache write, vLLM's reshape_and_cache)."""
    causal, window, chunk = invoke.argument("causal"), invoke.argument("window"), invoke.argument("chunk")
    q, k, v = invoke.args[:3]
    new = invoke.argument("new")
    props = _attention_properties(
        invoke,
        q.shape[1]
        * sum(kept_keys(n, c + n, causal, window, chunk) for n, c in zip(new, invoke.argument("cached"))),
    )
    props.memory_write_bytes += sum(new) * k.shape[1] * (k.shape[-1] + v.shape[-1]) * k.dtype.itemsize
    return props


@register_op_properties(OPS["latent_attention"])
def _latent_attention(invoke: OpInvoke, device) -> PerformanceProperties:
    """Scores over rank + rope columns and values over rank columns for every kept (query, key) pair of every
    head; the latent cache read once for all heads (its values are its first columns, not a second tensor)."""
    q, latent = invoke.args[:2]
    batch, heads, q_len, dim = q.shape
    pairs = batch * heads * kept_keys(q_len, latent.shape[2], invoke.argument("causal"), 0)
    props = invoke.memory_access_properties()
    props.kernel = "attention"
    props.add(product_dtype(invoke, q.dtype), mma=2 * pairs * (dim + invoke.argument("rank")))
    return props.add(torch.float32 if q.dtype.itemsize == 1 else q.dtype, gp=SOFTMAX_OPS_PER_SCORE * pairs)


@register_op_properties(OPS["latent_entry"])
def _latent_entry(invoke: OpInvoke, device) -> PerformanceProperties:
    """A concatenation: both parts read, the entry written. A deployed step hoists it into the cache write."""
    return invoke.memory_access_properties()


@register_op_properties(OPS["varlen_latent_attention"])
def _varlen_latent_attention(invoke: OpInvoke, device) -> PerformanceProperties:
    """Each packed sequence as the engine runs it. Absorbed (a decode): its queries multiplied into the latent
    space and the result out of it through kv_b, scores over rank + rope columns and values over rank columns of
    its latent entries. Decompressed (a prompt chunk): kv_b over every one of its keys, the per-head keys and
    values written and read back by flash attention (query/key nope + rope wide, values v_dim). Every input is
    read once (the latent entries, kv_b, the queries) and the new tokens' entries are written to the cache. The
    call runs as the engine's kernels: the cache write, then for decodes the product into the latent space, the
    attention and the product out of it, for prompt chunks the decompression and the attention."""
    q, latent, kv_b = invoke.args[:3]
    heads = q.shape[1]
    nope, rope, v_dim, rank = latent_widths(q, latent, kv_b)
    mma = scores = unpacked = 0
    decodes = prompts = False
    for n, c in zip(invoke.argument("new"), invoke.argument("cached")):
        pairs = heads * kept_keys(n, c + n, True, 0)
        scores += pairs
        if is_decode(n, c):
            decodes = True
            mma += 2 * n * heads * rank * (nope + v_dim) + 2 * pairs * (rank + rope + rank)
        else:
            mma += 2 * (c + n) * heads * rank * (nope + v_dim) + 2 * pairs * (nope + rope + v_dim)
            unpacked += (c + n) * heads * (nope + rope + v_dim)
            prompts = True
    props = invoke.memory_access_properties()
    props.kernel = "attention"
    props.launches = 1 + 3 * decodes + 2 * prompts
    props.memory_write_bytes += (
        sum(invoke.argument("new")) * latent.shape[-1] * latent.dtype.itemsize + unpacked * q.dtype.itemsize
    )
    props.memory_read_bytes += unpacked * q.dtype.itemsize
    props.add(product_dtype(invoke, q.dtype), mma=mma)
    return props.add(torch.float32 if q.dtype.itemsize == 1 else q.dtype, gp=SOFTMAX_OPS_PER_SCORE * scores)


def _attention_properties(invoke: OpInvoke, pairs: int) -> PerformanceProperties:
    q, k, v = invoke.args[:3]
    heads, dim = q.shape[1], q.shape[-1]
    capped = TANH + 2 if invoke.argument("softcap") else 0
    props = invoke.memory_access_properties()
    if invoke.argument("kv_per_query_head"):
        props.memory_read_bytes += (heads // k.shape[1] - 1) * (k.nbytes + v.nbytes)
    props.kernel = "attention"
    props.add(product_dtype(invoke, q.dtype), mma=2 * pairs * (dim + v.shape[-1]))
    # The online softmax runs on the fp32 scores whatever the inputs' dtype (fp8 has no vector arithmetic).
    return props.add(
        torch.float32 if q.dtype.itemsize == 1 else q.dtype, gp=(SOFTMAX_OPS_PER_SCORE + capped) * pairs
    )


@register_op_properties(OPS["topk_softmax"])
def _topk_softmax(invoke: OpInvoke, device) -> PerformanceProperties:
    logits = invoke.args[0]
    # softmax, then a k-step selection over the experts of each token, then k divisions to renormalise
    per_element = SOFTMAX_OPS_PER_ELEMENT + math.log2(max(invoke.argument("k"), 2))
    return _vector(invoke, logits, per_element * logits.numel())


@register_op_properties(OPS["grouped_topk"])
def _grouped_topk(invoke: OpInvoke, device) -> PerformanceProperties:
    logits = invoke.args[0]
    # sigmoid and the bias per score, each group's two best and their sum, a pick of groups, then a k-step
    # selection over the experts and the renormalising divisions
    per_element = SIGMOID + 1 + 2 + math.log2(max(invoke.argument("k"), 2))
    return _vector(invoke, logits, per_element * logits.numel())


@register_op_properties(OPS["moe_permute"])
def _moe_permute(invoke: OpInvoke, device) -> PerformanceProperties:
    """Reads each token once and the expert ids, sorts the ids (n log2 n compares), writes k copies of each row."""
    hidden, ids = invoke.args[:2]
    rows = ids.numel()
    props = invoke.memory_access_properties()
    return props.add(ids.dtype, gp=rows * max(1.0, math.log2(max(rows, 2))))


@register_op_properties(OPS["moe_unpermute"])
def _moe_unpermute(invoke: OpInvoke, device) -> PerformanceProperties:
    """Reads every expert row and its router weight once: a multiply-add per element into the token's sum."""
    rows = invoke.args[0]
    return _vector(invoke, rows, 2 * rows.numel())
