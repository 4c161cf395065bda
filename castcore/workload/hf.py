"""Building Hugging Face causal LMs from a config on the meta device, with castcore's attention path.

transformers' own SDPA path materialises a causal mask whenever it sees fake tensors, so the
attention op would lose its causal flag. castcore registers an attention implementation that
is transformers' SDPA function with a mask function that leaves the mask out when no padding
is given, so SDPA receives ``is_causal=True`` exactly as on real hardware.
"""

from __future__ import annotations

from typing import Any

import torch

from castcore.workload.spec import ModelError

ATTENTION = "castcore"


def _mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, attention_mask=None, local_size=None, **kwargs):
    from transformers.masking_utils import sdpa_mask

    window_irrelevant = local_size is None or kv_length <= local_size
    if attention_mask is None and window_irrelevant and (q_length == 1 or q_length == kv_length):
        return None  # SDPA then applies causality itself (is_causal) or needs none (one query token).
    return sdpa_mask(batch_size, q_length, kv_length, q_offset, kv_offset, attention_mask=attention_mask,
                     local_size=local_size, **kwargs)


def _attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, softcap=None, **kwargs):
    """transformers' SDPA attention; with a logit soft-cap (Gemma 2), which SDPA cannot apply, the
    ops an eager soft-capped attention runs: scores, tanh cap, mask, softmax, weighted sum."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if key.dtype != query.dtype:  # a KV cache in another dtype (--kv-cache): an eager kernel dequantizes it first
        key, value = key.to(query.dtype), value.to(query.dtype)
    if softcap is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    scores = torch.matmul(query, key.transpose(2, 3)) * (scaling if scaling is not None else query.shape[-1] ** -0.5)
    scores = torch.tanh(scores / softcap) * softcap
    q_len, kv_len = query.shape[2], key.shape[2]
    if attention_mask is None and q_len > 1:  # _mask left causality to the kernel: apply it here
        attention_mask = torch.ones(q_len, kv_len, dtype=torch.bool, device=query.device).tril(kv_len - q_len)
    if attention_mask is not None:
        attention_mask = attention_mask[..., :kv_len]
        scores = (scores.masked_fill(~attention_mask, float("-inf")) if attention_mask.dtype == torch.bool
                  else scores + attention_mask)
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    return torch.matmul(probs, value).transpose(1, 2).contiguous(), probs


def register_attention() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTENTION, _attention)
    AttentionMaskInterface.register(ATTENTION, _mask)


def no_attention_backend_note(model_name: str, attention: str) -> str:
    """What a user should know when a model keeps its own attention (``_supports_attention_backend`` False)."""
    return (f"{model_name} cannot take castcore's attention path, so it runs its own {attention} attention: on "
            "fake tensors that builds an explicit causal mask, so attention is counted over every query-key pair, "
            "about twice the causal work")


def build_causal_lm(config: dict[str, Any], dtype: torch.dtype,
                    origin: str = "the model config") -> tuple[torch.nn.Module, str | None]:
    """An AutoModelForCausalLM from a config.json dict, on the meta device (no weights allocated),
    and a note when the model cannot take castcore's attention path. ModelError names ``origin``,
    the field at fault and what castcore supports."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    register_attention()
    fields = {k: v for k, v in config.items() if not k.startswith("_")}
    model_type = fields.pop("model_type", None)
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        raise ModelError(f"{origin}: 'model_type' = {model_type!r} is not a transformers model type; castcore "
                         "builds causal language models from a transformers config.json (llama, qwen2, gpt2, ...)")
    try:
        hf_config = AutoConfig.for_model(model_type, **fields)
    except Exception as exc:  # transformers' validation errors have no common base: any is the config's fault
        raise ModelError(f"{origin}: transformers refuses this {model_type} config: {_one_line(exc)}") from None
    model_class = MODEL_FOR_CAUSAL_LM_MAPPING.get(type(hf_config), None)
    if model_class is None:
        raise ModelError(f"{origin}: {model_type} is not a causal language model (transformers has no "
                         f"AutoModelForCausalLM for it, as for encoder-decoder and vision models); estimate your own "
                         "module with castcore.estimate(model, inputs) or --model package.module:factory")
    attention, note = ATTENTION, None
    if model_class is not None and not getattr(model_class, "_supports_attention_backend", True):
        # Models written before transformers' attention interface pick their attention class by name.
        attention = "sdpa" if getattr(model_class, "_supports_sdpa", False) else "eager"
        note = no_attention_backend_note(model_class.__name__, attention)
    hf_config._attn_implementation = attention
    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(hf_config, dtype=dtype, attn_implementation=attention)
    except (TypeError, ValueError, KeyError, AttributeError, ZeroDivisionError) as exc:
        raise ModelError(f"{origin}: transformers cannot build this {model_type} model: {_one_line(exc)}") from None
    return model.eval(), note


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}{'...' if len(text) > 300 else ''}"


def decode_inputs(model: torch.nn.Module, batch: int, kv_len: int, dtype: torch.dtype, tp: int = 1,
                  cache_dtype: torch.dtype | None = None):
    """Inputs of one decode step: a static KV cache already holding ``kv_len`` tokens, and one new token.

    A static cache is what serving engines do: the step writes one token in place and attention
    reads the whole cache. (A DynamicCache would copy the cache on every step.) Returns a function
    run inside the fake mode, so the cache is fake too and never allocated. With ``tp`` > 1 the cache
    is one device's: num_key_value_heads / tp heads, as the column-parallel k/v projections give it
    (the function's ``per_device(n)`` makes that one; tensor_parallel calls it). The cache holds keys and
    values in ``cache_dtype`` (default ``dtype``), and the step casts the new token's to it as it writes them
    (the function's ``with_cache_dtype(d)`` makes that one; castcore.workload.quantize calls it); its
    ``with_kv_len(n)`` makes the same inputs over ``n`` cached tokens, so serve reuses one model for every step.
    """
    from transformers import StaticCache

    config = model.config
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if tp > 1 and kv_heads % tp:
        raise ModelError(f"--tp {tp}: num_key_value_heads = {kv_heads} does not divide by {tp}; each device holds "
                         f"num_key_value_heads / {tp} heads of the decode step's KV cache (choose a --tp that divides "
                         "it)")
    kv_heads //= tp

    def make():
        cache = StaticCache(config=config, max_cache_len=kv_len + 1)
        cache.early_initialization(batch, kv_heads, head_dim, cache_dtype or dtype, torch.device("cpu"))
        for layer in cache.layers:
            layer.cumulative_length.fill_(kv_len)
            if cache_dtype not in (None, dtype):
                layer.__class__ = cast_on_write(type(layer))
        input_ids = torch.zeros((batch, 1), dtype=torch.long)
        return (), {"input_ids": input_ids, "past_key_values": cache, "use_cache": True}

    make.per_device = lambda n: decode_inputs(model, batch, kv_len, dtype, tp=n, cache_dtype=cache_dtype)
    make.with_cache_dtype = lambda d: decode_inputs(model, batch, kv_len, dtype, tp=tp, cache_dtype=d)
    make.with_kv_len = lambda n: decode_inputs(model, batch, n, dtype, tp=tp, cache_dtype=cache_dtype)
    return make


_CASTING: dict[type, type] = {}


def cast_on_write(layer_class: type) -> type:
    """A subclass of a static cache layer class whose ``update`` casts the new keys and values to the cache's
    dtype before writing them (one pointwise conversion each, as vLLM's reshape_and_cache quantizes them as it
    writes; a per-tensor scale folds into the attention's scale and output)."""
    if layer_class in _CASTING.values():
        return layer_class
    if layer_class not in _CASTING:
        def update(self, key_states, value_states, *args, **kwargs):
            if key_states.dtype != self.dtype:
                key_states, value_states = key_states.to(self.dtype), value_states.to(self.dtype)
            return layer_class.update(self, key_states, value_states, *args, **kwargs)

        _CASTING[layer_class] = type(f"Casting{layer_class.__name__}", (layer_class,), {"update": update})
    return _CASTING[layer_class]
