"""The tensor-parallel plan: which of a model's modules parallelize_module shards with which style, which
castcore shards by hand (castcore.deploy.parallel.tensor_shards), and what stays whole. Its rules are the ones
castcore.deploy.parallel.tensor describes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from castcore.hf.layers import is_conv1d
from castcore.options.catalog import say
from castcore.report.memory import config_field
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
# Falcon's and GPT-NeoX's, and castcore's merged one (castcore.deploy.kernels.qkv); a ``dense`` beside it is the
# attention's output projection
FUSED_QKV = ("query_key_value", "qkv_proj")
EXPERT_WEIGHTS = ("gate_up_proj", "gate_proj", "up_proj", "down_proj")  # 3-D Parameters of an experts module
# GPT-2's [in, out]
CONV1D = {
    "c_attn": "conv1d_colwise",
    "c_fc": "conv1d_colwise",
    "c_proj": "conv1d_rowwise",
}
KV_PROJECTIONS = ("k_proj", "v_proj")
# Kimi Linear's delta attention: its per-head projections beside q/k/v (the write strength, and the forget and
# output gates' second, low-rank-to-heads halves), split by heads as vLLM's KimiDeltaAttention splits them; the
# gates' first halves (f_a_proj, g_a_proj) stay whole
DELTA_HEADS = ("b_proj", "g_b_proj", "forget_gate.f_b_proj")
SHARED_EXPERTS = (
    "shared_experts",
    "shared_expert",
)  # an MoE block's always-on MLP, beside its routed experts
# the block outputs: an all_reduce (a reduce_scatter under --sp) after them
ROW_KINDS = (
    "rowwise",
    "conv1d_rowwise",
)


@dataclass
class TensorParallel:
    """What ``tensor_parallel`` did: the size, the plan given to parallelize_module, what stayed whole."""

    size: int
    plan: dict[str, str] = field(default_factory=dict)  # module path -> "colwise" / "rowwise" / ...
    replicated: list[str] = field(default_factory=list)  # modules a real TP plan shards that were kept whole


def text_config(model: torch.nn.Module) -> Any:
    """The model's config, its language model's where it has one."""
    config = getattr(model, "config", None)
    return getattr(config, "text_config", None) or config


def _check_divisible(model: torch.nn.Module, n: int) -> None:
    config = text_config(model)
    if config is None:
        return
    for name in ("num_attention_heads", "num_key_value_heads", "intermediate_size", "linear_num_heads"):
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
    config = text_config(model)
    kv = getattr(config, "num_key_value_heads", None) if config is not None else None
    return isinstance(kv, int) and 0 < kv < n and n % kv == 0


def build_plan(
    model: torch.nn.Module, n: int, sp: bool = False, experts: bool = True, moe_sums: bool = True
) -> tuple[dict[str, Any], TensorParallel]:
    """The parallelize_module plan: every nn.Linear named like a projection (Llama, Mistral, Qwen2, Falcon's
    and GPT-NeoX's MLPs). Fused QKV projections, replicated KV heads, GPT-2's Conv1D layers and 3-D expert
    weights are in ``info.plan`` as "fused_qkv", "kv_replicated", "conv1d_colwise"/"conv1d_rowwise" and "experts",
    sharded by hand (``shard_by_hand``) after parallelize_module. ``sp``: row-parallel outputs are left as partial
    sums and the embedding is marked "embedding_sp", for castcore.deploy.parallel.sequence to reduce-scatter them.
    ``experts=False`` leaves 3-D expert weights to expert parallelism. ``moe_sums``: the routed experts' outputs
    are partial sums over the group (split experts, or expert parallelism inside it), so an MoE block with a
    shared expert leaves that expert's output partial too and is marked "moe_sum": one all_reduce of the block's
    output sums both, as vLLM's SharedFusedMoE and TensorRT-LLM reduce them."""
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
        # gpt-oss: one attention sink per head
        if isinstance(getattr(module, "sinks", None), torch.nn.Parameter):
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
    for block, down in _shared_moe_blocks(model).items() if moe_sums and not sp else ():
        if info.plan.get(down) == "rowwise":
            plan[down] = RowwiseParallel(output_layouts=Partial())
            info.plan[block] = "moe_sum"
    for path, kind in _by_structure(model, info.plan).items():
        if kind != "local_heads":
            plan[path] = (
                (RowwiseParallel(output_layouts=Partial()) if sp else RowwiseParallel())
                if kind == "rowwise"
                else ColwiseParallel()
            )
        info.plan[path] = kind
    for path, kind in _delta_attention_heads(model).items():  # over what structure guessed of its gates
        plan.pop(path, None)
        info.plan.pop(path, None)
        if kind == "colwise":
            plan[path], info.plan[path] = ColwiseParallel(), "colwise"
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
    hidden = config_field(text_config(model), "hidden_size")
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
        if hasattr(block, "index_topk"):  # DeepSeek-V3.2's indexer: whole on every device, as vLLM keeps it
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


def _delta_attention_heads(model: torch.nn.Module) -> dict[str, str]:
    """Every Kimi delta attention block's (one with a forget gate and an output gate beside its q/k/v) gate
    projections: DELTA_HEADS "colwise", the gates' first halves "whole"."""
    found = {}
    for path, block in model.named_modules():
        if hasattr(block, "forget_gate") and hasattr(block, "g_b_proj"):
            at = f"{path}." if path else ""
            found |= {at + name: "colwise" for name in DELTA_HEADS}
            found |= {at + name: "whole" for name in ("g_a_proj", "forget_gate.f_a_proj")}
    return found


def _shared_moe_blocks(model: torch.nn.Module) -> dict[str, str]:
    """Mixture-of-experts blocks with routed experts and a shared expert MLP: block path -> the shared expert's
    down projection. Each block adds the two outputs (DeepSeek, GLM-4.5, Qwen2-MoE's gated one, Llama 4), a sum
    the partial sums of both can go into."""
    found = {}
    for path, block in model.named_modules():
        children = dict(block.named_children())
        shared = next((name for name in SHARED_EXPERTS if name in children), None)
        down = getattr(children.get(shared), "down_proj", None) if shared else None
        if isinstance(down, torch.nn.Linear) and any(_expert_weights(c) for c in children.values()):
            found[path] = f"{path}.{shared}.down_proj" if path else f"{shared}.down_proj"
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
