"""A user's own transformers causal LM, run the way castcore runs its presets.

A model built with ``AutoModelForCausalLM`` would run transformers' own attention path, not the
one presets run (see hf.py), and with ``use_cache=True`` it builds a DynamicCache a preset's
prefill does not. For the capture only, castcore puts the model on its own attention path and
passes ``use_cache=False``, so its records are its preset's; a prefill's KV cache is then counted
from the config, as for a preset. The model and its weights are never copied, and its attention
setting is restored when the capture ends, even on error.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import torch

from castcore.workload.models import BuiltModel


def is_causal_lm(model: Any) -> bool:
    """Whether ``model`` is a transformers causal LM (or a subclass of one). transformers is imported
    only when the model's class comes from it, so other models never pay for that import."""
    ours = [c for c in type(model).__mro__ if c.__module__.startswith("transformers.")]
    if not ours:
        return False
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    names = set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())
    return any(c.__name__ in names for c in ours)


def prepare(built: BuiltModel) -> BuiltModel:
    """``built`` with castcore's attention path and ``use_cache=False`` when its model is a
    transformers causal LM, each change said in ``built.notes``; any other model as it is."""
    model = built.model
    if not is_causal_lm(model):
        return built
    from castcore.workload.hf import ATTENTION, no_attention_backend_note, register_attention

    name, attention = type(model).__name__, model.config._attn_implementation
    if not getattr(model, "_supports_attention_backend", True):
        # Models written before transformers' attention interface pick their attention class at init.
        built.notes.append(no_attention_backend_note(name, attention))
    elif attention != ATTENTION:
        register_attention()
        built.while_capturing = partial(_on_castcore_attention, model, ATTENTION)
        built.notes.append(f"castcore ran {name}'s attention as {ATTENTION!r} (transformers' SDPA with the causal "
                           f"flag, so attention counts the causal half of the query-key pairs) instead of your "
                           f"{attention!r}, for this estimate only")
    passed = _passed(model, built.args, built.kwargs)
    if passed is None or "past_key_values" in passed or "use_cache" in passed:
        return built  # the caller chose the cache: leave it, and the capture holds it
    built.kwargs["use_cache"] = False
    built.notes.append(f"castcore passed use_cache=False to {name}, as its presets do: a prefill then builds no "
                       "cache object, so identical layers are captured once and replayed; the KV cache it fills "
                       "is counted in memory from the model's config")
    tokens = next((passed[k] for k in ("input_ids", "inputs_embeds") if isinstance(passed.get(k), torch.Tensor)), None)
    if tokens is not None and tokens.dim() >= 2:
        built.config = model.config
        built.kv_cache_shape = (int(tokens.shape[0]), int(tokens.shape[1]), model.dtype)
    return built


def _passed(model: torch.nn.Module, args: tuple, kwargs: dict) -> dict[str, Any] | None:
    """The forward's arguments the caller passed, by name (positional ones too); None if they do not bind."""
    try:
        bound = inspect.signature(model.forward).bind_partial(*args, **kwargs)
    except (TypeError, ValueError):
        return None  # the call itself will say what is wrong
    extra = next((v for k, v in bound.arguments.items()
                  if bound.signature.parameters[k].kind is inspect.Parameter.VAR_KEYWORD), {})
    return {**bound.arguments, **extra}


@contextmanager
def _on_castcore_attention(model: torch.nn.Module, attention: str) -> Iterator[None]:
    """Every config of ``model`` set to ``attention``, then each put back to its own earlier value
    (one by one: transformers' setter would give sub-configs their parent's value)."""
    saved = [(c, c._attn_implementation_internal) for c in _configs(model)]
    try:
        for config, _ in saved:
            config._attn_implementation_internal = attention
        yield
    finally:
        for config, value in saved:
            config._attn_implementation_internal = value


def _configs(model: torch.nn.Module) -> list[Any]:
    """The configs of the model and its sub-models, and their sub-configs (a vision or text config)."""
    found: dict[int, Any] = {}
    pending = [m.config for m in model.modules() if hasattr(getattr(m, "config", None), "sub_configs")]
    while pending:
        config = pending.pop()
        if id(config) not in found:
            found[id(config)] = config
            pending += [sub for key in config.sub_configs if hasattr(sub := getattr(config, key, None), "sub_configs")]
    return list(found.values())
