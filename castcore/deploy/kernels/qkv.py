"""An attention's q, k and v projections as one GEMM, ``qkv_proj``, as vLLM's QKVParallelLinear, SGLang's and
TensorRT-LLM's fused QKV run them: one read of the hidden states, one kernel where there were three.

The attention keeps ``q_proj``, ``k_proj`` and ``v_proj`` as slices of the merged output (``QKVSlice``), so the
model's own forward runs unchanged: the first of them called on a hidden state runs the merged projection, the
others take their columns of its output. ``castcore_qkv_widths`` on the attention holds the three widths, one
device's under tensor parallelism (castcore.deploy.parallel.tensor_shards shards the merged projection by heads).
"""

from __future__ import annotations

import torch
from torch import nn

PARTS = ("q_proj", "k_proj", "v_proj")


def merge_qkv(attention: nn.Module) -> bool:
    """Merge the attention's q/k/v projections in place; False (nothing changed) unless all three are plain
    linears reading the same width with biases alike, so that a projection a pack swapped in stays as it is."""
    parts = [getattr(attention, name, None) for name in PARTS]
    if not all(type(part) is nn.Linear for part in parts) or getattr(attention, "is_cross_attention", False):
        return False
    if len({part.in_features for part in parts}) != 1 or len({part.bias is None for part in parts}) != 1:
        return False
    attention.qkv_proj = merged_linear(parts)
    attention.castcore_qkv_widths = [part.out_features for part in parts]
    for index, name in enumerate(PARTS):
        setattr(attention, name, QKVSlice(attention, index))
    return True


def merged_linear(parts: list[nn.Linear]) -> nn.Linear:
    """One linear whose outputs are ``parts``' outputs side by side: their weights (and biases) concatenated, as
    an engine loads projections that read the same input into one GEMM."""
    first = parts[0]
    merged = nn.Linear(
        first.in_features,
        sum(part.out_features for part in parts),
        bias=first.bias is not None,
        device=first.weight.device,
        dtype=first.weight.dtype,
    )
    with torch.no_grad():
        merged.weight = nn.Parameter(torch.cat([part.weight for part in parts]), requires_grad=False)
        if first.bias is not None:
            merged.bias = nn.Parameter(torch.cat([part.bias for part in parts]), requires_grad=False)
    return merged


class QKVSlice(nn.Module):
    """One of q, k, v: its columns of the attention's merged projection of the same hidden states."""

    def __init__(self, attention: nn.Module, index: int):
        super().__init__()
        self.__dict__["attention"] = attention  # not a submodule: the merged projection is the attention's
        self.index = index

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        attention = self.attention
        state = attention.__dict__.get("_castcore_qkv")
        if state is None or state[0] is not hidden_states:  # a new hidden state: the one GEMM runs
            state = (hidden_states, attention.qkv_proj(hidden_states), set())
            attention.__dict__["_castcore_qkv"] = state
        _, merged, taken = state
        taken.add(self.index)
        if len(taken) == len(PARTS):  # all three taken: hold no activation past the projections
            del attention.__dict__["_castcore_qkv"]
        widths = attention.castcore_qkv_widths
        start = sum(widths[: self.index])
        return merged[..., start : start + widths[self.index]]

    def extra_repr(self) -> str:
        return f"{PARTS[self.index]} of qkv_proj"
