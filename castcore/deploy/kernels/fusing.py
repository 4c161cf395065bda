"""Deployed kernels: a model castcore builds, rewritten to run as serving engines run it.

First every plugin's ``fuse_model`` hook rewrites what it knows for the device (castpack-ascend swaps in its
``ascend::`` kernels); then the core rewrites what is left of the Hugging Face graph, found by structure, to
call its device-neutral fused ops (castcore.builtin.fused_ops):

- RMSNorm modules -> ``castcore::rms_norm`` (Gemma's 1 + weight too), no fp32 upcast ops around it;
- a decoder layer of input_layernorm / self_attn / post_attention_layernorm / mlp: the residual add before
  the second norm fused into it (``castcore::add_rms_norm``), as vLLM's fused_add_rms_norm does, and its closing
  residual add into the next layer's input norm or the final norm (castcore.deploy.kernels.norms);
- an attention's q, k and v projections merged into one, ``qkv_proj`` (castcore.deploy.kernels.qkv);
- gated MLPs (gate_proj, up_proj, down_proj; SiLU or GELU): gate and up merged into one projection, then
  ``castcore::silu_and_mul`` / ``castcore::gelu_and_mul``; a GELU spelled out op by op (GPT-J's gelu_new) ->
  one ``aten::gelu`` with the tanh approximation;
- the rotary embedding of queries and keys -> ``castcore::rotary_embedding`` (the model's own
  ``apply_rotary_pos_emb`` is swapped for the capture only; castcore.deploy.kernels.attention);
- multi-head latent attention (DeepSeek-V3, Kimi K2) -> decompressed heads and ``castcore::attention`` for
  prompts, the absorbed form and ``castcore::latent_attention`` for decode steps (castcore.deploy.kernels.latent);
- Qwen3-Next's Gated DeltaNet linear attention -> ``castcore::causal_conv1d``, ``castcore::gated_delta_rule`` and
  ``castcore::gated_rms_norm`` with each layer's recurrent state (castcore.deploy.kernels.linear_attention);
  Kimi Linear's delta attention the same with a per-channel decay (castcore.deploy.kernels.kimi_delta);
- Nemotron-H's Mamba-2 mixers -> ``castcore::causal_conv1d``, ``castcore::ssd_scan`` and
  ``castcore::gated_group_rms_norm`` with each layer's recurrent state (castcore.deploy.kernels.mamba);
- attention -> ``castcore::attention``: causal, sliding-window and chunked (Llama 4) masks and attention
  sinks (gpt-oss) as arguments, grouped KV heads read once, no repeated keys and values, the output written in
  the layout the next projection reads; a model with its own causal ``_attn`` (GPT-J) has that method swapped
  for the same op. A decode step of a chunked layer reads the keys transformers' cache keeps for it (up to one
  chunk), an upper bound on the keys of the current chunk (castcore.deploy.kernels.attention);
- mixture-of-experts routers and experts -> ``castcore::topk_softmax`` or ``castcore::grouped_topk``,
  ``castcore::moe_permute``, the two grouped GEMMs with the fused activation between them, and
  ``castcore::moe_unpermute`` (castcore.deploy.kernels.moe).

Only modules of transformers' own classes are rewritten, so what a pack swapped in stays as the pack made it.
What stays eager is said in the notes. ``--eager`` skips all of this.
"""

from __future__ import annotations

import types
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import TYPE_CHECKING

import torch
from torch import nn

from castcore.hf.attention import no_attention_backend_note, own_causal_attn, replace_own_attn
from castcore.hf.causal_lm import attention_modules_of, is_transformers_module
from castcore.hf.configs import attention_of
from castcore.hf.rotary import rotary_swapped, standard_rotary
from castcore.builtin import fused_ops  # noqa: F401  (defines the torch.ops.castcore ops)
from castcore.deploy.kernels.latent import is_latent_attention
from castcore.deploy.kernels.latent import rewrite as rewrite_latent
from castcore.deploy.kernels.sparse_latent import is_sparse_latent_attention
from castcore.deploy.kernels.sparse_latent import rewrite as rewrite_sparse_latent
from castcore.deploy.kernels.kimi_delta import is_kimi_delta_attention
from castcore.deploy.kernels.kimi_delta import rewrite as rewrite_kimi_delta
from castcore.deploy.kernels.linear_attention import is_gated_delta_net
from castcore.deploy.kernels.linear_attention import rewrite as rewrite_linear
from castcore.deploy.kernels.mamba import is_mamba2_mixer
from castcore.deploy.kernels.mamba import rewrite as rewrite_mamba
from castcore.deploy.kernels.attention import (
    fused_own_attn,
    fused_rotary,
    use_fused_attention,
)
from castcore.deploy.kernels.norms import (
    FusedRMSNorm,
    chain_residual_adds,
    fused_layer_forward,
    is_fusable_layer,
    is_rms_norm,
    is_weightless_head_norm,
    norms_in_rotary,
)
from castcore.deploy.kernels.cache_writes import write_once
from castcore.deploy.kernels.packing import packing_on
from castcore.deploy.kernels.qkv import merge_qkv
from castcore.workload.models import BuiltModel
from castcore.deploy.kernels.moe import rewrite_moe

if TYPE_CHECKING:
    from castcore.devices.profile import DeviceProfile
    from castcore.plugins.host import PluginHost

ops = torch.ops.castcore
_ATTENTION_REWRITES = (
    (
        is_sparse_latent_attention,
        rewrite_sparse_latent,
        "DeepSeek sparse attention -> castcore::lightning_indexer picks each query's keys, "
        "castcore::sparse_latent_attention over their latent entries (absorbed)",
    ),
    (
        is_latent_attention,
        rewrite_latent,
        "multi-head latent attention -> castcore::attention over decompressed heads (prompts), "
        "castcore::latent_attention over the latent cache (decode)",
    ),
    (
        is_gated_delta_net,
        rewrite_linear,
        "Gated DeltaNet linear attention -> castcore::causal_conv1d + castcore::gated_delta_rule + "
        "castcore::gated_rms_norm, with its recurrent state",
    ),
    (
        is_kimi_delta_attention,
        rewrite_kimi_delta,
        "Kimi delta attention -> castcore::causal_conv1d + castcore::gated_delta_rule (per-channel decay) + "
        "castcore::gated_rms_norm, with its recurrent state",
    ),
    (
        is_mamba2_mixer,
        rewrite_mamba,
        "Mamba-2 mixer -> castcore::causal_conv1d + castcore::ssd_scan + castcore::gated_group_rms_norm, "
        "with its recurrent state",
    ),
)


def fuse(host: PluginHost, built: BuiltModel, device: DeviceProfile, kv_reads: str = "group") -> list[str]:
    """Rewrite ``built`` in place with the plugins' and the core's fused kernels; the lines to report.
    ``kv_reads`` "head": the attention kernel reads grouped K/V once per query head (see castcore::attention)."""
    by_plugin: dict[str, list[str]] = {}
    # A mixed batch splits castcore's own attention per sequence; a pack's attention kernel cannot be split yet.
    for line in [] if packing_on() else host.fuse(built.model, device):  # "label: what it did"
        label, _, done = line.partition(": ")
        by_plugin.setdefault(label, []).append(done)
    core, eager = rewrite(built, kv_reads)
    if core:
        by_plugin["castcore"] = core
    notes = [f"deployed kernels by {label}: {'; '.join(lines)}" for label, lines in by_plugin.items()]
    if eager:
        notes.append(f"stayed eager (no fused kernel matches them): {', '.join(eager)}")
    return notes


def rewrite(built: BuiltModel, kv_reads: str = "group") -> tuple[list[str], list[str]]:
    """The core's rewrites of ``built.model``: one line per kind with its count, and what stayed eager."""
    model, done, eager = built.model, Counter(), Counter()
    dtype = getattr(model, "dtype", None)  # a PreTrainedModel's: its first floating parameter's
    for layer in [m for m in model.modules() if is_fusable_layer(m)]:
        layer.forward = types.MethodType(fused_layer_forward, layer)
        done["decoder layer residual add + RMSNorm -> castcore::add_rms_norm"] += 1
    # a block whose router and experts were rewritten runs no eager kernel itself
    moe_parts, blocks = (
        set(),
        [],
    )
    for name, module in list(model.named_modules()):
        if not name or not is_transformers_module(module):
            continue
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        if is_rms_norm(module):
            setattr(parent, attr, FusedRMSNorm(module))
            done["RMSNorm -> castcore::rms_norm"] += 1
        elif is_weightless_head_norm(module, parent):
            setattr(parent, attr, FusedRMSNorm(module, parent))
            done["weightless RMS norm of q and k heads (Llama 4's L2Norm) -> castcore::rms_norm"] += 1
        elif _gated_activation(module) is not None:
            setattr(parent, attr, FusedGatedMLP(module))
            done[f"gated MLP -> merged gate/up projection + castcore::{_gated_activation(module)[0]}"] += 1
        elif (moe := rewrite_moe(module, dtype)) is not None:
            done[moe] += 1
            moe_parts.add(id(module))
        elif type(module).__name__ in _TANH_GELUS:
            setattr(parent, attr, TanhGelu())
            done["GELU written out op by op (gelu_new) -> one aten::gelu kernel, tanh approximation"] += 1
        elif type(module).__name__.endswith("RMSNorm") or (
            type(module).__name__.endswith("MLP")
            and not any(type(child).__name__ in _TANH_GELUS for child in module.children())
        ):
            blocks.append(module)
    for module in blocks:
        if not any(id(child) in moe_parts for child in module.children()):
            eager[type(module).__name__] += 1
    if chained := chain_residual_adds(model):
        done["decoder layer closing residual add + the next RMSNorm -> castcore::add_rms_norm"] += chained
    # whole attention modules given a forward of castcore's
    for found, rewrite_one, said in _ATTENTION_REWRITES:
        modules = [m for m in model.modules() if is_transformers_module(m) and found(m)]
        for module in modules:
            rewrite_one(module)
        if modules:
            done[said] += len(modules)
    attention_modules = attention_modules_of(model)
    for module in attention_modules:  # read by both fused paths below
        module.castcore_kv_per_query_head = kv_reads == "head"
        if merge_qkv(module):
            done["q/k/v projections -> one merged qkv_proj"] += 1
    reads = " (K/V read once per query head)" if kv_reads == "head" else ""
    if attention_modules and use_fused_attention(model):  # the interface path
        done[f"attention -> castcore::attention{reads}"] += len(attention_modules)
    elif attention_modules and all(own_causal_attn(m) for m in attention_modules):
        for module in attention_modules:
            replace_own_attn(module, fused_own_attn)
        done[f"attention (the model's own _attn) -> castcore::attention{reads}"] += len(attention_modules)
        # Its eager attention no longer runs: the note that says so at build time is not true of this capture.
        _drop_stale_note(built, model)
    elif attention_modules:
        eager[
            f"{type(attention_modules[0]).__name__} (the model keeps its own attention implementation)"
        ] += len(attention_modules)
    else:  # every attention layer runs a forward of castcore's (Kimi Linear's): the build note is not true
        _drop_stale_note(built, model)
    if written := write_once(built):
        done["decode step's key and value cache writes -> one castcore::kv_cache_write"] += written
    rotary = standard_rotary(model)
    if rotary:
        if attention_modules:
            done["rotary embedding of q and k -> castcore::rotary_embedding"] += len(attention_modules)
        if in_rotary := sum(norms_in_rotary(module) for module in attention_modules):
            done[
                "attention layers' per-head q and k RMSNorms -> computed by the rotary kernel "
                "(castcore::rotary_qk_norm)"
            ] += in_rotary
        outer = built.while_capturing
        built.while_capturing = lambda: _both(outer(), rotary_swapped(rotary, fused_rotary))
    return [f"{count} {kind}" for kind, count in done.items()], [
        f"{count} {kind}" for kind, count in eager.items()
    ]


def _drop_stale_note(built: BuiltModel, model: nn.Module) -> None:
    stale = no_attention_backend_note(type(model).__name__, attention_of(model))
    if stale in built.notes:
        built.notes.remove(stale)


# --- activations -------------------------------------------------------------------------------------------

# transformers' activations that spell out 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) in pointwise ops:
# the tanh approximation of GELU, one kernel in a server (vLLM's gelu_new) and one aten::gelu here.
_TANH_GELUS = {"NewGELUActivation", "FastGELUActivation"}


class TanhGelu(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.gelu(x, approximate="tanh")


# --- gated MLPs --------------------------------------------------------------------------------------------


def _gated_activation(module: nn.Module) -> tuple[str, str] | None:
    """("silu_and_mul", "") or ("gelu_and_mul", approximate) for a bias-free gated MLP, else None."""
    parts = [getattr(module, p, None) for p in ("gate_proj", "up_proj", "down_proj")]
    if not all(isinstance(p, nn.Linear) and p.bias is None for p in parts):
        return None
    if {name for name, _ in module.named_children()} - {
        "gate_proj",
        "up_proj",
        "down_proj",
        "act_fn",
        "activation_fn",
    }:
        return None
    if parts[0].weight.shape != parts[1].weight.shape:
        return None
    act = getattr(module, "act_fn", getattr(module, "activation_fn", None))  # Llama 4 names it activation_fn
    name = type(act).__name__
    if isinstance(act, nn.SiLU) or name in ("SiLUActivation", "SiLU"):
        return "silu_and_mul", ""
    if name in ("GELUActivation", "GELU"):
        return "gelu_and_mul", getattr(act, "approximate", "none")
    if name in ("GELUTanh", "PytorchGELUTanh", "NewGELUActivation", "GELUPytorchTanh"):
        return "gelu_and_mul", "tanh"
    return None


class FusedGatedMLP(nn.Module):
    """down(act_and_mul(x @ [gate; up]^T)): one projection for gate and up, as merged-column linears do."""

    def __init__(self, mlp: nn.Module):
        super().__init__()
        self.kernel, self.approximate = _gated_activation(mlp)
        gate, up = mlp.gate_proj.weight, mlp.up_proj.weight
        self.gate_up_proj = nn.Linear(
            gate.shape[1], 2 * gate.shape[0], bias=False, device=gate.device, dtype=gate.dtype
        )
        with torch.no_grad():
            self.gate_up_proj.weight = nn.Parameter(torch.cat([gate, up]), requires_grad=gate.requires_grad)
        self.down_proj = mlp.down_proj

    def forward(self, x):
        merged = self.gate_up_proj(x)
        act = (
            ops.silu_and_mul(merged)
            if self.kernel == "silu_and_mul"
            else ops.gelu_and_mul(merged, self.approximate)
        )
        return self.down_proj(act)


@contextmanager
def _both(first, second) -> Iterator[None]:
    with ExitStack() as stack:
        stack.enter_context(first)
        stack.enter_context(second)
        yield
