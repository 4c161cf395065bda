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
  nn.Linear MLPs and split like one. gpt-oss's attention sinks (one per head) are split with the heads.

Everything else (norms, rotary tables, MoE routers) is replicated. The capture records one device's work: local
shard shapes and the collectives. ``castcore.deploy.parallel.parallelize.parallelize`` applies this with sequence and expert
parallelism for a Workload; the process group is destroyed on exit.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from castcore.hf.layers import is_conv1d, is_experts_module
from castcore.options.catalog import say
from castcore.report.memory import config_field, language_config
from castcore.workload.models import BuiltModel
from castcore.workload.spec import ModelError

COLWISE = (
    "q_proj",
    "k_proj",
    "v_proj",
    "gate_proj",
    "up_proj",
    "gate_up_proj",
    "dense_h_to_4h",
    "q_b_proj",
    "kv_b_proj",
)  # MLA's per-head projections; its latent ones stay whole, as in vLLM
ROWWISE = ("o_proj", "down_proj", "dense_4h_to_h")
FUSED_QKV = ("query_key_value",)  # its sibling ``dense`` is the attention's output projection
EXPERT_WEIGHTS = ("gate_up_proj", "gate_proj", "up_proj", "down_proj")  # 3-D Parameters of an experts module
CONV1D = {
    "c_attn": "conv1d_colwise",
    "c_fc": "conv1d_colwise",
    "c_proj": "conv1d_rowwise",
}  # GPT-2's [in, out]
KV_PROJECTIONS = ("k_proj", "v_proj")
ROW_KINDS = (
    "rowwise",
    "conv1d_rowwise",
)  # the block outputs: an all_reduce (a reduce_scatter under --sp) after them


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
        if name == "num_key_value_heads" and isinstance(value, int) and value and not n % value:
            continue  # fewer KV heads than devices: each device holds one, replicated (vLLM's rule)
        if isinstance(value, int) and value % n:
            raise ModelError(
                f"{say('tp', n)}: {name} = {value} does not divide by {n}; tensor parallelism splits "
                f"it evenly across devices (choose a {say('tp')} that divides it"
                + (", or a multiple of it" if name == "num_key_value_heads" else "")
                + ")"
            )


def replicated_kv(model: torch.nn.Module, n: int) -> bool:
    """Whether ``n`` devices hold one replicated KV head each: fewer KV heads than devices, n a multiple of them."""
    config = _config(model)
    kv = getattr(config, "num_key_value_heads", None) if config is not None else None
    return isinstance(kv, int) and 0 < kv < n and n % kv == 0


def build_plan(
    model: torch.nn.Module, n: int, sp: bool = False, experts: bool = True
) -> tuple[dict[str, Any], TensorParallel]:
    """The parallelize_module plan: every nn.Linear named like a projection (Llama, Mistral, Qwen2, Falcon's
    and GPT-NeoX's MLPs). Fused QKV projections, replicated KV heads, GPT-2's Conv1D layers and 3-D expert
    weights are in ``info.plan`` as "fused_qkv", "kv_replicated", "conv1d_colwise"/"conv1d_rowwise" and "experts",
    sharded by hand (``shard_by_hand``) after parallelize_module. ``sp``: row-parallel outputs are left as partial
    sums and the embedding is marked "embedding_sp", for castcore.deploy.parallel.sequence to reduce-scatter them.
    ``experts=False`` leaves 3-D expert weights to expert parallelism."""
    from torch.distributed.tensor import Partial, Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    _check_divisible(model, n)
    info = TensorParallel(size=n)
    plan: dict[str, Any] = {}
    kv_replicated = replicated_kv(model, n)
    for path, module in model.named_modules():
        parent, _, leaf = path.rpartition(".")
        if experts and _expert_weights(module):
            info.plan[path] = "experts"
        if is_conv1d(module) and leaf in CONV1D:
            info.plan[path] = CONV1D[leaf]
        if isinstance(
            getattr(module, "sinks", None), torch.nn.Parameter
        ):  # gpt-oss: one attention sink per head
            info.plan[path] = "sinks"
        if not isinstance(module, torch.nn.Linear):
            continue
        if kv_replicated and leaf in KV_PROJECTIONS:
            info.plan[path] = "kv_replicated"
        elif leaf in COLWISE:
            plan[path], info.plan[path] = ColwiseParallel(), "colwise"
        elif leaf in ROWWISE or (leaf == "dense" and _has_fused_qkv(model.get_submodule(parent))):
            plan[path] = RowwiseParallel(output_layouts=Partial()) if sp else RowwiseParallel()
            info.plan[path] = "rowwise"
        elif leaf in FUSED_QKV:
            info.plan[path] = "fused_qkv"
    for path, kind in _by_structure(model, info.plan).items():
        if kind != "local_heads":
            plan[path] = (
                (RowwiseParallel(output_layouts=Partial()) if sp else RowwiseParallel())
                if kind == "rowwise"
                else ColwiseParallel()
            )
        info.plan[path] = kind
    if not any(kind in ROW_KINDS for kind in info.plan.values()):
        raise ModelError(
            f"{say('tp', n)}: found no attention/MLP projections named {', '.join(COLWISE + ROWWISE)} "
            f"(or a fused {', '.join(FUSED_QKV)} with its dense) as nn.Linear in "
            f"{type(model).__name__}; castcore's tensor-parallel plan covers Llama-style models "
            "(Llama, Mistral, Qwen2, Mixtral), Falcon, GPT-NeoX and GPT-2"
        )
    embed = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    names = {id(m): p for p, m in model.named_modules()}
    tied = embed is not None and head is not None and head.weight is embed.weight
    for module, kind, style in (
        (embed, "embedding_sp" if sp else "embedding", lambda: RowwiseParallel(input_layouts=Replicate())),
        (head, "lm_head", lambda: ColwiseParallel(output_layouts=Replicate())),
    ):
        if module is None or id(module) not in names:
            continue
        path = names[id(module)]
        if module.weight.shape[0] % n or tied:
            info.replicated.append(
                f"{path} ({'tied to the embedding' if tied else 'vocab does not divide by ' + str(n)})"
            )
            continue
        info.plan[path] = kind
        if kind != "embedding_sp":  # sequence parallelism shards it by hand
            plan[path] = style()
    return plan, info


def _by_structure(model: torch.nn.Module, planned: dict[str, str]) -> dict[str, str]:
    """Projections no name above identifies, found by where they sit (GPT-J's out_proj, fc_in and fc_out): in a
    block of two or more linear layers with none yet planned to end it, the last that writes the model's hidden
    size ends the block (rowwise: its output summed across devices) and every other that reads the hidden size
    starts it (colwise), as q/k/v -> o and up -> down run. A block of four or more is attention: its head counts
    become local ("local_heads"), for models that reshape by them (GPT-J before transformers 5.24)."""
    hidden = config_field(_config(model), "hidden_size")
    if not isinstance(hidden, int):
        return {}
    found = {}
    for path, block in model.named_modules():
        linears = [
            (f"{path}.{name}" if path else name, child)
            for name, child in block.named_children()
            if isinstance(child, torch.nn.Linear)
        ]
        if len(linears) < 2 or any(planned.get(p) in ROW_KINDS for p, _ in linears):
            continue
        ends = [p for p, linear in linears if linear.out_features == hidden]
        if not ends:
            continue
        found[ends[-1]] = "rowwise"
        found.update(
            {
                p: "colwise"
                for p, linear in linears
                if p != ends[-1] and p not in planned and linear.in_features == hidden
            }
        )
        if len(linears) >= 4:
            found[path] = "local_heads"
    return found


def _has_fused_qkv(module: torch.nn.Module) -> bool:
    return any(isinstance(getattr(module, name, None), torch.nn.Linear) for name in FUSED_QKV)


def _expert_weights(module: torch.nn.Module) -> list[str]:
    """The names of ``module``'s own 3-D expert Parameters ([experts, ...]), if it is an experts module."""
    return [
        name
        for name, param in module.named_parameters(recurse=False)
        if name in EXPERT_WEIGHTS and param.dim() == 3
    ]


def _replace(module: torch.nn.Module, name: str, shape: tuple[int, ...]) -> None:
    """Swap a parameter for one device's shard: a meta tensor of the local shape (no weights are held)."""
    old = getattr(module, name)
    setattr(
        module,
        name,
        torch.nn.Parameter(
            torch.empty(shape, dtype=old.dtype, device="meta"), requires_grad=old.requires_grad
        ),
    )


def _shard_dim(module: torch.nn.Module, name: str, dim: int, n: int, path: str, option: str = "tp") -> None:
    """Keep 1/n of ``name`` along ``dim``; ModelError naming ``option`` (its Python name) when it does not divide."""
    shape = list(getattr(module, name).shape)
    if shape[dim] % n:
        raise ModelError(
            f"{say(option, n)}: {path}.{name} has {shape[dim]} rows along the dimension it splits "
            f"(shape {tuple(shape)}), which does not divide by {n}; choose a {say(option)} that divides "
            "it"
        )
    shape[dim] //= n
    _replace(module, name, tuple(shape))


def _local_heads(attention: torch.nn.Module, heads: int, kv_heads: int, n: int) -> None:
    """The attention module's head counts as one device holds them (one KV head when there are fewer than n)."""
    local_heads, local_kv = heads // n, max(1, kv_heads // n)
    for attr, whole, local in (
        ("num_heads", heads, local_heads),
        ("num_attention_heads", heads, local_heads),
        ("num_kv_heads", kv_heads, local_kv),
        ("num_key_value_heads", kv_heads, local_kv),
        ("num_key_value_groups", heads // max(kv_heads, 1), local_heads // local_kv),
    ):
        if getattr(attention, attr, None) == whole:
            setattr(attention, attr, local)


def _shard_fused_qkv(model: torch.nn.Module, path: str, n: int) -> None:
    """One device's fused QKV projection: heads/n query heads, kv_heads/n key/value heads (or one replicated
    KV head when kv_heads < n, as vLLM does), and the attention module's head counts made local."""
    attention, linear = model.get_submodule(path.rpartition(".")[0]), model.get_submodule(path)
    heads = next(
        (getattr(attention, a) for a in ("num_heads", "num_attention_heads") if hasattr(attention, a)), None
    ) or config_field(_config(model), "num_attention_heads")
    head_dim = (
        getattr(attention, "head_dim", None)
        or getattr(attention, "head_size", None)
        or linear.in_features // heads
    )
    kv_heads = (linear.out_features // head_dim - heads) // 2
    if heads % n or (kv_heads % n and n % kv_heads):
        raise ModelError(
            f"{say('tp', n)}: {path} has {heads} query heads and {kv_heads} key/value heads; tensor "
            f"parallelism needs the query heads to divide by {n} and the key/value heads to divide "
            f"by {n} or {n} to be a multiple of them (then each device holds one KV head)"
        )
    rows = (heads // n + 2 * max(1, kv_heads // n)) * head_dim
    _replace(linear, "weight", (rows, linear.in_features))
    if linear.bias is not None:
        _replace(linear, "bias", (rows,))
    linear.out_features = rows
    _local_heads(attention, heads, kv_heads, n)


def _shard_kv_replicated(model: torch.nn.Module, path: str, n: int) -> None:
    """A k or v projection of a model with fewer KV heads than devices: each device holds one KV head (vLLM
    replicates each head over n / kv_heads devices), so the projection keeps head_dim output rows."""
    parent, _, leaf = path.rpartition(".")
    attention, linear = model.get_submodule(parent), model.get_submodule(path)
    config = _config(model)
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(attention, "head_dim", None) or linear.out_features // kv_heads
    _replace(linear, "weight", (head_dim, linear.in_features))
    if linear.bias is not None:
        _replace(linear, "bias", (head_dim,))
    linear.out_features = head_dim
    if leaf == KV_PROJECTIONS[0]:
        _local_heads(attention, heads, kv_heads, n)


def _all_reduce(mesh: Any):
    """What follows a row-parallel layer sharded by hand: an all_reduce of the partial sums."""
    import torch.distributed._functional_collectives as funcol

    return lambda module, args, out: funcol.all_reduce(out, "sum", mesh)


def _shard_conv1d(model: torch.nn.Module, path: str, mesh: Any, n: int, column: bool, sp: bool) -> None:
    """GPT-2's Conv1D (weight [in, out]): split by output column (c_attn's query, key and value heads, c_fc),
    or by input row with an all_reduce after it (c_proj; under sequence parallelism castcore.deploy.parallel.sequence
    reduce-scatters instead). The attention module's sizes are made local."""
    conv = model.get_submodule(path)
    if column:
        _shard_dim(conv, "weight", 1, n, path)
        _shard_dim(conv, "bias", 0, n, path)
        conv.nf //= n
        attention = model.get_submodule(path.rpartition(".")[0])
        if path.endswith("c_attn"):
            for attr in ("split_size", "embed_dim", "num_heads"):
                if isinstance(getattr(attention, attr, None), int):
                    setattr(attention, attr, getattr(attention, attr) // n)
    else:
        _shard_dim(conv, "weight", 0, n, path)
        if not sp:
            conv.register_forward_hook(_all_reduce(mesh))


def _shard_experts(model: torch.nn.Module, path: str, mesh: Any, n: int) -> None:
    """split_experts, and an all_reduce of the experts' output, which each device holds a partial sum of."""
    experts = model.get_submodule(path)
    split_experts(experts, path, n)
    experts.register_forward_hook(_all_reduce(mesh))


def split_experts(experts: torch.nn.Module, path: str, n: int, option: str = "tp") -> None:
    """Every expert's matrices split n ways along the intermediate dimension (gate/up by column, down by row)."""
    if not is_experts_module(experts):
        raise ModelError(
            f"{say(option, n)}: {path} ({type(experts).__name__}) is not a transformers experts module "
            f"castcore can split; drop {say(option)}"
        )
    transposed = bool(
        getattr(experts, "is_transposed", False)
    )  # [experts, in, out] rather than [experts, out, in]
    for name in _expert_weights(experts):
        column = name != "down_proj"
        _shard_dim(
            experts, name, (2 if transposed else 1) if column else (1 if transposed else 2), n, path, option
        )
        bias = getattr(experts, f"{name}_bias", None)
        if column and isinstance(bias, torch.nn.Parameter):
            _shard_dim(experts, f"{name}_bias", 1, n, path, option)
    if isinstance(getattr(experts, "intermediate_dim", None), int):
        experts.intermediate_dim //= n


def shard_by_hand(model: torch.nn.Module, mesh: Any, info: TensorParallel, sp: bool = False) -> None:
    """Shard what parallelize_module's styles cannot: fused QKV projections, replicated KV heads, Conv1D layers
    and 3-D expert weights."""
    for path, kind in info.plan.items():
        if kind == "fused_qkv":
            _shard_fused_qkv(model, path, info.size)
        elif kind == "kv_replicated":
            _shard_kv_replicated(model, path, info.size)
        elif kind.startswith("conv1d_"):
            _shard_conv1d(model, path, mesh, info.size, kind == "conv1d_colwise", sp)
        elif kind == "experts":
            _shard_experts(model, path, mesh, info.size)
        elif kind == "sinks":
            _shard_dim(model.get_submodule(path), "sinks", 0, info.size, path)
        elif kind == "local_heads":
            config = _config(model)
            heads = config_field(config, "num_attention_heads")
            _local_heads(
                model.get_submodule(path),
                heads,
                config_field(config, "num_key_value_heads") or heads,
                info.size,
            )


def per_device_config(config: Any, n: int) -> Any:
    """A model config (built, or a config.json dict) as one of ``n`` devices sees it: heads and KV heads / n
    (one KV head when there are fewer than n), head_dim explicit. kv_cache_bytes reads it, so a prefill's KV
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
    return _config(model).num_key_value_heads if replicated_kv(model, n) else n


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
    built: BuiltModel | torch.nn.Module, mesh: Any, n: int, sp: bool = False, experts: bool = True
) -> TensorParallel:
    """Shard a model over the 1-D ``mesh`` of ``n`` ranks: the plan, parallelize_module, what is done by hand,
    and for a BuiltModel the inputs (one device's KV cache), description and config of one device."""
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
    plan, info = build_plan(model, n, sp=sp, experts=experts)
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
