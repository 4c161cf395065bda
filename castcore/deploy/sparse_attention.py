"""Sparse attention (DeepSeek-V3.2's DSA: a lightweight indexer picks the keys each query attends to) runs as its
kernels run it in the deployed view (castcore.deploy.kernels.sparse_latent): prompts, decode steps and mixed
batches, on one device or several. transformers' own forward (``--eager``, ``--train``) is not priced: it is refused
in one line before anything is captured, not left to fail inside transformers or priced as if every key were
read."""

from __future__ import annotations

from torch import nn

from castcore.errors import ModelError
from castcore.options.catalog import say


def refuse_sparse_attention(model: nn.Module, name: str, deployed: bool) -> None:
    """ModelError when ``model`` has an attention indexer (transformers' DeepseekV32Indexer and its kind) and is
    asked for what castcore does not price of it."""
    if not isinstance(model, nn.Module):
        return
    indexer = next(
        (m for m in model.modules() if hasattr(m, "index_topk") and hasattr(m, "weights_proj")), None
    )
    if indexer is None or deployed:
        return
    sparse = f"its sparse attention (an indexer picks {indexer.index_topk} keys for each query, {type(indexer).__name__})"
    raise ModelError(
        f"{name}: {say('fuse', False)} and {say('train', True)} are not priced for {sparse}, which castcore "
        "prices as its kernels run it, in inference: drop them"
    )
