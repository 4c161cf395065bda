"""Sparse attention (DeepSeek-V3.2's DSA: a lightweight indexer picks the keys each query attends to) is not
priced yet: pricing every key instead would hide the long-context advantage the model exists for, so it is refused
in one line before anything is captured, not left to fail inside transformers."""

from __future__ import annotations

from torch import nn

from castcore.errors import ModelError


def refuse_sparse_attention(model: nn.Module, name: str) -> None:
    """ModelError when ``model`` has an attention indexer (transformers' DeepseekV32Indexer and its kind)."""
    if not isinstance(model, nn.Module):
        return
    indexer = next(
        (m for m in model.modules() if hasattr(m, "index_topk") and hasattr(m, "weights_proj")), None
    )
    if indexer is not None:
        raise ModelError(
            f"{name}: its sparse attention (an indexer picks {indexer.index_topk} keys for each query, "
            f"{type(indexer).__name__}) is not priced yet, and pricing every key would hide what it saves; "
            "for the same model with dense attention use deepseek-v3.1"
        )
