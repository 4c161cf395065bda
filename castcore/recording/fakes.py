"""Fake kernels where torch's own refuse what a capture must run: an op's output computed for the dtypes serving
engines run it in, recorded as the op itself."""

from __future__ import annotations

from typing import Any

import torch

_GROUPED_MM = torch.ops.aten._grouped_mm.default


def fake_in_any_dtype(func: Any, args: tuple, kwargs: dict) -> Any:
    """``func(*args, **kwargs)`` on fake tensors. aten::_grouped_mm in another dtype than bf16 gets its output
    here: torch's fake kernel takes bf16 only, as its CUDA kernel does, while a grouped product in fp16 or fp32
    is what serving engines' fused MoE kernels run."""
    if func is _GROUPED_MM:
        a, b = args[:2]
        if not (
            a.dtype == b.dtype == torch.bfloat16 or kwargs.get("out_dtype") or a.dim() != 2 or b.dim() != 3
        ):
            return a.new_empty((a.shape[0], b.shape[-1]))
    return func(*args, **kwargs)
