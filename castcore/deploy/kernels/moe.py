"""Deployed kernels for mixture-of-experts blocks, as vLLM's fused MoE runs them (castcore.deploy.kernels.fusing calls
``rewrite_moe`` on every transformers module):

- a top-k router (Mixtral, Qwen-MoE, gpt-oss with its bias) -> ``castcore::topk_softmax``; DeepSeek-V3's grouped
  sigmoid router -> ``castcore::grouped_topk``;
- grouped-GEMM experts -> ``castcore::moe_permute`` (gather and sort by expert), the two grouped GEMMs with the
  gated activation between them (``castcore::silu_and_mul``; gpt-oss's clamped SwiGLU with its first bias ->
  ``castcore::clamped_swiglu``), and ``castcore::moe_unpermute`` (weighted combine, the second bias);
- Llama 4's MoE block, which transformers runs through every expert -> top-k routing and the same experts path,
  the router weight applied to the expert's input, plus its shared expert.

An experts module rewritten here carries ``castcore_gate(rows, offsets)``, its fused activation, which the
expert-parallel forward (castcore.deploy.parallel.experts) calls too; Llama 4's experts are given the attributes of
transformers' grouped-GEMM experts modules, so tensor and expert parallelism and quantization treat them alike.
"""

from __future__ import annotations

import types

import torch
from torch import nn

from castcore.hf.layers import grouped_router_kind, is_default_gated_experts
from castcore.builtin import fused_ops  # noqa: F401  (defines the torch.ops.castcore ops)
from castcore.recording.routing import expert_routing
from castcore.deploy.parallel.experts import _grouped
from castcore.deploy.parallel.tensor_plan import _expert_weights

ops = torch.ops.castcore


def rewrite_moe(module: nn.Module, dtype: torch.dtype | None = None) -> str | None:
    """Rewrite ``module`` in place if it is a mixture-of-experts part castcore fuses; the note's kind, else None.
    ``dtype``: the model's, which DeepSeek's router weight is held in (transformers keeps it fp32), as engines
    run that router: one GEMM reading the hidden states as they are (TensorRT-LLM's dsv3_router_gemm reads bf16
    and writes fp32 logits; vLLM's and SGLang's gates are bf16 linears), no fp32 copy of them first."""
    if _is_top_k_router(module):
        module.forward = types.MethodType(_fused_router_forward, module)
        return "MoE router softmax + top-k -> castcore::topk_softmax"
    kind = grouped_router_kind(module)
    if kind:
        if kind == "router":
            module.forward = types.MethodType(_grouped_router_forward, module)
            if dtype is not None and dtype.is_floating_point and module.weight.dtype != dtype:
                module.weight = nn.Parameter(module.weight.detach().to(dtype), requires_grad=False)
        else:  # the gate only computes the logits (transformers 5.5): in the model's dtype too
            module.route_tokens_to_experts = types.MethodType(_grouped_routing, module)
            module.gate.forward = types.MethodType(_router_logits, module.gate)
        return "MoE grouped top-k router (sigmoid, groups, top-k) -> castcore::grouped_topk"
    if _is_dense_routed_moe(module):
        _adopt_dense_experts(module.experts)
        module.forward = types.MethodType(_fused_dense_routed_moe_forward, module)
        return (
            "MoE block run through every expert (Llama 4) -> top-k routing, castcore::moe_permute + grouped "
            "GEMMs + castcore::silu_and_mul + castcore::moe_unpermute, and its shared expert"
        )
    if _is_silu_experts(module):
        _fuse_experts(module, _silu_gate)
        return "MoE experts -> castcore::moe_permute + grouped GEMMs + castcore::silu_and_mul + castcore::moe_unpermute"
    if _is_clamped_swiglu_experts(module):
        _fuse_experts(module, _clamped_swiglu_gate)
        return (
            "MoE experts with biases and clamped SwiGLU (gpt-oss) -> castcore::moe_permute + grouped GEMMs + "
            "castcore::clamped_swiglu + castcore::moe_unpermute"
        )
    return None


# --- routers ---------------------------------------------------------------------------------------------------


def _is_top_k_router(module: nn.Module) -> bool:
    """transformers' plain top-k routers: a weight (and gpt-oss's bias), top_k, softmax and top-k. gpt-oss takes
    the softmax of the k best logits, which is the renormalised top k of the softmax over all of them."""
    own = {name for name, _ in module.named_parameters(recurse=False)}
    return (
        type(module).__name__.endswith("TopKRouter")
        and own in ({"weight"}, {"weight", "bias"})
        and isinstance(module.top_k, int)
        and not list(module.children())
    )


def _fused_router_forward(self, hidden_states):
    hidden_states = hidden_states.reshape(-1, self.weight.shape[-1])
    logits = nn.functional.linear(hidden_states, self.weight, getattr(self, "bias", None))
    weights, indices = ops.topk_softmax(logits, self.top_k, bool(getattr(self, "norm_topk_prob", True)))
    return logits, weights, indices


def _grouped_router_forward(self, hidden_states):
    hidden_states = hidden_states.reshape(-1, self.hidden_dim)
    if self.weight.dtype != hidden_states.dtype:  # transformers' fp32 router where rewrite_moe had no dtype
        hidden_states = hidden_states.float()
    logits = nn.functional.linear(hidden_states, self.weight.to(hidden_states.dtype))
    weights, indices = ops.grouped_topk(
        logits,
        self.e_score_correction_bias,
        self.num_group,
        self.topk_group,
        self.top_k,
        bool(self.norm_topk_prob),
        float(self.routed_scaling_factor),
    )
    return logits, weights, indices


def _router_logits(self, hidden_states):
    return nn.functional.linear(hidden_states.reshape(-1, self.weight.shape[-1]), self.weight)


def _grouped_routing(self, router_logits):
    weights, indices = ops.grouped_topk(
        router_logits,
        self.gate.e_score_correction_bias,
        self.n_group,
        self.topk_group,
        self.top_k,
        bool(self.norm_topk_prob),
        float(self.routed_scaling_factor),
    )
    return indices, weights


# --- experts ---------------------------------------------------------------------------------------------------


def _is_silu_experts(module: nn.Module) -> bool:
    """transformers' grouped-GEMM experts (3-D gate_up_proj / down_proj) with SiLU gating and no biases."""
    return (
        len(_expert_weights(module)) == 2
        and is_default_gated_experts(module)
        and type(getattr(module, "act_fn", None)).__name__ in ("SiLUActivation", "SiLU")
    )


def _is_clamped_swiglu_experts(module: nn.Module) -> bool:
    """gpt-oss's experts: [experts, in, out] weights with biases, gate and up interleaved, a clamped SwiGLU."""
    return (
        set(_expert_weights(module)) == {"gate_up_proj", "down_proj"}
        and getattr(module, "has_bias", False)
        and getattr(module, "is_transposed", False)
        and type(module).__name__ == "GptOssExperts"
        and all(
            isinstance(getattr(module, n, None), nn.Parameter)
            for n in ("gate_up_proj_bias", "down_proj_bias")
        )
        and all(isinstance(getattr(module, n, None), float) for n in ("alpha", "limit"))
    )


def _silu_gate(self, rows: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    return ops.silu_and_mul(rows)


def _clamped_swiglu_gate(self, rows: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    return ops.clamped_swiglu(rows, self.gate_up_proj_bias, offsets, float(self.alpha), float(self.limit))


def _fuse_experts(module: nn.Module, gate) -> None:
    module.castcore_gate = types.MethodType(gate, module)
    module.forward = types.MethodType(_fused_experts_forward, module)


def _fused_experts_forward(self, hidden_states, top_k_index, top_k_weights):
    """As vLLM's fused MoE runs: dispatch (gather + sort) in one kernel, the two grouped GEMMs with the gated
    activation between them, and the weighted combine in one kernel. ``_grouped`` is looked up by name, so a
    quantized deployment swaps in its own product (castcore.deploy.quantize.layers): the body stays in this one
    function. Its ops carry the top-k for a routing skew and the fused-MoE mark (castcore.recording.routing)."""
    with expert_routing(top_k=top_k_index.shape[-1], fused=True):
        rows, order, offsets = ops.moe_permute(hidden_states, top_k_index, self.num_experts)
        # Llama 4: the router weight scales the expert's input
        if getattr(self, "castcore_weights_on_input", False):
            rows = rows * top_k_weights.reshape(-1)[order].unsqueeze(-1).to(rows.dtype)
            top_k_weights = torch.ones_like(top_k_weights)
        transposed = bool(getattr(self, "is_transposed", False))
        out = self.castcore_gate(_grouped(rows, self.gate_up_proj, offsets, transposed), offsets)
        bias = getattr(self, "down_proj_bias", None) if getattr(self, "has_bias", False) else None
        return ops.moe_unpermute(
            _grouped(out, self.down_proj, offsets, transposed),
            order,
            top_k_weights,
            bias,
            offsets if bias is not None else None,
        )


# --- Llama 4 ---------------------------------------------------------------------------------------------------


def _is_dense_routed_moe(module: nn.Module) -> bool:
    """transformers' Llama 4 MoE block, which runs every token through every expert, the unchosen ones with a
    router score of sigmoid(-inf) = 0: experts with [experts, in, out] weights, a linear router, a shared expert."""
    experts = getattr(module, "experts", None)
    return (
        type(module).__name__ == "Llama4TextMoe"
        and isinstance(getattr(module, "router", None), nn.Linear)
        and all(
            getattr(experts, n, None) is not None and getattr(experts, n).dim() == 3
            for n in ("gate_up_proj", "down_proj")
        )
    )


def _adopt_dense_experts(experts: nn.Module) -> None:
    """Llama 4's experts as a grouped-GEMM experts module: [experts, in, out] weights, gate and up concatenated."""
    experts.has_gate, experts.has_bias, experts.is_transposed = True, False, True
    experts.castcore_weights_on_input = True
    _fuse_experts(experts, _silu_gate)


def _fused_dense_routed_moe_forward(self, hidden_states):
    """As vLLM runs Llama 4's MoE: top-k of the router's logits, their sigmoid as weights applied to the expert's
    input (apply_router_weight_on_input), only the chosen experts' rows through the grouped GEMMs, plus the shared
    expert. Returns what transformers' block returns: (output, router logits)."""
    hidden_states = hidden_states.reshape(-1, self.hidden_dim)
    logits = (
        self.router(hidden_states)
        if type(self.router).forward is nn.Linear.forward
        else nn.functional.linear(hidden_states, self.router.weight)
    )
    values, indices = torch.topk(logits, self.top_k, dim=1)
    routed = self.experts(hidden_states, indices, torch.sigmoid(values.float()))
    return self.shared_expert(hidden_states) + routed, logits
