"""castcore's attention path through transformers' attention interface, and the older models' own attention.

castcore's attention (``ATTENTION``) is transformers' SDPA with the causal flag kept on fake tensors. Relies on
``AttentionInterface``, ``masking_utils`` and ``integrations.sdpa_attention`` (checked 5.5.0-5.24.0, as each
function says).
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable

import torch

ATTENTION = "castcore"  # castcore's attention path: transformers' SDPA with the causal flag kept
FUSED_ATTENTION = "castcore_fused"  # its deployed one (castcore.deploy.kernels.attention)


def supports_attention_backend(model: torch.nn.Module | type[torch.nn.Module]) -> bool:
    """Whether a model (class) calls attention through transformers' interface. Models written before it pick
    their attention class by name at init. Relies on ``_supports_attention_backend`` (checked 5.5.0-5.24.0)."""
    return bool(getattr(model, "_supports_attention_backend", True))


def calls_attention_interface(model: torch.nn.Module) -> bool:
    """Whether every attention module of the model calls transformers' attention interface, although its class
    says it does not support one (Qwen3-Next's, whose flag its linear-attention layers set). Relies on the
    interface's name, ``ALL_ATTENTION_FUNCTIONS``, in their forward's source (checked 5.24.0)."""
    found = {type(m) for m in model.modules() if type(m).__name__.endswith("Attention")}
    try:
        return bool(found) and all("ALL_ATTENTION_FUNCTIONS" in inspect.getsource(c.forward) for c in found)
    except (OSError, TypeError):
        return False


def no_attention_backend_note(model_name: str, attention: str) -> str:
    """What a user should know when a model keeps its own attention."""
    return (
        f"{model_name} cannot take castcore's attention path, so it runs its own {attention} attention: on "
        "fake tensors that builds an explicit causal mask, so attention is counted over every query-key pair, "
        "about twice the causal work"
    )


def register_attention(name: str, attention: Callable, mask: Callable) -> None:
    """An attention function and its mask function under ``name``, for ``config._attn_implementation``.
    Relies on ``AttentionInterface.register`` and ``masking_utils.AttentionMaskInterface.register`` (the mask
    function is called with sdpa_mask's arguments; checked 5.5.0-5.24.0)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(name, attention)
    AttentionMaskInterface.register(name, mask)


def sdpa_mask(*args, **kwargs):
    """transformers' SDPA mask: ``masking_utils.sdpa_mask(batch_size, q_length, kv_length, q_offset, kv_offset,
    ...)`` (q_length and q_offset from 5.5; cache_position before; checked 5.5.0-5.24.0)."""
    from transformers.masking_utils import sdpa_mask as mask

    return mask(*args, **kwargs)


def castcore_mask(
    batch_size, q_length, kv_length, q_offset=0, kv_offset=0, attention_mask=None, local_size=None, **kwargs
):
    """transformers' SDPA mask, left out when no padding is given: SDPA then applies causality itself
    (``is_causal``) or needs none (one query token). On fake tensors transformers' own SDPA path would
    materialise the causal mask and the attention op would lose its causal flag."""
    window_irrelevant = local_size is None or kv_length <= local_size
    if attention_mask is None and window_irrelevant and (q_length == 1 or q_length == kv_length):
        return None
    return sdpa_mask(
        batch_size,
        q_length,
        kv_length,
        q_offset,
        kv_offset,
        attention_mask=attention_mask,
        local_size=local_size,
        **kwargs,
    )


def castcore_attention(
    module, query, key, value, attention_mask, dropout=0.0, scaling=None, softcap=None, s_aux=None, **kwargs
):
    """transformers' SDPA attention; with a logit soft-cap (Gemma 2) or attention sinks (gpt-oss's ``s_aux``),
    which SDPA cannot apply, the ops an eager attention runs: scores, tanh cap, mask, softmax (with the sink
    column), weighted sum. Relies on ``integrations.sdpa_attention.sdpa_attention_forward`` (checked
    5.5.0-5.24.0)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if (
        key.dtype != query.dtype
    ):  # a KV cache in another dtype (--kv-cache): an eager kernel dequantizes it first
        key, value = key.to(query.dtype), value.to(query.dtype)
    if softcap is None and s_aux is None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    scores = torch.matmul(query, key.transpose(2, 3)) * (
        scaling if scaling is not None else query.shape[-1] ** -0.5
    )
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    q_len, kv_len = query.shape[2], key.shape[2]
    if attention_mask is None and q_len > 1:  # castcore_mask left causality to the kernel: apply it here
        attention_mask = torch.ones(q_len, kv_len, dtype=torch.bool, device=query.device).tril(kv_len - q_len)
    if attention_mask is not None:
        attention_mask = attention_mask[..., :kv_len]
        scores = (
            scores.masked_fill(~attention_mask, float("-inf"))
            if attention_mask.dtype == torch.bool
            else scores + attention_mask
        )
    if s_aux is not None:
        sinks = s_aux.reshape(1, -1, 1, 1).expand(*scores.shape[:-1], 1).to(scores.dtype)
        probs = torch.softmax(torch.cat([scores, sinks], dim=-1), dim=-1, dtype=torch.float32)[..., :-1]
    else:
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32)
    probs = probs.to(query.dtype)
    return torch.matmul(probs, value).transpose(1, 2).contiguous(), probs


def attention_chunk(module: torch.nn.Module) -> int:
    """The chunk of a chunked-attention layer (Llama 4: ``layer_types[layer_idx]`` "chunked_attention", its size
    ``attention_chunk_size``), which transformers applies through the mask alone; 0 for any other layer (checked
    5.5.0-5.24.0)."""
    config, index = getattr(module, "config", None), getattr(module, "layer_idx", None)
    types = getattr(config, "layer_types", None) or ()
    if isinstance(index, int) and index < len(types) and types[index] == "chunked_attention":
        return int(getattr(config, "attention_chunk_size", 0) or 0)
    return 0


def own_causal_attn(module: torch.nn.Module) -> bool:
    """A model's own attention method written before the interface (GPT-J before 5.24): ``_attn(query, key,
    value, attention_mask)`` on [batch, heads, seq, dim] tensors, dividing the scores by ``scale_attn``, causal.
    Checked 5.5.0-5.23.0; GPT-J takes the interface from 5.24.0, and this then finds nothing."""
    attn = getattr(module, "_attn", None)
    if not callable(attn) or not getattr(module, "is_causal", False) or not hasattr(module, "scale_attn"):
        return False
    return list(inspect.signature(attn).parameters)[:4] == ["query", "key", "value", "attention_mask"]


def replace_own_attn(module: torch.nn.Module, attn: Callable) -> None:
    """``module._attn`` replaced by ``attn(self, query, key, value, mask)`` -> ([batch, heads, seq, dim], None)."""
    # A bound method, where torch's Module.__setattr__ types a module's attributes as tensors or submodules
    module._attn = types.MethodType(attn, module)  # type: ignore[assignment]
