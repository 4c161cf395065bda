"""The attention implementation a built model's configs name, read, switched and put back. Relies on
``PreTrainedConfig.sub_configs`` and ``_attn_implementation_internal`` (checked 5.5.0-5.24.0).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedConfig


def configs(model: torch.nn.Module) -> list[PreTrainedConfig]:
    """The configs of the model and its sub-models, and their sub-configs (a vision or text config). Relies on
    ``PreTrainedConfig.sub_configs`` (checked 5.5.0-5.24.0)."""
    found: dict[int, PreTrainedConfig] = {}
    pending: list[PreTrainedConfig] = [
        c
        for m in model.modules()
        if (c := getattr(m, "config", None)) is not None and hasattr(c, "sub_configs")
    ]
    while pending:
        config = pending.pop()
        if id(config) not in found:
            found[id(config)] = config
            pending += [
                sub
                for key in config.sub_configs
                if (sub := getattr(config, key, None)) is not None and hasattr(sub, "sub_configs")
            ]
    return list(found.values())


def attention_of(model: torch.nn.Module) -> str | None:
    return getattr(getattr(model, "config", None), "_attn_implementation", None)


def set_attention(model: torch.nn.Module, attention: str, only_from: str | None = None) -> bool:
    """Every config of ``model`` switched to ``attention`` (when each is on ``only_from``, if given); False and
    nothing switched otherwise. Set one by one through ``_attn_implementation_internal``: transformers' setter
    would give sub-configs their parent's value (checked 5.5.0-5.24.0)."""
    found = configs(model)
    if not found or (
        only_from is not None and any(c._attn_implementation_internal != only_from for c in found)
    ):
        return False
    for config in found:
        config._attn_implementation_internal = attention
    return True


@contextmanager
def attention_set_to(model: torch.nn.Module, attention: str) -> Iterator[None]:
    """Every config of ``model`` on ``attention``, then each put back to its own earlier value, even on error."""
    saved = [(c, c._attn_implementation_internal) for c in configs(model)]
    try:
        for config, _ in saved:
            config._attn_implementation_internal = attention
        yield
    finally:
        for config, value in saved:
            config._attn_implementation_internal = value
