"""Deployed norms: RMSNorm modules as ``castcore::rms_norm``, and a pre-norm decoder layer's residual adds fused into
the norms after them (``castcore::add_rms_norm``, vLLM's fused_add_rms_norm): the first into the post-attention
norm, the closing one into the next layer's input norm (or the model's final norm), as engines carry the residual
from layer to layer. castcore.deploy.kernels.fusing decides where they apply.
"""

from __future__ import annotations

import inspect

import torch
from torch import nn

from castcore.builtin import fused_ops  # noqa: F401  (defines the torch.ops.castcore ops)
from castcore.hf.causal_lm import is_transformers_module

ops = torch.ops.castcore


def norm_parts(module: nn.Module) -> tuple[nn.Parameter, float, float] | None:
    """(weight, eps, offset) of an RMSNorm module, offset 1 for the (1 + weight) norms of Gemma and Qwen3-Next."""
    weight = getattr(module, "weight", None)
    eps = getattr(module, "variance_epsilon", getattr(module, "eps", None))
    if not (
        type(module).__name__.endswith("RMSNorm")
        and isinstance(weight, nn.Parameter)
        and weight.dim() == 1
        and isinstance(eps, float)
        and not list(module.children())
    ):
        return None
    return weight, eps, 1.0 if _scales_by_one_plus_weight(module) else 0.0


def _scales_by_one_plus_weight(module: nn.Module) -> bool:
    """Whether the norm multiplies by 1 + weight (zero-centred weights), read from its forward's source."""
    if type(module).__name__.startswith("Gemma"):
        return True
    try:
        source = inspect.getsource(type(module).forward)
    except (OSError, TypeError):
        return False
    return any(f"{one} + self.weight" in source for one in ("1", "1.0"))


def is_rms_norm(module: nn.Module) -> bool:
    return norm_parts(module) is not None


def is_weightless_head_norm(module: nn.Module, parent: nn.Module) -> bool:
    """Llama 4's qk norm: x / rms(x) over each head, no weight (vLLM runs it as an RMSNorm without one)."""
    return (
        type(module).__name__.endswith("L2Norm")
        and isinstance(getattr(module, "eps", None), float)
        and not list(module.parameters())
        and isinstance(getattr(parent, "head_dim", None), int)
        and isinstance(getattr(parent, "q_proj", None), nn.Linear)
    )


class FusedRMSNorm(nn.Module):
    def __init__(self, norm: nn.Module, attention: nn.Module | None = None):
        super().__init__()
        if attention is None:
            self.weight, self.eps, self.offset = norm_parts(norm)
        else:  # weightless: x / rms(x) * (1 + 0)
            zeros = torch.zeros(attention.head_dim, device=attention.q_proj.weight.device)
            self.weight, self.eps, self.offset = zeros, norm.eps, 1.0

    def forward(self, hidden_states):
        carried = take_residual(self, hidden_states)
        if carried is not None:  # the layer before left its closing residual add to this norm (the final one)
            return ops.add_rms_norm(hidden_states, carried, self.weight, self.eps, self.offset)[0]
        if self.__dict__.get("castcore_in_rotary"):  # a q or k head norm the rotary kernel computes
            return ops.rotary_qk_norm(hidden_states, self.weight, self.eps, self.offset)
        return ops.rms_norm(hidden_states, self.weight, self.eps, self.offset)


def norms_in_rotary(attention: nn.Module) -> bool:
    """Mark the attention's per-head q and k norms as computed by the rotary kernel after them, as TensorRT-LLM's
    fusedQKNormRope, SGLang's fused_qknorm_rope and vLLM's fused_qk_norm_rope run Qwen3's; True when marked. Only
    where both norm one head at a time, the rotary turns whole heads and the forward norms before it rotates."""
    norms = [getattr(attention, name, None) for name in ("q_norm", "k_norm")]
    head_dim = getattr(attention, "head_dim", None)
    config = getattr(attention, "config", None)
    if not all(isinstance(n, FusedRMSNorm) and n.weight.numel() == head_dim for n in norms):
        return False
    if getattr(config, "partial_rotary_factor", 1.0) not in (None, 1, 1.0):
        return False
    try:
        source = inspect.getsource(type(attention).forward)
    except (OSError, TypeError):
        return False
    normed, rotated = source.find("self.q_norm("), source.find("apply_rotary")
    if normed < 0 or rotated < normed:
        return False
    for norm in norms:
        norm.castcore_in_rotary = True
    return True


def take_residual(norm: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor | None:
    """The residual the layer before left for ``norm`` to add (chain_residual_adds), taken once; None when there
    is none, or it is another call's (of another shape: a layer it was left for ran no more)."""
    carried = norm.__dict__.pop("castcore_residual", None)
    return carried if carried is not None and carried.shape == hidden_states.shape else None


# --- decoder layers: the residual add fused into the second norm ---------------------------------------

_LAYER_PARTS = {"input_layernorm", "self_attn", "post_attention_layernorm", "mlp"}
# Llama 4's layer names its MLP feed_forward and returns a tensor under a tuple annotation (5.5.0-5.24.0).
_LLAMA4_LAYER = (
    "Llama4TextDecoderLayer",
    {"input_layernorm", "self_attn", "post_attention_layernorm", "feed_forward"},
)


def is_fusable_layer(module: nn.Module) -> bool:
    children = {name for name, _ in module.named_children()}
    llama4 = (type(module).__name__, children) == _LLAMA4_LAYER
    if (children != _LAYER_PARTS and not llama4) or not is_transformers_module(module):
        return False
    returns = inspect.signature(type(module).forward).return_annotation
    return (
        (llama4 or returns in (torch.Tensor, "torch.Tensor"))
        and is_rms_norm(module.post_attention_layernorm)
        and is_transformers_module(module.input_layernorm)
        and is_transformers_module(module.post_attention_layernorm)
    )


def fused_layer_forward(self, hidden_states, *args, **kwargs):
    """The pre-norm decoder layer with its residual adds fused into the norms after them: the first into the
    post-attention norm; the closing one, where ``chain_residual_adds`` linked the layer, left to the next norm
    (the layer returns its MLP's output, and the residual goes to that norm beside it), and the one the layer
    before left taken by this layer's input norm."""
    first = self.input_layernorm
    carried = take_residual(first, hidden_states)
    if args:  # called with positional options: the layer's own forward knows their order
        summed = hidden_states if carried is None else hidden_states + carried
        return type(self).forward(self, summed, *args, **kwargs)
    if carried is None:
        normed = first(hidden_states)
    else:
        normed, hidden_states = ops.add_rms_norm(
            hidden_states, carried, first.weight, first.eps, first.offset
        )
    attended = self.self_attn(normed, **kwargs)
    attended = attended[0] if isinstance(attended, tuple) else attended
    norm = self.post_attention_layernorm
    weight, eps, offset = (
        (norm.weight, norm.eps, norm.offset) if isinstance(norm, FusedRMSNorm) else norm_parts(norm)
    )
    normed, residual = ops.add_rms_norm(attended, hidden_states, weight, eps, offset)
    out = self.mlp(normed) if hasattr(self, "mlp") else self.feed_forward(normed)
    out = (out[0] if isinstance(out, tuple) else out).view(residual.shape)
    ahead = self.__dict__.get("castcore_next_norm")
    if ahead is None:
        return residual + out
    ahead.__dict__["castcore_residual"] = residual  # the next norm adds it, in the kernel that norms
    return out


def chain_residual_adds(model: nn.Module) -> int:
    """Leave each rewritten layer's closing residual add to the norm that reads its output next (the next
    layer's input norm, or the model's final norm after the last layer), as vLLM's layers hand the residual to
    the next fused_add_rms_norm: one kernel where there were two. Linked only where that norm is castcore's and
    its layer a rewritten one, so the residual is sure to be added; the count of adds left so."""
    chained = 0
    for container in [m for m in model.modules() if isinstance(m, nn.ModuleList)]:
        layers = list(container)
        if not any(_rewritten(layer) for layer in layers):
            continue
        owner = next((m for m in model.modules() if any(c is container for c in m.children())), None)
        final = getattr(owner, "norm", None)
        takes = set()
        for layer, after in zip(layers, [*layers[1:], None]):
            if not _rewritten(layer):
                continue
            ahead = final if after is None else after.input_layernorm if _rewritten(after) else None
            if isinstance(ahead, FusedRMSNorm):
                layer.__dict__["castcore_next_norm"] = ahead  # not a submodule: the norm is the next one's
                if after is not None:
                    takes.add(id(after))
                chained += 1
        for layer in filter(_rewritten, layers):
            # Layer reuse (castcore.recording.reuse) replays layers alike in their plain attributes: the first,
            # which takes no residual, is captured apart from those after it, which do. (A replayed last layer
            # leaves the final norm no residual: it runs as a plain norm, its add's bytes left out.)
            layer.castcore_takes_residual = id(layer) in takes
    return chained


def _rewritten(layer: nn.Module) -> bool:
    forward = getattr(layer, "forward", None)
    return getattr(forward, "__func__", None) is fused_layer_forward
