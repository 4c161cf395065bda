"""The causal LMs castcore builds from a config.json, on the meta device, through transformers' auto classes;
recognising a transformers model and its modules. Relies on ``CONFIG_MAPPING``, ``MODEL_FOR_CAUSAL_LM_MAPPING``
and ``from_config`` (checked 5.5.0-5.24.0, as each function says).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch

from castcore.errors import ModelError
from castcore.hf.attention import (
    ATTENTION,
    FUSED_ATTENTION,
    castcore_attention,
    castcore_mask,
    no_attention_backend_note,
    register_attention,
    calls_attention_interface,
    own_causal_attn,
    supports_attention_backend,
)
from castcore.hf.configs import attention_of, set_attention
from castcore.hf.versions import installed, older_than_tested, one_line

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def is_transformers_module(module: object) -> bool:
    return type(module).__module__.startswith("transformers.")


def attention_modules_of(model: torch.nn.Module) -> list[torch.nn.Module]:
    """transformers' attention modules castcore has not given a forward of its own (latent attention's)."""
    return [
        m
        for m in model.modules()
        if is_transformers_module(m)
        and type(m).__name__.endswith("Attention")
        and not getattr(m, "castcore_latent", False)
        and not getattr(m, "castcore_recurrent", False)  # Kimi Linear's delta attention, rewritten
    ]


def own_attention(model: torch.nn.Module, fused: bool) -> str | None:
    """The class name of the model's attention modules when they run an implementation of their own that no
    castcore kernel stands in for (Falcon's): not on transformers' attention interface, nor (deployed) an own
    ``_attn`` castcore swaps for its fused kernel; None otherwise."""
    modules = attention_modules_of(model)
    on_interface = attention_of(model) in (ATTENTION, FUSED_ATTENTION)
    if not modules or on_interface or (fused and all(own_causal_attn(m) for m in modules)):
        return None
    return type(modules[0]).__name__


def is_causal_lm(model: object) -> bool:
    """Whether ``model`` is a transformers causal LM (or a subclass of one). Relies on
    ``models.auto.modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`` (checked 5.5.0-5.24.0)."""
    ours = [c for c in type(model).__mro__ if c.__module__.startswith("transformers.")]
    if not ours:
        return False
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    names = set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())
    return any(c.__name__ in names for c in ours)


def build_causal_lm(
    config: dict[str, Any], dtype: torch.dtype, origin: str = "the model config"
) -> tuple[PreTrainedModel, list[str]]:
    """An AutoModelForCausalLM from a config.json dict on the meta device (no weights), and notes: that the model
    cannot take castcore's attention path, what transformers warns of its RoPE values. ModelError names ``origin``,
    the field at fault and what castcore supports. Relies on ``CONFIG_MAPPING``, ``MODEL_FOR_CAUSAL_LM_MAPPING``,
    ``from_config(dtype=, attn_implementation=)``, the class flags ``_supports_attention_backend`` / ``_supports_sdpa``
    (checked 5.5.0-5.24.0). The mappings import the one modeling module the config names."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    register_attention(ATTENTION, castcore_attention, castcore_mask)
    fields = {k: v for k, v in config.items() if not k.startswith("_")}
    model_type = fields.pop("model_type", None)
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        raise ModelError(
            f"{origin}: 'model_type' = {model_type!r} is not a model type transformers "
            f"{installed('transformers')} knows; castcore builds causal language models from a transformers "
            "config.json (llama, qwen2, gpt2, ...), and a newer transformers may know it: pip install -U "
            "transformers"
        )
    said: list[str] = []
    try:
        with _rope_warnings(said):
            hf_config = AutoConfig.for_model(model_type, **fields)
    except Exception as exc:  # transformers' validation errors have no common base: any is the config's fault
        older = older_than_tested("transformers")  # a later release may read the fields this one refuses
        raise ModelError(
            f"{origin}: transformers refuses this {model_type} config: {one_line(exc)}"
            + (
                f" (transformers {older} is installed; a newer transformers may read it: pip install -U "
                "transformers)"
                if older
                else ""
            )
        ) from None
    # The stub types every auto mapping's values as (slow, fast) tokenizer pairs; a model mapping's are classes.
    found = MODEL_FOR_CAUSAL_LM_MAPPING.get(type(hf_config), None)
    model_class: type[PreTrainedModel] | None = found  # type: ignore[assignment]
    if model_class is None:
        raise ModelError(
            f"{origin}: {model_type} is not a causal language model (transformers has no "
            f"AutoModelForCausalLM for it, as for encoder-decoder and vision models); estimate your own "
            "module with castcore.estimate(model, inputs) or --model package.module:factory"
        )
    attention, note = ATTENTION, None
    if not supports_attention_backend(model_class):
        attention = "sdpa" if getattr(model_class, "_supports_sdpa", False) else "eager"
        note = no_attention_backend_note(model_class.__name__, attention)
    hf_config._attn_implementation = attention
    try:
        with torch.device("meta"), _rope_warnings(said):
            model = AutoModelForCausalLM.from_config(hf_config, dtype=dtype, attn_implementation=attention)
    except (TypeError, ValueError, KeyError, AttributeError, ZeroDivisionError) as exc:
        raise ModelError(
            f"{origin}: transformers cannot build this {model_type} model: {one_line(exc)}"
        ) from None
    if note is not None and calls_attention_interface(model):  # built on sdpa, run on castcore's path
        set_attention(model, ATTENTION)
        note = None
    return model.eval(), [
        *([note] if note else []),
        *(f"{origin}: transformers warns: {line}" for line in dict.fromkeys(said)),
    ]


@contextmanager
def _rope_warnings(said: list[str]) -> Iterator[None]:
    """transformers' warnings about a config's RoPE values (``modeling_rope_utils``' logger; checked 5.5.0-5.24.0)
    kept in ``said``, for castcore's notes, instead of printed on stderr beside castcore's own lines."""
    logger = logging.getLogger("transformers.modeling_rope_utils")
    handler = _Keeping(said)
    propagate, logger.propagate = logger.propagate, False
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate


@contextmanager
def quiet_kernel_fallbacks() -> Iterator[None]:
    """transformers' advice to install a hub kernel package when a model runs its reference forward (its
    ``hub_kernels`` logger; checked 5.24.0) held back: castcore captures that forward on fake tensors, so the
    advice is not the user's to follow."""
    logger = logging.getLogger("transformers.integrations.hub_kernels")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


class _Keeping(logging.Handler):
    """A handler that keeps each warning's message in ``said``."""

    def __init__(self, said: list[str]) -> None:
        super().__init__(logging.WARNING)
        self.said = said

    def emit(self, record: logging.LogRecord) -> None:
        self.said.append(record.getMessage())
