"""Tensor parallelism for estimates: shard a model with torch's own parallelize_module on a fake process group.

``with tensor_parallel(workload, n):`` starts a fake process group of ``n`` ranks (castcore plays
rank 0), builds a 1-D DeviceMesh over it and shards the model the way Megatron-style TP code does
with ``torch.distributed.tensor.parallel``:

- attention: q/k/v projections ``ColwiseParallel`` (each device keeps heads/n query heads and
  kv_heads/n key/value heads), o projection ``RowwiseParallel`` (an all_reduce after it);
- MLP: gate/up ``ColwiseParallel``, down ``RowwiseParallel`` (an all_reduce after it);
- the token embedding ``RowwiseParallel`` (vocab rows split; an all_reduce of its output) and the
  LM head ``ColwiseParallel`` with replicated output (vocab columns split; an all_gather of the logits),
  as vLLM's VocabParallelEmbedding and ParallelLMHead do. Either stays replicated when the vocab
  does not divide by ``n``; ``TensorParallel.replicated`` says which.

Everything else (norms, rotary tables) is replicated. The capture then records one device's work:
local shard shapes and the collectives (see castcore.capture). The process group is destroyed on exit.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from castcore.report.memory import config_field, language_config
from castcore.workload.models import BuiltModel
from castcore.workload.spec import ModelError

COLWISE = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
ROWWISE = ("o_proj", "down_proj")


@dataclass
class TensorParallel:
    """What ``tensor_parallel`` did: the size, the plan given to parallelize_module, what stayed whole."""

    size: int
    plan: dict[str, str] = field(default_factory=dict)  # module path -> "colwise" / "rowwise" / ...
    replicated: list[str] = field(default_factory=list)  # modules a real TP plan shards that were kept whole


def _config(model: torch.nn.Module) -> Any:
    config = getattr(model, "config", None)
    return getattr(config, "text_config", None) or config


def _check_divisible(model: torch.nn.Module, n: int) -> None:
    config = _config(model)
    if config is None:
        return
    for name in ("num_attention_heads", "num_key_value_heads", "intermediate_size"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value % n:
            raise ModelError(f"--tp {n}: {name} = {value} does not divide by {n}; tensor parallelism splits it "
                             f"evenly across devices (choose a --tp that divides it)")


def build_plan(model: torch.nn.Module, n: int) -> tuple[dict[str, Any], TensorParallel]:
    """The parallelize_module plan for a Llama-style model: every nn.Linear named like a projection."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    _check_divisible(model, n)
    info = TensorParallel(size=n)
    plan: dict[str, Any] = {}
    for path, module in model.named_modules():
        leaf = path.rsplit(".", 1)[-1]
        if not isinstance(module, torch.nn.Linear):
            continue
        if leaf in COLWISE:
            plan[path], info.plan[path] = ColwiseParallel(), "colwise"
        elif leaf in ROWWISE:
            plan[path], info.plan[path] = RowwiseParallel(), "rowwise"
    if not any(kind == "rowwise" for kind in info.plan.values()):
        raise ModelError(f"--tp {n}: found no attention/MLP projections named {', '.join(COLWISE + ROWWISE)} "
                         f"as nn.Linear in {type(model).__name__}; castcore's tensor-parallel plan covers "
                         "Llama-style models (Llama, Mistral, Qwen2), not fused or expert weights")
    embed = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    names = {id(m): p for p, m in model.named_modules()}
    tied = embed is not None and head is not None and head.weight is embed.weight
    for module, kind, style in ((embed, "embedding", lambda: RowwiseParallel(input_layouts=Replicate())),
                                (head, "lm_head", lambda: ColwiseParallel(output_layouts=Replicate()))):
        if module is None or id(module) not in names:
            continue
        path = names[id(module)]
        if module.weight.shape[0] % n or tied:
            info.replicated.append(f"{path} ({'tied to the embedding' if tied else 'vocab does not divide by ' + str(n)})")
            continue
        plan[path], info.plan[path] = style(), kind
    return plan, info


def per_device_config(config: Any, n: int) -> Any:
    """A model config (built, or a config.json dict) as one of ``n`` devices sees it: heads and KV heads / n,
    head_dim explicit. kv_cache_bytes reads it, so a prefill's KV cache is counted per device."""
    text = language_config(config) if config is not None else None
    heads = config_field(text, "num_attention_heads") if text is not None else None
    if not isinstance(heads, int):
        return config
    kv_heads = config_field(text, "num_key_value_heads") or heads
    head_dim = config_field(text, "head_dim") or config_field(text, "hidden_size") // heads
    changes = {"num_attention_heads": heads // n, "num_key_value_heads": kv_heads // n, "head_dim": head_dim}
    if isinstance(text, dict):
        shard = {**text, **changes}
    else:
        shard = copy.copy(text)
        for key, value in changes.items():
            setattr(shard, key, value)
    if text is config:
        return shard
    if isinstance(config, dict):
        return {**config, "text_config": shard}
    whole = copy.copy(config)
    whole.text_config = shard
    return whole


@contextmanager
def tensor_parallel(workload: BuiltModel | torch.nn.Module, n: int | None) -> Iterator[TensorParallel | None]:
    """Shard ``built``'s model over a fake process group of ``n`` ranks for the duration of the block.

    ``n`` of None or 1 does nothing. The model is sharded in place (its parameters become DTensors
    on the meta device) and the fake process group is destroyed when the block ends, even on error.
    """
    if not n or n == 1:
        yield None
        return
    if n < 1:
        raise ModelError(f"--tp must be at least 1 (got {n})")
    model = workload.model if isinstance(workload, BuiltModel) else workload
    if isinstance(workload, BuiltModel) and workload.inputs_fn is not None:
        raise ModelError("--tp goes with --phase prefill for now: a decode step's KV cache is built whole, "
                         "not per device")
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise ModelError("--tp starts its own fake process group, but torch.distributed is already initialized; "
                         "destroy it first, or shard the model yourself and call castcore.capture")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=n)
    try:
        mesh = init_device_mesh("cpu", (n,))
        plan, info = build_plan(model, n)
        parallelize_module(model, mesh, plan)
        if isinstance(workload, BuiltModel):
            workload.description += f", tensor parallel {n} (per device)"
            workload.config = per_device_config(workload.config, n)
        yield info
    finally:
        dist.destroy_process_group()
