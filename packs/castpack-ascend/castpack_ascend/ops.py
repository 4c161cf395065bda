"""Ascend fused operators as torch.library ops in the ``ascend`` namespace.

Each op is shaped after the torch_npu operator Ascend users call (named in its docstring) so a model
written for an NPU captures it as one op. Every op has a plain-torch reference implementation (so it runs
on CPU and its fake shapes can be checked against real ones) and a fake implementation (what castcore's
capture runs). Arguments that carry data torch_npu reads on the host (sequence lengths, group sizes) are
``int[]`` here as there, so an estimator sees them.
"""

from __future__ import annotations


import torch
from torch import Tensor

LAYOUTS = ("BSH", "BSND", "BNSD")


# --- norms ------------------------------------------------------------------------------------------

def _rstd_shape(x: Tensor, gamma: Tensor) -> tuple[int, ...]:
    return (*x.shape[: x.dim() - gamma.dim()], *([1] * gamma.dim()))


@torch.library.custom_op("ascend::rms_norm", mutates_args=())
def rms_norm(x: Tensor, gamma: Tensor, epsilon: float = 1e-6) -> tuple[Tensor, Tensor]:
    """torch_npu.npu_rms_norm(x, gamma, epsilon) -> (y, rstd): y = x * rstd * gamma over gamma's dims."""
    dims = tuple(range(x.dim() - gamma.dim(), x.dim()))
    xf = x.float()
    rstd = torch.rsqrt(xf.pow(2).mean(dims, keepdim=True) + epsilon)
    return (xf * rstd * gamma.float()).to(x.dtype), rstd


@rms_norm.register_fake
def _(x, gamma, epsilon=1e-6):
    return x.new_empty(x.shape), x.new_empty(_rstd_shape(x, gamma), dtype=torch.float32)


@torch.library.custom_op("ascend::add_rms_norm", mutates_args=())
def add_rms_norm(x1: Tensor, x2: Tensor, gamma: Tensor, epsilon: float = 1e-6) -> tuple[Tensor, Tensor, Tensor]:
    """torch_npu.npu_add_rms_norm(x1, x2, gamma, epsilon) -> (y, rstd, x): x = x1 + x2, y = rms_norm(x)."""
    x = x1 + x2
    y, rstd = rms_norm(x, gamma, epsilon)
    return y, rstd, x


@add_rms_norm.register_fake
def _(x1, x2, gamma, epsilon=1e-6):
    return (x1.new_empty(x1.shape), x1.new_empty(_rstd_shape(x1, gamma), dtype=torch.float32),
            x1.new_empty(x1.shape))


# --- activations and rotary embedding ---------------------------------------------------------------

@torch.library.custom_op("ascend::swiglu", mutates_args=())
def swiglu(x: Tensor, dim: int = -1) -> Tensor:
    """torch_npu.npu_swiglu(x, dim): x split in halves (a, b) along dim, silu(a) * b."""
    a, b = x.chunk(2, dim=dim)
    return torch.nn.functional.silu(a) * b


@swiglu.register_fake
def _(x, dim=-1):
    shape = list(x.shape)
    shape[dim] //= 2
    return x.new_empty(shape)


def _rotate_half(x: Tensor) -> Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


@torch.library.custom_op("ascend::rotary_mul", mutates_args=())
def rotary_mul(x: Tensor, r1: Tensor, r2: Tensor) -> Tensor:
    """torch_npu.npu_rotary_mul(x, r1, r2): x * r1 + rotate_half(x) * r2 (r1 = cos, r2 = sin, broadcast)."""
    return x * r1 + _rotate_half(x) * r2


@rotary_mul.register_fake
def _(x, r1, r2):
    return x.new_empty(x.shape)


@torch.library.custom_op("ascend::apply_rotary_pos_emb", mutates_args=())
def apply_rotary_pos_emb(query: Tensor, key: Tensor, cos: Tensor, sin: Tensor,
                         layout: str = "BSND") -> tuple[Tensor, Tensor]:
    """torch_npu.npu_apply_rotary_pos_emb(query, key, cos, sin, layout): the rotation of query and key in
    one kernel (torch_npu updates them in place; this functional form returns them). cos/sin broadcast
    against query and key in ``layout`` ('BSND' or 'BNSD')."""
    return rotary_mul(query, cos, sin), rotary_mul(key, cos, sin)


@apply_rotary_pos_emb.register_fake
def _(query, key, cos, sin, layout="BSND"):
    return query.new_empty(query.shape), key.new_empty(key.shape)


# --- attention ----------------------------------------------------------------------------------------

def to_bnsd(t: Tensor, layout: str, heads: int) -> Tensor:
    """(B, N, S, D) view of a tensor in ``layout``."""
    if layout == "BNSD":
        return t
    if layout == "BSND":
        return t.transpose(1, 2)
    if layout == "BSH":
        b, s, h = t.shape
        return t.view(b, s, heads, h // heads).transpose(1, 2)
    raise ValueError(f"input_layout {layout!r} not supported; use one of {', '.join(LAYOUTS)}")


def from_bnsd(t: Tensor, layout: str) -> Tensor:
    if layout == "BNSD":
        return t
    if layout == "BSND":
        return t.transpose(1, 2)
    b, n, s, d = t.shape
    return t.transpose(1, 2).reshape(b, s, n * d)


def is_causal(atten_mask, next_tokens: int, sparse_mode: int) -> bool:
    """torch_npu's masking: sparse_mode 2 (leftUpCausal) and 3 (rightDownCausal) are causal, as is
    sparse_mode 0 with a mask and next_tokens == 0. This op also accepts sparse_mode 2/3 without the
    compressed 2048x2048 mask torch_npu requires, so a capture need not allocate it."""
    return sparse_mode in (2, 3) or (sparse_mode == 0 and atten_mask is not None and next_tokens == 0)


def _attend(q, k, v, causal: bool, scale: float, kv_heads: int) -> Tensor:
    groups = q.shape[1] // kv_heads
    if groups > 1:
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    scores = (q.float() @ k.float().transpose(-1, -2)) * scale
    if causal:  # bottom-right aligned, as sparse_mode 3 and a prefill over a cache
        qs, ks = scores.shape[-2:]
        keep = torch.ones(qs, ks, dtype=torch.bool, device=q.device).tril(ks - qs)
        scores = scores.masked_fill(~keep, float("-inf"))
    return (scores.softmax(-1) @ v.float()).to(q.dtype)


@torch.library.custom_op("ascend::prompt_flash_attention", mutates_args=())
def prompt_flash_attention(query: Tensor, key: Tensor, value: Tensor, atten_mask: Tensor | None = None,
                           actual_seq_lengths: list[int] | None = None, num_heads: int = 1,
                           scale_value: float = 1.0, pre_tokens: int = 2147483647, next_tokens: int = 0,
                           input_layout: str = "BSH", num_key_value_heads: int = 0,
                           actual_seq_lengths_kv: list[int] | None = None, sparse_mode: int = 0) -> Tensor:
    """torch_npu.npu_prompt_flash_attention (full / prefill FlashAttention) with GQA: key and value carry
    ``num_key_value_heads`` heads (0 = num_heads). Output has query's shape."""
    kv_heads = num_key_value_heads or num_heads
    q = to_bnsd(query, input_layout, num_heads)
    k, v = to_bnsd(key, input_layout, kv_heads), to_bnsd(value, input_layout, kv_heads)
    out = _attend(q, k, v, is_causal(atten_mask, next_tokens, sparse_mode), scale_value, kv_heads)
    return from_bnsd(out, input_layout)


@prompt_flash_attention.register_fake
def _(query, key, value, atten_mask=None, actual_seq_lengths=None, num_heads=1, scale_value=1.0,
      pre_tokens=2147483647, next_tokens=0, input_layout="BSH", num_key_value_heads=0,
      actual_seq_lengths_kv=None, sparse_mode=0):
    return query.new_empty(query.shape)


def paged_to_bnsd(cache: Tensor, block_table: Tensor, kv_heads: int, length: int) -> Tensor:
    """(B, N, S, D) from a paged cache (num_blocks, block_size, N*D) and a (B, max_blocks) block table."""
    blocks, block_size, h = cache.shape
    gathered = cache[block_table.long()]  # (B, max_blocks, block_size, H)
    b = block_table.shape[0]
    flat = gathered.reshape(b, -1, h)[:, :length]
    return flat.view(b, length, kv_heads, h // kv_heads).transpose(1, 2)


@torch.library.custom_op("ascend::incre_flash_attention", mutates_args=())
def incre_flash_attention(query: Tensor, key: Tensor, value: Tensor, atten_mask: Tensor | None = None,
                          actual_seq_lengths: list[int] | None = None, block_table: Tensor | None = None,
                          num_heads: int = 1, scale_value: float = 1.0, input_layout: str = "BSH",
                          num_key_value_heads: int = 0, block_size: int = 0) -> Tensor:
    """torch_npu.npu_incre_flash_attention (decode: one query token per sequence) with GQA and, when
    ``block_table`` is given, a paged KV cache: key/value are (num_blocks, block_size, kv_heads*D) and
    ``actual_seq_lengths`` the tokens each sequence holds. Output has query's shape."""
    kv_heads = num_key_value_heads or num_heads
    q = to_bnsd(query, input_layout, num_heads)
    if block_table is None:
        k, v = to_bnsd(key, input_layout, kv_heads), to_bnsd(value, input_layout, kv_heads)
        return from_bnsd(_attend(q, k, v, False, scale_value, kv_heads), input_layout)
    lengths = actual_seq_lengths or [block_table.shape[1] * key.shape[1]] * q.shape[0]
    outs = []
    for i, n in enumerate(lengths):
        k = paged_to_bnsd(key, block_table[i:i + 1], kv_heads, n)
        v = paged_to_bnsd(value, block_table[i:i + 1], kv_heads, n)
        outs.append(_attend(q[i:i + 1], k, v, False, scale_value, kv_heads))
    return from_bnsd(torch.cat(outs), input_layout)


@incre_flash_attention.register_fake
def _(query, key, value, atten_mask=None, actual_seq_lengths=None, block_table=None, num_heads=1,
      scale_value=1.0, input_layout="BSH", num_key_value_heads=0, block_size=0):
    return query.new_empty(query.shape)


# --- mixture of experts -------------------------------------------------------------------------------

def group_sizes(group_list: list[int] | None, group_list_type: int, tokens: int, groups: int) -> list[int]:
    """Tokens per group: from cumulative ends (type 0, torch_npu's default) or counts (type 1); an even
    split when no list is given."""
    if group_list is None:
        return [tokens // groups + (i < tokens % groups) for i in range(groups)]
    if group_list_type == 0:
        return [end - start for start, end in zip([0, *group_list[:-1]], group_list)]
    return list(group_list)


@torch.library.custom_op("ascend::grouped_matmul", mutates_args=())
def grouped_matmul(x: Tensor, weight: Tensor, bias: Tensor | None = None, group_list: list[int] | None = None,
                   group_list_type: int = 0) -> Tensor:
    """torch_npu.npu_grouped_matmul in its single-tensor form (split_item=3): tokens sorted by expert,
    x (T, K), weight (E, K, N), group g's rows times weight[g]; out (T, N)."""
    sizes = group_sizes(group_list, group_list_type, x.shape[0], weight.shape[0])
    outs, start = [], 0
    for g, size in enumerate(sizes):
        part = x[start:start + size] @ weight[g]
        outs.append(part + bias[g] if bias is not None else part)
        start += size
    return torch.cat(outs)


@grouped_matmul.register_fake
def _(x, weight, bias=None, group_list=None, group_list_type=0):
    return x.new_empty((x.shape[0], weight.shape[-1]))


@torch.library.custom_op("ascend::moe_gating_top_k_softmax", mutates_args=())
def moe_gating_top_k_softmax(x: Tensor, finished: Tensor | None = None, k: int = 1) -> tuple[Tensor, Tensor, Tensor]:
    """torch_npu.npu_moe_gating_top_k_softmax(x, finished, k) -> (y, expert_idx, row_idx): softmax over the
    experts of each row of x (tokens, E), its top k values and expert indices, and each pick's row index."""
    probs = x.float().softmax(-1)
    y, idx = probs.topk(k, dim=-1)
    rows = torch.arange(x.shape[0] * k, dtype=torch.int32, device=x.device).view(k, -1).t()
    return y.to(x.dtype), idx.to(torch.int32), rows.contiguous()


@moe_gating_top_k_softmax.register_fake
def _(x, finished=None, k=1):
    shape = (*x.shape[:-1], k)
    return x.new_empty(shape), x.new_empty(shape, dtype=torch.int32), x.new_empty(shape, dtype=torch.int32)


OPS = {name: getattr(torch.ops.ascend, name).default for name in (
    "rms_norm", "add_rms_norm", "swiglu", "rotary_mul", "apply_rotary_pos_emb", "prompt_flash_attention",
    "incre_flash_attention", "grouped_matmul", "moe_gating_top_k_softmax")}
