"""Building Hugging Face causal LMs from a config on the meta device, with castcore's attention path.

transformers' own SDPA path materialises a causal mask whenever it sees fake tensors, so the
attention op would lose its causal flag. castcore registers an attention implementation that
is transformers' SDPA function with a mask function that leaves the mask out when no padding
is given, so SDPA receives ``is_causal=True`` exactly as on real hardware.
"""

from __future__ import annotations

from typing import Any

import torch

ATTENTION = "castcore"


def _mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, attention_mask=None, local_size=None, **kwargs):
    from transformers.masking_utils import sdpa_mask

    window_irrelevant = local_size is None or kv_length <= local_size
    if attention_mask is None and window_irrelevant and (q_length == 1 or q_length == kv_length):
        return None  # SDPA then applies causality itself (is_causal) or needs none (one query token).
    return sdpa_mask(batch_size, q_length, kv_length, q_offset, kv_offset, attention_mask=attention_mask,
                     local_size=local_size, **kwargs)


def register_attention() -> None:
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTENTION, sdpa_attention_forward)
    AttentionMaskInterface.register(ATTENTION, _mask)


def build_causal_lm(config: dict[str, Any], dtype: torch.dtype) -> torch.nn.Module:
    """An AutoModelForCausalLM from a config.json dict, on the meta device: no weights allocated."""
    from transformers import AutoConfig, AutoModelForCausalLM

    register_attention()
    fields = {k: v for k, v in config.items() if not k.startswith("_")}
    model_type = fields.pop("model_type", None)
    if model_type is None:
        raise ValueError("the model config has no 'model_type'; it must be a transformers config.json")
    hf_config = AutoConfig.for_model(model_type, **fields)
    hf_config._attn_implementation = ATTENTION
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config, dtype=dtype, attn_implementation=ATTENTION)
    return model.eval()


def decode_inputs(model: torch.nn.Module, batch: int, kv_len: int, dtype: torch.dtype):
    """Inputs of one decode step: a static KV cache already holding ``kv_len`` tokens, and one new token.

    A static cache is what serving engines do: the step writes one token in place and attention
    reads the whole cache. (A DynamicCache would copy the cache on every step.) Returns a function
    run inside the fake mode, so the cache is fake too and never allocated.
    """
    from transformers import StaticCache

    config = model.config
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads

    def make():
        cache = StaticCache(config=config, max_cache_len=kv_len + 1)
        cache.early_initialization(batch, kv_heads, head_dim, dtype, torch.device("cpu"))
        for layer in cache.layers:
            layer.cumulative_length.fill_(kv_len)
        input_ids = torch.zeros((batch, 1), dtype=torch.long)
        return (), {"input_ids": input_ids, "past_key_values": cache, "use_cache": True}

    return make
