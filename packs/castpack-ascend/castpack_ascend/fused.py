"""Work (op_properties) and time (estimators) of the ``ascend::`` fused operators.

Properties count the useful work with the core's conventions, so a fused model's FLOPs match the stock
model it replaces; estimators time the same work as the hardware does it (fractal padding on the Cube,
32-byte rows on the vector unit, cube and vector overlapped, the fixed cost per kernel): see hardware.py.
"""

from __future__ import annotations

import math


from castcore import pack
from castcore.pack import formulas

from .hardware import padded_mkn, padded_rows, timed
from .ops import OPS, group_sizes, is_causal

DEVICES = "ascend-*"
RMS_NORM = 2 + 1 + 1  # mean of squares, scale by rstd, times gamma (the core's rms_norm count)
SWIGLU = formulas.pointwise.OPS_PER_ELEMENT["silu"] + 1  # silu(a) * b, per output element
ROTARY = 3.5  # x*cos + rotate_half(x)*sin: two multiplies, an add, and a negation on half the elements


def _props(invoke, dtype, *, mma=0.0, gp=0.0, read=None):
    props = invoke.memory_access_properties()
    if read is not None:
        props.memory_read_bytes = read
    return props.add(dtype, mma=mma, gp=gp)


def _vector_time(invoke, device, props, x, per_element, extra_detail=None):
    lanes = padded_rows(x.shape, x.dtype)
    return timed(device, vector={x.dtype: per_element * lanes}, read_bytes=props.memory_read_bytes,
                 write_bytes=props.memory_write_bytes,
                 detail={"elements": x.numel(), "padded_elements": lanes, **(extra_detail or {})})


def _register(name, properties, estimator):
    pack.register_op_properties(OPS[name])(properties)
    pack.register_op_estimator(OPS[name], device=DEVICES)(estimator)


# --- norms, activations, rotary ---------------------------------------------------------------------

def rms_norm_properties(invoke, device):
    x = invoke.args[0]
    return _props(invoke, x.dtype, gp=RMS_NORM * x.numel())


def add_rms_norm_properties(invoke, device):
    x = invoke.args[0]
    return _props(invoke, x.dtype, gp=(1 + RMS_NORM) * x.numel())


def swiglu_properties(invoke, device):
    x, out = invoke.args[0], invoke.outputs()[0]
    return _props(invoke, x.dtype, gp=SWIGLU * out.numel())


def rotary_mul_properties(invoke, device):
    x = invoke.args[0]
    return _props(invoke, x.dtype, gp=ROTARY * x.numel())


def apply_rotary_properties(invoke, device):
    q, k = invoke.args[:2]
    return _props(invoke, q.dtype, gp=ROTARY * (q.numel() + k.numel()))


def _rowwise_estimator(properties, per_element_of):
    def estimate(invoke, device):
        props = properties(invoke, device)
        x = invoke.args[0]
        return _vector_time(invoke, device, props, x, per_element_of(invoke))
    return estimate


_register("rms_norm", rms_norm_properties, _rowwise_estimator(rms_norm_properties, lambda i: RMS_NORM))
_register("add_rms_norm", add_rms_norm_properties,
          _rowwise_estimator(add_rms_norm_properties, lambda i: 1 + RMS_NORM))
# swiglu reads x (2 halves) and writes half: per input element SWIGLU / 2.
_register("swiglu", swiglu_properties, _rowwise_estimator(swiglu_properties, lambda i: SWIGLU / 2))
_register("rotary_mul", rotary_mul_properties, _rowwise_estimator(rotary_mul_properties, lambda i: ROTARY))


def apply_rotary_estimator(invoke, device):
    props = apply_rotary_properties(invoke, device)
    q, k = invoke.args[:2]
    lanes = padded_rows(q.shape, q.dtype) + padded_rows(k.shape, k.dtype)
    return timed(device, vector={q.dtype: ROTARY * lanes}, read_bytes=props.memory_read_bytes,
                 write_bytes=props.memory_write_bytes, detail={"padded_elements": lanes})


_register("apply_rotary_pos_emb", apply_rotary_properties, apply_rotary_estimator)


# --- attention ----------------------------------------------------------------------------------------

def _dims(q, k, layout: str, heads: int, kv_heads: int):
    """(batch, q_len, kv_len, head_dim) from query and key in ``layout``."""
    if layout == "BNSD":
        return q.shape[0], q.shape[2], k.shape[2], q.shape[3]
    if layout == "BSND":
        return q.shape[0], q.shape[1], k.shape[1], q.shape[3]
    return q.shape[0], q.shape[1], k.shape[1], q.shape[2] // heads


def _heads(invoke):
    heads = invoke.argument("num_heads")
    return heads, invoke.argument("num_key_value_heads") or heads


def _pfa_pairs(invoke):
    q, k = invoke.args[:2]
    heads, kv_heads = _heads(invoke)
    batch, q_len, kv_len, dim = _dims(q, k, invoke.argument("input_layout"), heads, kv_heads)
    causal = is_causal(invoke.argument("atten_mask"), invoke.argument("next_tokens"), invoke.argument("sparse_mode"))
    per_head = formulas.attention.causal_pairs(q_len, kv_len, bottom_right=True) if causal else q_len * kv_len
    return batch, heads, kv_heads, q_len, kv_len, dim, per_head, causal


def pfa_properties(invoke, device):
    batch, heads, _, _, _, dim, per_head, _ = _pfa_pairs(invoke)
    pairs = batch * heads * per_head
    return _props(invoke, invoke.args[0].dtype, mma=2 * pairs * 2 * dim, gp=formulas.attention.SOFTMAX_OPS_PER_SCORE * pairs)


def _attention_time(invoke, device, props, dtype, products, kept_fraction, softmax_pairs, detail):
    """``products``: (count, m, k, n) matrix products before masking; padded on the Cube and scaled by the
    fraction of score tiles the mask keeps."""
    cube = sum(count * 2 * math.prod(padded_mkn(m, k, n, dtype, device))
               for count, m, k, n in products) * kept_fraction
    useful = sum(count * 2 * m * k * n for count, m, k, n in products) * kept_fraction
    detail = {**detail, "cube_ops": cube, "useful_ops": useful, "padding_waste": 1 - useful / cube if cube else 0.0}
    return timed(device, cube={dtype: cube}, vector={dtype: formulas.attention.SOFTMAX_OPS_PER_SCORE * softmax_pairs},
                 read_bytes=props.memory_read_bytes, write_bytes=props.memory_write_bytes, detail=detail,
                 attention=True)


def pfa_estimator(invoke, device):
    props = pfa_properties(invoke, device)
    batch, heads, kv_heads, q_len, kv_len, dim, per_head, causal = _pfa_pairs(invoke)
    dtype = invoke.args[0].dtype
    products = [(batch * heads, q_len, dim, kv_len), (batch * heads, q_len, kv_len, dim)]  # QK^T, PV
    kept = per_head / (q_len * kv_len)
    mq, kd, nk = padded_mkn(q_len, dim, kv_len, dtype, device)
    return _attention_time(invoke, device, props, dtype, products, kept, batch * heads * per_head,
                           {"causal": causal, "gqa_group": heads // kv_heads,
                            "padded_shape": f"QK^T {mq}x{kd}x{nk} per head"})


_register("prompt_flash_attention", pfa_properties, pfa_estimator)


def _ifa_lengths(invoke):
    q, k = invoke.args[:2]
    heads, kv_heads = _heads(invoke)
    layout = invoke.argument("input_layout")
    block_table = invoke.argument("block_table")
    batch = q.shape[0]
    dim = q.shape[-1] if layout != "BSH" else q.shape[-1] // heads
    lengths = invoke.argument("actual_seq_lengths")
    if lengths is None:
        if block_table is not None:
            lengths = [block_table.shape[1] * k.shape[1]] * batch
        else:
            lengths = [_dims(q, k, layout, heads, kv_heads)[2]] * batch
    return batch, heads, kv_heads, dim, list(lengths), block_table


def ifa_properties(invoke, device):
    q, k, v = invoke.args[:3]
    batch, heads, kv_heads, dim, lengths, block_table = _ifa_lengths(invoke)
    pairs = heads * sum(lengths)
    read = None
    if block_table is not None:  # a paged cache: only the blocks in use are read
        kv_bytes = sum(lengths) * kv_heads * dim * (k.element_size() + v.element_size())
        read = q.nbytes + block_table.nbytes + kv_bytes
    return _props(invoke, q.dtype, mma=2 * pairs * 2 * dim, gp=formulas.attention.SOFTMAX_OPS_PER_SCORE * pairs, read=read)


def ifa_estimator(invoke, device):
    props = ifa_properties(invoke, device)
    batch, heads, kv_heads, dim, lengths, block_table = _ifa_lengths(invoke)
    dtype = invoke.args[0].dtype
    group = heads // kv_heads
    # One query token per sequence: the query heads sharing a KV head are stacked as the M dimension.
    products = [p for n in lengths for p in ((kv_heads, group, dim, n), (kv_heads, group, n, dim))]
    shape = "x".join(map(str, padded_mkn(group, dim, max(lengths), dtype, device)))
    return _attention_time(invoke, device, props, dtype, products, 1.0, heads * sum(lengths),
                           {"paged": block_table is not None, "gqa_group": group, "kv_lengths": lengths,
                            "padded_shape": f"QK^T {shape} per KV head (longest sequence)"})


_register("incre_flash_attention", ifa_properties, ifa_estimator)


# --- mixture of experts -------------------------------------------------------------------------------

def _groups(invoke):
    x, weight = invoke.args[:2]
    return group_sizes(invoke.argument("group_list"), invoke.argument("group_list_type"), x.shape[0], weight.shape[0])


def grouped_matmul_properties(invoke, device):
    x, weight = invoke.args[:2]
    k, n = weight.shape[-2], weight.shape[-1]
    sizes = _groups(invoke)
    used = sum(1 for s in sizes if s)  # experts with no tokens are skipped, their weights never read
    bias = invoke.argument("bias")
    read = x.nbytes + used * k * n * weight.element_size() + (bias.nbytes if bias is not None else 0)
    return _props(invoke, x.dtype, mma=2 * x.shape[0] * k * n, read=read)


def grouped_matmul_estimator(invoke, device):
    props = grouped_matmul_properties(invoke, device)
    x, weight = invoke.args[:2]
    k, n = weight.shape[-2], weight.shape[-1]
    sizes = _groups(invoke)
    cube = sum(2 * math.prod(padded_mkn(m, k, n, x.dtype, device)) for m in sizes if m)
    useful = 2 * x.shape[0] * k * n
    return timed(device, cube={x.dtype: cube}, read_bytes=props.memory_read_bytes,
                 write_bytes=props.memory_write_bytes,
                 detail={"group_sizes": sizes,
                         "padded_shape": [f"{m}->{padded_mkn(m, k, n, x.dtype, device)[0]}x{k}x{n}" for m in sizes],
                         "cube_ops": cube, "useful_ops": useful,
                         "padding_waste": 1 - useful / cube if cube else 0.0})


_register("grouped_matmul", grouped_matmul_properties, grouped_matmul_estimator)


def _gating_per_element(invoke):
    return formulas.reductions.SOFTMAX_OPS_PER_ELEMENT + math.log2(max(invoke.argument("k"), 2))


def gating_properties(invoke, device):
    x = invoke.args[0]
    return _props(invoke, x.dtype, gp=_gating_per_element(invoke) * x.numel())


_register("moe_gating_top_k_softmax", gating_properties, _rowwise_estimator(gating_properties, _gating_per_element))
