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

Models with other structures are sharded by hand (their parameters replaced by one device's shard,
meta tensors of the local shape), the way vLLM's and Megatron's layers hold them:

- a fused QKV projection (Falcon's and GPT-NeoX's ``query_key_value``) keeps heads/n query heads and
  kv_heads/n key/value heads; when there are fewer KV heads than devices (Falcon's multi-query attention)
  each device holds one replicated KV head, as vLLM's QKVParallelLinear does (n must be a multiple of them).
  Its output projection (``dense``) is ``RowwiseParallel``; the attention module's head counts become local.
- mixture-of-experts weights stored as 3-D Parameters (transformers 5's ``experts`` modules with
  ``gate_up_proj`` / ``down_proj`` of shape [experts, ...]) are split along the intermediate dimension:
  every device holds 1/n of every expert (Megatron's TP-MoE), and an all_reduce sums the experts' output.
  Shared experts are nn.Linear MLPs and split like one.

Everything else (norms, rotary tables, MoE routers) is replicated. The capture then records one device's work:
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

COLWISE = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "dense_h_to_4h")
ROWWISE = ("o_proj", "down_proj", "dense_4h_to_h")
FUSED_QKV = ("query_key_value",)  # its sibling ``dense`` is the attention's output projection
EXPERT_WEIGHTS = ("gate_up_proj", "gate_proj", "up_proj", "down_proj")  # 3-D Parameters of an experts module


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
    """The parallelize_module plan: every nn.Linear named like a projection (Llama, Mistral, Qwen2, Falcon's
    and GPT-NeoX's MLPs). Fused QKV projections and 3-D expert weights are in ``info.plan`` as "fused_qkv" and
    "experts" and sharded by hand (``shard_by_hand``) after parallelize_module."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    _check_divisible(model, n)
    info = TensorParallel(size=n)
    plan: dict[str, Any] = {}
    for path, module in model.named_modules():
        parent, _, leaf = path.rpartition(".")
        if _expert_weights(module):
            info.plan[path] = "experts"
        if not isinstance(module, torch.nn.Linear):
            continue
        if leaf in COLWISE:
            plan[path], info.plan[path] = ColwiseParallel(), "colwise"
        elif leaf in ROWWISE or (leaf == "dense" and _has_fused_qkv(model.get_submodule(parent))):
            plan[path], info.plan[path] = RowwiseParallel(), "rowwise"
        elif leaf in FUSED_QKV:
            info.plan[path] = "fused_qkv"
    if not any(kind == "rowwise" for kind in info.plan.values()):
        raise ModelError(f"--tp {n}: found no attention/MLP projections named {', '.join(COLWISE + ROWWISE)} "
                         f"(or a fused {', '.join(FUSED_QKV)} with its dense) as nn.Linear in "
                         f"{type(model).__name__}; castcore's tensor-parallel plan covers Llama-style models "
                         "(Llama, Mistral, Qwen2, Mixtral), Falcon and GPT-NeoX")
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


def _has_fused_qkv(module: torch.nn.Module) -> bool:
    return any(isinstance(getattr(module, name, None), torch.nn.Linear) for name in FUSED_QKV)


def _expert_weights(module: torch.nn.Module) -> list[str]:
    """The names of ``module``'s own 3-D expert Parameters ([experts, ...]), if it is an experts module."""
    return [name for name, param in module.named_parameters(recurse=False)
            if name in EXPERT_WEIGHTS and param.dim() == 3]


def _replace(module: torch.nn.Module, name: str, shape: tuple[int, ...]) -> None:
    """Swap a parameter for one device's shard: a meta tensor of the local shape (no weights are held)."""
    old = getattr(module, name)
    setattr(module, name, torch.nn.Parameter(torch.empty(shape, dtype=old.dtype, device="meta"),
                                             requires_grad=old.requires_grad))


def _shard_dim(module: torch.nn.Module, name: str, dim: int, n: int, path: str) -> None:
    shape = list(getattr(module, name).shape)
    if shape[dim] % n:
        raise ModelError(f"--tp {n}: {path}.{name} has {shape[dim]} rows along the dimension tensor parallelism "
                         f"splits (shape {tuple(shape)}), which does not divide by {n}; choose a --tp that divides it")
    shape[dim] //= n
    _replace(module, name, tuple(shape))


def _shard_fused_qkv(model: torch.nn.Module, path: str, n: int) -> None:
    """One device's fused QKV projection: heads/n query heads, kv_heads/n key/value heads (or one replicated
    KV head when kv_heads < n, as vLLM does), and the attention module's head counts made local."""
    parent, _, leaf = path.rpartition(".")
    attention, linear = model.get_submodule(parent), model.get_submodule(path)
    heads = next((getattr(attention, a) for a in ("num_heads", "num_attention_heads") if hasattr(attention, a)),
                 None) or config_field(_config(model), "num_attention_heads")
    head_dim = getattr(attention, "head_dim", None) or getattr(attention, "head_size", None) \
        or linear.in_features // heads
    kv_heads = (linear.out_features // head_dim - heads) // 2
    if heads % n or (kv_heads % n and n % kv_heads):
        raise ModelError(f"--tp {n}: {path} has {heads} query heads and {kv_heads} key/value heads; tensor "
                         f"parallelism needs the query heads to divide by {n} and the key/value heads to divide "
                         f"by {n} or {n} to be a multiple of them (then each device holds one KV head)")
    local_heads, local_kv = heads // n, max(1, kv_heads // n)
    rows = (local_heads + 2 * local_kv) * head_dim
    _replace(linear, "weight", (rows, linear.in_features))
    if linear.bias is not None:
        _replace(linear, "bias", (rows,))
    linear.out_features = rows
    for attr, whole, local in (("num_heads", heads, local_heads), ("num_attention_heads", heads, local_heads),
                               ("num_kv_heads", kv_heads, local_kv), ("num_key_value_heads", kv_heads, local_kv)):
        if getattr(attention, attr, None) == whole:
            setattr(attention, attr, local)


def _shard_experts(model: torch.nn.Module, path: str, mesh: Any, n: int) -> None:
    """Every expert's matrices split along the intermediate dimension (gate/up by column, down by row), and
    an all_reduce of the experts' output, which each device holds a partial sum of."""
    import torch.distributed._functional_collectives as funcol

    experts = model.get_submodule(path)
    transposed = bool(getattr(experts, "is_transposed", False))  # [experts, in, out] rather than [experts, out, in]
    for name in _expert_weights(experts):
        column = name != "down_proj"
        _shard_dim(experts, name, (2 if transposed else 1) if column else (1 if transposed else 2), n, path)
        bias = getattr(experts, f"{name}_bias", None)
        if column and isinstance(bias, torch.nn.Parameter):
            _shard_dim(experts, f"{name}_bias", 1, n, path)
    if isinstance(getattr(experts, "intermediate_dim", None), int):
        experts.intermediate_dim //= n
    experts.register_forward_hook(lambda module, args, out: funcol.all_reduce(out, "sum", mesh))


def shard_by_hand(model: torch.nn.Module, mesh: Any, info: TensorParallel) -> None:
    """Shard what parallelize_module's styles cannot: fused QKV projections and 3-D expert weights."""
    for path, kind in info.plan.items():
        if kind == "fused_qkv":
            _shard_fused_qkv(model, path, info.size)
        elif kind == "experts":
            _shard_experts(model, path, mesh, info.size)


def per_device_config(config: Any, n: int) -> Any:
    """A model config (built, or a config.json dict) as one of ``n`` devices sees it: heads and KV heads / n,
    head_dim explicit. kv_cache_bytes reads it, so a prefill's KV cache is counted per device."""
    text = language_config(config) if config is not None else None
    heads = config_field(text, "num_attention_heads") if text is not None else None
    if not isinstance(heads, int):
        return config
    kv_heads = config_field(text, "num_key_value_heads") or heads
    head_dim = config_field(text, "head_dim") or config_field(text, "hidden_size") // heads
    changes = {"num_attention_heads": heads // n, "num_key_value_heads": max(1, kv_heads // n), "head_dim": head_dim}
    if isinstance(text, dict):
        shard = {**text, **changes}
    else:
        shard = copy.copy(text)
        try:
            for key, value in changes.items():
                setattr(shard, key, value)
        except AttributeError:  # a read-only field (Falcon's head_dim property): work on its config.json dict
            return per_device_config(config.to_dict(), n)
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
    inputs_fn = workload.inputs_fn if isinstance(workload, BuiltModel) else None
    per_device = getattr(inputs_fn, "per_device", None)
    if inputs_fn is not None and per_device is None:
        raise ModelError(f"--tp {n}: this workload's inputs_fn builds its inputs (a KV cache) for the whole model, "
                         "not one device; give the function a per_device(n) attribute returning one device's "
                         "inputs_fn, as castcore's decode step does")
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
        shard_by_hand(model, mesh, info)
        if per_device is not None:  # a decode step: the static KV cache one device holds
            workload.inputs_fn = per_device(n)
        if isinstance(workload, BuiltModel):
            workload.description += f", tensor parallel {n} (per device)"
            workload.config = per_device_config(workload.config, n)
        yield info
    finally:
        dist.destroy_process_group()
