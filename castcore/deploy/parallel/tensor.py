"""Tensor parallelism for estimates: shard a model with torch's own parallelize_module on a fake process group.

``with tensor_parallel(workload, n):`` starts a fake process group of ``n`` ranks (castcore plays
rank 0), builds a 1-D DeviceMesh over it and shards the model the way Megatron-style TP code does
with ``torch.distributed.tensor.parallel``:

- attention: q/k/v projections ``ColwiseParallel`` (each device keeps heads/n query heads and
  kv_heads/n key/value heads), o projection ``RowwiseParallel`` (an all_reduce after it);
- MLP: gate/up (or a merged ``gate_up_proj``) ``ColwiseParallel``, down ``RowwiseParallel`` (an all_reduce
  after it);
- the token embedding ``RowwiseParallel`` (vocab rows split; an all_reduce of its output) and the
  LM head ``ColwiseParallel`` with replicated output (vocab columns split; an all_gather of the logits),
  as vLLM's VocabParallelEmbedding and ParallelLMHead do. Either stays replicated when the vocab
  does not divide by ``n``; ``TensorParallel.replicated`` says which.

Other structures are sharded by hand (parameters replaced by one device's shard, meta tensors of the local
shape), the way vLLM's and Megatron's layers hold them:

- with fewer KV heads than devices (8, --tp 16) each device holds one replicated KV head, as vLLM does;
- GPT-2's ``Conv1D`` layers ([in, out]): ``c_attn``, ``c_fc`` split by column, ``c_proj`` by row (an all_reduce);
- a fused QKV projection (Falcon's, GPT-NeoX's ``query_key_value``) keeps heads/n query heads and kv_heads/n
  KV heads, or one replicated KV head when there are fewer than n (vLLM's QKVParallelLinear); its output
  projection (``dense``) is ``RowwiseParallel``; the attention module's head counts become local.
- 3-D expert weights (transformers 5's ``experts`` modules) are split along the intermediate dimension: every
  device holds 1/n of every expert (Megatron's TP-MoE), an all_reduce sums their output; shared experts are
  nn.Linear MLPs and split like one, their partial output summed with the routed experts' by one all_reduce of
  the block (tensor_plan's "moe_sum"). gpt-oss's attention sinks (one per head) are split with the heads.

Everything else (norms, rotary tables, MoE routers) is replicated. The capture records one device's work: local
shard shapes and the collectives. ``castcore.deploy.parallel.parallelize.parallelize`` applies this with sequence and expert
parallelism for a Workload; the process group is destroyed on exit. castcore.deploy.parallel.tensor_plan makes
the plan, castcore.deploy.parallel.tensor_shards shards by hand; this module runs them over a fake process group.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from castcore.deploy.parallel.tensor_plan import TensorParallel, build_plan, replicated_kv, text_config
from castcore.deploy.parallel.tensor_shards import shard_by_hand
from castcore.options.catalog import say
from castcore.report.memory import config_field, language_config
from castcore.workload.models import BuiltModel
from castcore.workload.spec import ModelError


def per_device_config(config: Any, n: int) -> Any:
    """A model config (built, or a config.json dict) as one of ``n`` devices sees it: heads and KV heads / n
    (one KV head when there are fewer than n), head_dim explicit, linear-attention heads (Mamba-2's heads and groups) / n. kv_cache_bytes reads it, so a prefill's KV
    cache is counted per device."""
    text = language_config(config) if config is not None else None
    heads = config_field(text, "num_attention_heads") if text is not None else None
    if not isinstance(heads, int):
        return config
    kv_heads = config_field(text, "num_key_value_heads") or heads
    head_dim = config_field(text, "head_dim") or config_field(text, "hidden_size") // heads
    changes = {
        "num_attention_heads": heads // n,
        "num_key_value_heads": max(1, kv_heads // n),
        "head_dim": head_dim,
    }
    for linear in (
        "linear_num_key_heads",
        "linear_num_value_heads",
        "linear_num_heads",
        "mamba_num_heads",
        "n_groups",
    ):  # Gated DeltaNet's heads, Kimi delta attention's, and Mamba-2's heads and groups, split the same
        if isinstance(config_field(text, linear), int):
            changes[linear] = config_field(text, linear) // n
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


def cache_split(model: torch.nn.Module, n: int) -> int:
    """The ``per_device(n)`` a decode step's KV cache takes: n, or the KV head count when each device holds one
    replicated KV head (so the cache holds kv_heads / kv_heads = 1 head)."""
    return text_config(model).num_key_value_heads if replicated_kv(model, n) else n


@contextmanager
def fake_process_group(world: int, option: str = "tp") -> Iterator[None]:
    """A fake process group of ``world`` ranks (castcore plays rank 0), destroyed when the block ends; ``option``
    (its Python name, e.g. "tp", set to ``world``) is the option a refusal names."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise ModelError(
            f"{say(option, world)} starts its own fake process group, but torch.distributed is already "
            "initialized; destroy it first, or shard the model yourself and call castcore.capture"
        )
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    try:
        yield
    finally:
        dist.destroy_process_group()


def apply_tensor_parallel(
    built: BuiltModel | torch.nn.Module,
    mesh: Any,
    n: int,
    sp: bool = False,
    experts: bool = True,
    moe_sums: bool = True,
) -> TensorParallel:
    """Shard a model over the 1-D ``mesh`` of ``n`` ranks: the plan, parallelize_module, what is done by hand,
    and for a BuiltModel the inputs (one device's KV cache), description and config of one device. ``experts``
    and ``moe_sums`` as build_plan takes them."""
    from torch.distributed.tensor.parallel import parallelize_module

    model = built.model if isinstance(built, BuiltModel) else built
    inputs_fn = built.inputs_fn if isinstance(built, BuiltModel) else None
    per_device = getattr(inputs_fn, "per_device", None)
    if inputs_fn is not None and per_device is None:
        raise ModelError(
            f"{say('tp', n)}: this workload's inputs_fn builds its inputs (a KV cache) for the whole "
            "model, not one device; give the function a per_device(n) attribute returning one device's "
            "inputs_fn, as castcore's decode step does"
        )
    plan, info = build_plan(model, n, sp=sp, experts=experts, moe_sums=moe_sums)
    parallelize_module(model, mesh, plan)
    shard_by_hand(model, mesh, info, sp=sp)
    if isinstance(built, BuiltModel):
        if per_device is not None:  # a decode step: the static KV cache one device holds
            built.inputs_fn = per_device(cache_split(model, n))
        built.description += f", tensor parallel {n} (per device)"
        built.config = per_device_config(built.config, n)
    return info


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
        raise ModelError(f"{say('tp')} must be at least 1 (got {n})")
    from torch.distributed.device_mesh import init_device_mesh

    with fake_process_group(n):
        yield apply_tensor_parallel(workload, init_device_mesh("cpu", (n,)), n)
