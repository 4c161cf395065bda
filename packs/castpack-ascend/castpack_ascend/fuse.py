"""``fuse_model``: a stock Hugging Face decoder (Llama, Qwen2, Mistral and their look-alikes) rewritten in
place to call the ``ascend::`` fused operators, as an Ascend deployment (vllm-ascend, MindIE) runs it.

Modules are recognised by structure, not by class, and swapped only when the replacement computes the same
function: RMS norms (``weight`` and ``variance_epsilon``, not Gemma's 1 + weight), SiLU-gated MLPs
(``gate_proj``/``up_proj``/``down_proj``, no bias: gate and up merged into one projection, then swiglu)
and rotary self-attention (``q/k/v/o_proj``, no per-head q/k norms: rotary + prompt or incremental flash
attention with GQA). Weights are moved, never copied; on a meta-device model nothing is allocated.
"""

from __future__ import annotations

import torch
from torch import nn

from castcore import pack

ascend = torch.ops.ascend


class AscendRMSNorm(nn.Module):
    def __init__(self, weight: nn.Parameter, eps: float):
        super().__init__()
        self.weight, self.variance_epsilon = weight, eps

    def forward(self, hidden_states):
        return ascend.rms_norm(hidden_states, self.weight, self.variance_epsilon)[0]


class AscendSwiGLUMLP(nn.Module):
    """down(swiglu(x @ [gate; up]^T)): one projection for gate and up, as merged-column linears do."""

    def __init__(self, mlp: nn.Module):
        super().__init__()
        gate, up = mlp.gate_proj.weight, mlp.up_proj.weight
        self.gate_up_proj = nn.Linear(gate.shape[1], gate.shape[0] + up.shape[0], bias=False,
                                      device=gate.device, dtype=gate.dtype)
        with torch.no_grad():
            self.gate_up_proj.weight = nn.Parameter(torch.cat([gate, up]), requires_grad=gate.requires_grad)
        self.down_proj = mlp.down_proj

    def forward(self, x):
        return self.down_proj(ascend.swiglu(self.gate_up_proj(x), -1))


class AscendAttention(nn.Module):
    """q/k/v projections, ascend::apply_rotary_pos_emb, then ascend::prompt_flash_attention (or, for one new
    token over a KV cache, ascend::incre_flash_attention), then the output projection."""

    def __init__(self, attn: nn.Module):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj
        self.config, self.layer_idx, self.head_dim = attn.config, attn.layer_idx, attn.head_dim
        self.scaling = attn.scaling

    def forward(self, hidden_states, position_embeddings=None, attention_mask=None, past_key_values=None, cache=None,
                **kwargs):
        # transformers 5.24 passes the KV cache as ``cache``; earlier releases as ``past_key_values``.
        past_key_values = cache if cache is not None else past_key_values
        b, s, _ = hidden_states.shape
        # Head counts from the projections' outputs, so a tensor-parallel shard runs its own heads.
        q, k, v = self.q_proj(hidden_states), self.k_proj(hidden_states), self.v_proj(hidden_states)
        heads, kv_heads = q.shape[-1] // self.head_dim, k.shape[-1] // self.head_dim
        q = q.view(b, s, heads, self.head_dim)
        k = k.view(b, s, kv_heads, self.head_dim)
        v = v.view(b, s, kv_heads, self.head_dim)
        cos, sin = position_embeddings
        q, k = ascend.apply_rotary_pos_emb(q, k, cos.unsqueeze(2), sin.unsqueeze(2), "BSND")
        common = dict(num_heads=heads, num_key_value_heads=kv_heads, scale_value=self.scaling)
        if past_key_values is not None:
            k, v = past_key_values.update(k.transpose(1, 2), v.transpose(1, 2), self.layer_idx)
            q = q.transpose(1, 2)
            if s == 1:
                out = ascend.incre_flash_attention(q, k, v, input_layout="BNSD", **common)
            else:
                out = ascend.prompt_flash_attention(q, k, v, input_layout="BNSD", sparse_mode=3, **common)
            out = out.transpose(1, 2)
        else:
            out = ascend.prompt_flash_attention(q, k, v, input_layout="BSND", sparse_mode=3 if s > 1 else 0, **common)
        return self.o_proj(out.reshape(b, s, -1)), None


def _is_rms_norm(m: nn.Module) -> bool:
    name = type(m).__name__
    return (name.endswith("RMSNorm") and not name.startswith("Gemma") and isinstance(getattr(m, "weight", None), nn.Parameter)
            and m.weight.dim() == 1 and isinstance(getattr(m, "variance_epsilon", None), float))


def _is_silu(act) -> bool:
    return isinstance(act, (nn.SiLU,)) or type(act).__name__ in ("SiLUActivation", "SiLU")


def _is_swiglu_mlp(m: nn.Module) -> bool:
    parts = [getattr(m, p, None) for p in ("gate_proj", "up_proj", "down_proj")]
    return (all(isinstance(p, nn.Linear) and p.bias is None for p in parts) and _is_silu(getattr(m, "act_fn", None))
            and parts[0].weight.shape == parts[1].weight.shape)


def _is_rotary_attention(m: nn.Module) -> bool:
    projections = ("q_proj", "k_proj", "v_proj", "o_proj")
    return (all(isinstance(getattr(m, p, None), nn.Linear) for p in projections)
            and {name for name, _ in m.named_children()} == set(projections)  # no q_norm / k_norm / sinks
            and hasattr(m, "head_dim") and hasattr(m, "layer_idx") and hasattr(m, "scaling")
            and getattr(getattr(m, "config", None), "sliding_window", None) is None)


# What each ascend:: kernel the rewrite calls runs instead of, so that a claim on one of those eager ops that a
# deployed workload no longer reaches is said (castcore warns), never silently unused.
_NORM = ("aten::pow.Tensor_Scalar", "aten::mean.dim", "aten::rsqrt", "aten::mul.Tensor", "aten::_to_copy")
_ATTENTION = ("aten::_scaled_dot_product_flash_attention_for_cpu", "aten::_scaled_dot_product_efficient_attention",
              "aten::_scaled_dot_product_attention_math", "aten::bmm", "aten::_softmax")
for fused, eager in {"ascend::rms_norm": _NORM, "ascend::swiglu": ("aten::silu", "aten::mul.Tensor"),
                     "ascend::apply_rotary_pos_emb": ("aten::mul.Tensor", "aten::add.Tensor", "aten::neg", "aten::cat",
                                                      "aten::slice.Tensor"),
                     "ascend::prompt_flash_attention": _ATTENTION, "ascend::incre_flash_attention": _ATTENTION}.items():
    pack.declare_replaces(fused, eager)

KINDS = [
    ("RMSNorm", _is_rms_norm, lambda m: AscendRMSNorm(m.weight, m.variance_epsilon), "ascend::rms_norm"),
    ("SiLU-gated MLP", _is_swiglu_mlp, AscendSwiGLUMLP, "merged gate/up projection + ascend::swiglu"),
    ("rotary attention", _is_rotary_attention, AscendAttention,
     "ascend::apply_rotary_pos_emb + ascend::prompt_flash_attention (incre_flash_attention when decoding)"),
]


def fuse(model: nn.Module) -> list[str]:
    """Swap every recognised module of ``model`` in place; one line per kind of swap with its count."""
    lines = []
    for label, matches, make, target in KINDS:
        found = [(name, m) for name, m in model.named_modules() if name and matches(m)]
        for name, m in found:
            parent_name, _, attr = name.rpartition(".")
            setattr(model.get_submodule(parent_name) if parent_name else model, attr, make(m))
        if found:
            lines.append(f"{len(found)} {label} -> {target}")
    return lines


@pack.hookimpl
def fuse_model(model, device):
    """Fuse only for Ascend devices: the ``ascend::`` kernels exist nowhere else."""
    if not device.name.startswith("ascend-") or not isinstance(model, nn.Module):
        return None
    return fuse(model)
