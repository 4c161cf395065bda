"""Multi-LoRA serving: ``--lora-rank R --adapters N`` adds N low-rank adapters to the model's projections, each
request using one of them, as vLLM's and S-LoRA's multi-LoRA batching runs them.

Every attention and MLP projection (q, k, v, o, gate, up, down and their merged forms) keeps its weight and adds
``x A B`` for the adapter of each token: A [d_in, R] and B [R, d_out] per adapter; a merged projection (q/k/v as
one, gate/up as one) keeps one adapter per projection merged, their A's side by side, as vLLM's merged LoRA layers
do. Engines run the two products as
gathered GEMMs over the batch's adapters (Punica's SGMV and BGMV kernels, S-LoRA's MBGMV: Chen et al., "Punica:
Multi-Tenant LoRA Serving", MLSys 2024; Sheng et al., "S-LoRA", MLSys 2024): castcore prices them as grouped GEMMs,
rows grouped by adapter (``torch._grouped_mm``), so the work is per token and the adapters' weights read are those
the batch's tokens are expected to touch (castcore.builtin.formulas.matmul.touched_experts, requests spread evenly
over the adapters, or under ``--adapter-skew ALPHA`` the i-th most popular picked with odds i^-ALPHA, Zipf's law,
as S-LoRA's evaluation draws them: castcore.recording.routing.popular_touched): the batching cost of mixing
adapters grows with how many a batch holds. A prompt's tokens count as picks of their own, so a prefill's count
is an upper bound. All N adapters stay in device memory (their weights count with
the model's).

Under ``--tp`` each device holds its share as vLLM shards them: a column-parallel projection (q, k, v, gate, up)
keeps A whole and splits B's outputs; a row-parallel one (o, down) splits A's inputs, as its input is split, and
keeps B whole, its partial sums added to the projection's own before the all-reduce the projection runs anyway, so
the adapters add no communication.
"""

from __future__ import annotations

import torch
from torch import nn

from castcore.errors import ModelError
from castcore.options.catalog import say
from castcore.recording.routing import adapter_popularity

TARGETS = (
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "qkv_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
    "gate_up_proj",
)
ROW_PARALLEL = ("o_proj", "down_proj")  # the rest are column-parallel under --tp
# A merged projection carries one adapter per projection merged (vLLM's MergedQKVParallelLinearWithLoRA and
# MergedColumnParallelLinearWithLoRA): their A's side by side, each B expanding to its own columns.
SLICES = {"qkv_proj": 3, "gate_up_proj": 2}


class LoRAProjection(nn.Module):
    """A projection and its adapters: ``base(x) + (x A[adapter]) B[adapter]``, A and B one device's share of them
    under tensor parallelism ``tp`` (see the module docstring)."""

    def __init__(
        self,
        base: nn.Module,
        rank: int,
        adapters: int,
        dtype: torch.dtype,
        tp: int = 1,
        row_parallel: bool = False,
        skew: float | None = None,
        slices: int = 1,
    ):
        super().__init__()
        self.base, self.skew, self.rank = base, skew or 0.0, rank
        d_in, d_out = base.in_features, base.out_features
        if getattr(base, "castcore_sharded", False):  # sharded by hand: its out_features are one device's
            local_in, local_out = d_in, d_out
        else:
            local_in, local_out = (d_in // tp, d_out) if row_parallel else (d_in, d_out // tp)
        self.lora_a = nn.Parameter(
            torch.empty(adapters, local_in, rank * slices, dtype=dtype), requires_grad=False
        )
        self.lora_b = nn.Parameter(torch.empty(adapters, rank, local_out, dtype=dtype), requires_grad=False)
        self.in_features, self.out_features = d_in, d_out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.base(x)
        rows = x.reshape(-1, x.shape[-1])
        # Rows grouped by adapter: the engine computes each token's adapter once a step, not per projection, and
        # on castcore's fake tensors only the groups' count shapes the cost (touched_experts), not their ends.
        offsets = torch.empty(self.lora_a.shape[0], dtype=torch.int32, device=rows.device)
        with adapter_popularity(self.skew):
            shrunk = torch._grouped_mm(rows, _fitted(self.lora_a, 1, rows.shape[-1]), offs=offsets)
            # each slice's B expands its own rank's columns to its own outputs: rank x d_out in all
            expanded = torch._grouped_mm(
                shrunk[:, : self.rank], _fitted(self.lora_b, 2, out.shape[-1]), offs=offsets
            )
        return out + expanded.reshape(out.shape)


def _fitted(weights: torch.Tensor, dim: int, size: int) -> torch.Tensor:
    """``weights`` as wide as the activation they meet along ``dim``: a projection sharded by hand (a KV head
    replicated over more devices than there are heads) has a local width the split by name does not give."""
    if weights.shape[dim] == size:
        return weights
    shape = list(weights.shape)
    shape[dim] = size
    return weights.new_empty(shape)


def attach(
    model: nn.Module,
    rank: int | None,
    adapters: int | None,
    tp: int,
    dtype: torch.dtype,
    skew: float | None = None,
) -> list[str]:
    """Wrap every target projection of ``model`` in place; notes saying what was added. ModelError names what does
    not fit."""
    if rank is None and adapters is None:
        if skew is not None:
            raise ModelError(f"{say('adapter_skew', skew)} needs {say('lora_rank')} and {say('adapters')}")
        return []
    if rank is None or adapters is None:
        raise ModelError(f"multi-LoRA needs both {say('lora_rank')} and {say('adapters')}")
    if rank % 8:
        raise ModelError(
            f"{say('lora_rank', rank)}: give a multiple of 8 (engines' LoRA kernels take 8, 16, 32, 64 ...)"
        )
    found = [
        (name, module)
        for name, module in model.named_modules()
        if name.rsplit(".", 1)[-1] in TARGETS and hasattr(module, "in_features")
    ]
    if not found:
        raise ModelError(
            f"{say('lora_rank', rank)}: the model has none of the projections adapters attach to "
            f"({', '.join(TARGETS)})"
        )
    for name, module in found:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(
            parent,
            child,
            LoRAProjection(
                module, rank, adapters, dtype, tp, child in ROW_PARALLEL, skew, SLICES.get(child, 1)
            ),
        )
    return [
        f"multi-LoRA: {adapters} adapters of rank {rank} on {len(found)} projections, each token's adapter "
        "applied by two grouped GEMMs (shrink to the rank, expand back), reading the adapters a batch's tokens "
        "are expected to touch; every adapter resident in memory"
    ]
