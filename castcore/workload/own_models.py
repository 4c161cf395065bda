"""A user's own transformers causal LM, run the way castcore runs its presets.

A model built with ``AutoModelForCausalLM`` would run transformers' own attention path, not the
one presets run (see castcore.hf), and with ``use_cache=True`` it builds a DynamicCache a preset's
prefill does not. For the capture only, castcore puts the model on its own attention path and
passes ``use_cache=False``, so its records are its preset's; a prefill's KV cache is then counted
from the config, as for a preset. The model and its weights are never copied, and its attention
setting is restored when the capture ends, even on error.
"""

from __future__ import annotations

import inspect
from functools import partial
from typing import Any

import torch

from castcore.hf.attention import (
    ATTENTION,
    castcore_attention,
    castcore_mask,
    no_attention_backend_note,
    register_attention,
    supports_attention_backend,
)
from castcore.hf.cache import CACHE_ARGUMENTS
from castcore.hf.causal_lm import is_causal_lm
from castcore.hf.configs import attention_of, attention_set_to
from castcore.workload.models import BuiltModel


def prepare(built: BuiltModel) -> BuiltModel:
    """``built`` with castcore's attention path and ``use_cache=False`` when its model is a
    transformers causal LM, each change said in ``built.notes``; any other model as it is."""
    model = built.model
    if not is_causal_lm(model):
        return built
    name, attention = type(model).__name__, attention_of(model)
    if not supports_attention_backend(model):
        built.notes.append(no_attention_backend_note(name, str(attention)))
    elif attention != ATTENTION:
        register_attention(ATTENTION, castcore_attention, castcore_mask)
        built.while_capturing = partial(attention_set_to, model, ATTENTION)
        built.notes.append(
            f"castcore ran {name}'s attention as {ATTENTION!r} (transformers' SDPA with the causal "
            f"flag, so attention counts the causal half of the query-key pairs) instead of your "
            f"{attention!r}, for this estimate only"
        )
    passed = _passed(model, built.args, built.kwargs)
    if passed is None or "use_cache" in passed or any(name in passed for name in CACHE_ARGUMENTS):
        return built  # the caller chose the cache: leave it, and the capture holds it
    built.kwargs["use_cache"] = False
    built.notes.append(
        f"castcore passed use_cache=False to {name}, as its presets do: a prefill then builds no "
        "cache object, so identical layers are captured once and replayed; the KV cache it fills "
        "is counted in memory from the model's config"
    )
    tokens = next(
        (passed[k] for k in ("input_ids", "inputs_embeds") if isinstance(passed.get(k), torch.Tensor)), None
    )
    if tokens is not None and tokens.dim() >= 2:
        built.config = model.config
        # transformers models have a dtype; torch modules do not declare one
        dtype: torch.dtype = getattr(model, "dtype")
        built.kv_cache_shape = (int(tokens.shape[0]), int(tokens.shape[1]), dtype)
    return built


def _passed(model: torch.nn.Module, args: tuple, kwargs: dict) -> dict[str, Any] | None:
    """The forward's arguments the caller passed, by name (positional ones too); None if they do not bind."""
    try:
        bound = inspect.signature(model.forward).bind_partial(*args, **kwargs)
    except (TypeError, ValueError):
        return None  # the call itself will say what is wrong
    extra: dict[str, Any] = next(
        (
            v
            for k, v in bound.arguments.items()
            if bound.signature.parameters[k].kind is inspect.Parameter.VAR_KEYWORD
        ),
        {},
    )
    return {**bound.arguments, **extra}
