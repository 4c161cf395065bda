"""The core's device-neutral fused operators: what a serving engine runs instead of the eager graph.

Each is a ``torch.library`` custom op in the ``castcore`` namespace with a reference implementation (so a
fused model computes what the eager one does, checked by the tests) and a fake one (so it captures on the
meta device as one call). Their work is counted in ``castcore.builtin.formulas.fused``; a pack may claim
any of them for its devices. ``castcore.deploy.kernels.fusing`` rewrites models to call them.

This module defines the norms, the rotary embedding and the gated activations; the attention ops live in
``castcore.builtin.attention_ops``, the mixture-of-experts ones in ``castcore.builtin.moe_ops`` and the
linear-attention ones in ``castcore.builtin.recurrent_ops`` and the Mamba-2 ones in ``castcore.builtin.ssm_ops``,
which it imports, so importing it defines them all. Here too: the eager ops each stands in for, and ``OPS``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from castcore.builtin import attention_ops, moe_ops, recurrent_ops, ssm_ops  # noqa: F401  (define their ops)
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


@torch.library.custom_op("castcore::rotary_qk_norm", mutates_args=())
def rotary_qk_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float) -> torch.Tensor:
    """A per-head query or key RMSNorm that the rotary kernel after it computes (TensorRT-LLM's
    fusedQKNormRope, SGLang's fused_qknorm_rope, vLLM's fused_qk_norm_rope): rms_norm's values, and no kernel of
    its own in a deployed step (castcore.deploy.engine_step)."""
    return _rms(x, weight, eps, offset)


@rotary_qk_norm.register_fake
def _(x, weight, eps, offset):
    return torch.empty_like(x)


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


@torch.library.custom_op("castcore::kv_cache_write", mutates_args=("keys", "values"))
def kv_cache_write(
    keys: torch.Tensor, values: torch.Tensor, position: torch.Tensor, key: torch.Tensor, value: torch.Tensor
) -> None:
    """The new tokens' keys and values written into a static cache at ``position`` along dim 2, both by one
    kernel as engines write them (vLLM's reshape_and_cache_flash, MLA's concat_and_cache_mla)."""
    keys.index_copy_(2, position, key)
    values.index_copy_(2, position, value)


@kv_cache_write.register_fake
def _(keys, values, position, key, value):
    return None


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
    "castcore::rotary_qk_norm": (
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
    "castcore::varlen_latent_attention": (
        "aten::_scaled_dot_product_flash_attention_for_cpu",
        "aten::_scaled_dot_product_attention_math",
        "aten::bmm",
        "aten::_softmax",
        "aten::expand",
    ),
    "castcore::causal_conv1d": ("aten::conv1d", "aten::convolution", "aten::silu", "aten::cat"),
    "castcore::gated_delta_rule": ("aten::mul.Tensor", "aten::sum.dim_IntList", "aten::exp", "aten::matmul"),
    "castcore::gated_rms_norm": ("aten::pow.Tensor_Scalar", "aten::mean.dim", "aten::rsqrt", "aten::silu"),
    "castcore::ssd_scan": (
        "aten::mul.Tensor",
        "aten::sum.dim_IntList",
        "aten::exp",
        "aten::einsum",
        "aten::cumsum",
    ),
    "castcore::gated_group_rms_norm": (
        "aten::pow.Tensor_Scalar",
        "aten::mean.dim",
        "aten::rsqrt",
        "aten::silu",
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
    "castcore::kv_cache_write": ("aten::index_copy_",),
}

for _fused, _eager in _REPLACES.items():
    declare_replaces(_fused, _eager)

OPS = {
    name: getattr(torch.ops.castcore, name).default
    for name in (
        "rms_norm",
        "add_rms_norm",
        "rotary_qk_norm",
        "rotary_embedding",
        "kv_cache_write",
        "silu_and_mul",
        "gelu_and_mul",
        "attention",
        "varlen_attention",
        "latent_attention",
        "latent_entry",
        "varlen_latent_attention",
        "topk_softmax",
        "grouped_topk",
        "moe_permute",
        "moe_unpermute",
        "clamped_swiglu",
    )
}
