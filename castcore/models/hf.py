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

    if attention_mask is None and local_size is None and (q_length == 1 or q_length == kv_length):
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
