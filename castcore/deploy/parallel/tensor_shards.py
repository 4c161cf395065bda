"""Tensor parallelism's sharding by hand: what parallelize_module's styles cannot shard (fused QKV projections,
replicated KV heads, GPT-2's Conv1D layers, 3-D expert weights, attention sinks), each parameter replaced by
one device's shard, a meta tensor of the local shape, and the attention modules' head counts made local.
"""

from __future__ import annotations

from typing import Any

import torch

from castcore.deploy.parallel.tensor_plan import KV_PROJECTIONS, TensorParallel, _expert_weights, text_config
from castcore.hf.layers import is_experts_module
from castcore.options.catalog import say
from castcore.report.memory import config_field
from castcore.workload.spec import ModelError


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
    ) or config_field(text_config(model), "num_attention_heads")
    head_dim = (
        getattr(attention, "head_dim", None)
        or getattr(attention, "head_size", None)
        or linear.in_features // heads
    )
    widths = getattr(
        attention, "castcore_qkv_widths", None
    )  # castcore's merge: q may be wider than its heads
    kv_heads = widths[1] // head_dim if widths else (linear.out_features // head_dim - heads) // 2
    if heads % n or (kv_heads % n and n % kv_heads):
        raise ModelError(
            f"{say('tp', n)}: {path} has {heads} query heads and {kv_heads} key/value heads; tensor "
            f"parallelism needs the query heads to divide by {n} and the key/value heads to divide "
            f"by {n} or {n} to be a multiple of them (then each device holds one KV head)"
        )
    kv_rows = max(1, kv_heads // n) * head_dim
    q_rows = widths[0] // n if widths else heads // n * head_dim
    rows = q_rows + 2 * kv_rows
    if widths:
        attention.castcore_qkv_widths = [q_rows, kv_rows, kv_rows]
    _replace(linear, "weight", (rows, linear.in_features))
    if linear.bias is not None:
        _replace(linear, "bias", (rows,))
    linear.out_features, linear.castcore_sharded = rows, True
    _local_heads(attention, heads, kv_heads, n)


def _shard_kv_replicated(model: torch.nn.Module, path: str, n: int) -> None:
    """A k or v projection of a model with fewer KV heads than devices: each device holds one KV head (vLLM
    replicates each head over n / kv_heads devices), so the projection keeps head_dim output rows."""
    parent, _, leaf = path.rpartition(".")
    attention, linear = model.get_submodule(parent), model.get_submodule(path)
    config = text_config(model)
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(attention, "head_dim", None) or linear.out_features // kv_heads
    _replace(linear, "weight", (head_dim, linear.in_features))
    if linear.bias is not None:
        _replace(linear, "bias", (head_dim,))
    linear.out_features, linear.castcore_sharded = head_dim, True
    if leaf == KV_PROJECTIONS[0]:
        _local_heads(attention, heads, kv_heads, n)


def _all_reduce(mesh: Any):
    """What follows a row-parallel layer sharded by hand: an all_reduce of the partial sums."""
    import torch.distributed._functional_collectives as funcol

    return lambda module, args, out: funcol.all_reduce(out, "sum", mesh)


def _all_reduce_block(mesh: Any):
    """What follows an MoE block whose experts and shared expert left partial sums: an all_reduce of its output
    (the first of a tuple, beside the router logits some blocks return)."""
    import torch.distributed._functional_collectives as funcol

    def hook(module, args, out):
        if isinstance(out, tuple):
            return (funcol.all_reduce(out[0], "sum", mesh), *out[1:])
        return funcol.all_reduce(out, "sum", mesh)

    return hook


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
    """split_experts, and an all_reduce of the experts' output, which each device holds a partial sum of, unless
    the block around them sums it with its shared expert's (castcore_block_sums)."""
    experts = model.get_submodule(path)
    split_experts(experts, path, n)
    if not getattr(experts, "castcore_block_sums", False):
        experts.register_forward_hook(_all_reduce(mesh))


def split_experts(experts: torch.nn.Module, path: str, n: int, option: str = "tp") -> None:
    """Every expert's matrices split n ways along the intermediate dimension (gate/up by column, down by row)."""
    if not is_experts_module(experts):
        raise ModelError(
            f"{say(option, n)}: {path} ({type(experts).__name__}) is not a transformers experts module "
            f"castcore can split; drop {say(option)}"
        )
    # [experts, in, out] rather than [experts, out, in]
    transposed = bool(getattr(experts, "is_transposed", False))
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
    and 3-D expert weights; an MoE block marked "moe_sum" all-reduces its output, its experts not."""
    for path, kind in info.plan.items():
        if kind == "moe_sum":
            block = model.get_submodule(path)
            block.register_forward_hook(_all_reduce_block(mesh))
            for child in block.children():
                if _expert_weights(child):
                    child.castcore_block_sums = (
                        True  # read by its all_reduce here and by expert parallelism's
                    )
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
            config = text_config(model)
            heads = config_field(config, "num_attention_heads")
            _local_heads(
                model.get_submodule(path),
                heads,
                config_field(config, "num_key_value_heads") or heads,
                info.size,
            )
