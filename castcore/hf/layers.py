"""transformers' layers whose weights or forward castcore reshapes: the experts modules of transformers 5
(``@use_experts_implementation``), DeepSeek-V3's grouped router, GPT-2's Conv1D (checked 5.5.0-5.24.0, as each
function says).
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def is_experts_module(module: torch.nn.Module) -> bool:
    """One of transformers 5's ``@use_experts_implementation`` experts modules, whose 3-D weights castcore splits
    and quantizes (the decorator's ``has_gate``, and ``_apply_gate``; checked 5.5.0-5.24.0), or Llama 4's experts
    once castcore.deploy.kernels.moe has given them those attributes (``castcore_gate``)."""
    return hasattr(module, "has_gate") and (
        hasattr(module, "_apply_gate") or hasattr(module, "castcore_gate")
    )


def is_default_gated_experts(module: torch.nn.Module) -> bool:
    """A ``@use_experts_implementation`` experts module with a gate applied by transformers' default
    (``has_gate``, ``has_bias``, ``is_transposed``, ``_apply_gate`` named ``_default_apply_gate``; checked
    5.5.0-5.24.0)."""
    gate = getattr(type(module), "_apply_gate", None)
    return (
        getattr(module, "has_gate", False)
        and not getattr(module, "has_bias", False)
        and not getattr(module, "is_transposed", False)
        and getattr(gate, "__name__", "") == "_default_apply_gate"
    )


def experts_grouped_forward(module: torch.nn.Module) -> Callable | None:
    """transformers' grouped-GEMM experts forward for a ``@use_experts_implementation`` module, whatever
    implementation the model was built with; None for another module. Relies on
    ``integrations.moe.grouped_mm_experts_forward`` calling ``_grouped_linear`` by its global name (checked
    5.5.0-5.24.0)."""
    if not hasattr(module, "has_gate"):
        return None
    try:
        from transformers.integrations import moe
    except ImportError:
        return None
    return getattr(moe, "grouped_mm_experts_forward", None)


def grouped_router_kind(module: torch.nn.Module) -> str | None:
    """Where DeepSeek-V3's grouped top-k routing runs: "router" when the router module chooses the experts and
    returns (logits, weights, indices), "moe" when the MoE block's ``route_tokens_to_experts(logits)`` does and
    returns (indices, weights); None for other modules. Relies on those names and on the attributes num_group,
    topk_group (router) or n_group (MoE block) and e_score_correction_bias (checked 5.5.0: "moe"; 5.24.0:
    "router")."""
    if type(module).__name__.endswith("TopkRouter"):
        found = all(hasattr(module, a) for a in ("num_group", "topk_group", "e_score_correction_bias"))
        return "router" if found else None
    if (
        callable(getattr(module, "route_tokens_to_experts", None))
        and hasattr(module, "n_group")
        and hasattr(getattr(module, "gate", None), "e_score_correction_bias")
    ):
        return "moe"
    return None


def is_conv1d(module: torch.nn.Module) -> bool:
    """transformers' Conv1D (GPT-2's linears): weight [in, out], ``nf`` outputs (checked 5.5.0-5.24.0)."""
    weight = getattr(module, "weight", None)
    return (
        type(module).__name__ == "Conv1D"
        and hasattr(module, "nf")
        and isinstance(weight, torch.Tensor)
        and weight.dim() == 2
    )
