"""Memory-bound kernel families: which family each operator castcore prices belongs to (the one place that says
so), and a profile's ``[memory_kernels]`` table of what each family's kernels reach on that device.

A family listed in a profile replaces, for its calls, the device-wide memory_efficiency (``efficiency``), the
per-call cost gp_op_cost_s (``floor_s``) and the ramp memory_half_bytes (``half_bytes``); a family the profile
does not list, and every op outside the families, keeps the device-wide numbers (castcore.devices.roofline)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

# family -> the operators (torch's names, overload left off) whose kernels it prices. castcore's deployed norms
# (castcore::rms_norm, castcore::add_rms_norm) are the engines' kernels, not torch's: their own family,
# engine_norm, which no profile measures yet, so they keep the device-wide per-call cost every other small kernel
# pays. Published figures for them at decode sizes, replayed from a
# CUDA graph, span it: SGLang's RMSNorm 1.2 us at 16 tokens of 2048 and 2.0 us at 16384 on an H100
# (sgl-project/sglang#24733, do_bench_cudagraph), TransformerEngine's 2.9 us a call in a Megatron decode step's
# profile (NVIDIA/Megatron-LM#6463), FlashInfer's and vLLM's add + norm 5.2 and 6.9 us at one token of 7168
# (vllm-project/vllm#36899, its CUDA-graph mode); torch's own, behind this family, takes 4.4 us at 4096 and
# 7.1 us at 8192 (bench/kernels/measured/h200-sxm-2026-11-27.jsonl).
_FAMILY_OPS = {
    "rms_norm": ("aten::rms_norm", "aten::_fused_rms_norm"),
    "engine_norm": ("castcore::rms_norm", "castcore::add_rms_norm", "castcore::rotary_qk_norm"),
    "layer_norm": (
        "aten::native_layer_norm",
        "aten::layer_norm",
        "aten::native_group_norm",
        "aten::group_norm",
    ),
    "rotary": ("castcore::rotary_embedding",),
    "activation": (
        "aten::silu",
        "aten::gelu",
        "aten::relu",
        "aten::sigmoid",
        "aten::tanh",
        "castcore::silu_and_mul",
        "castcore::gelu_and_mul",
        "castcore::clamped_swiglu",
    ),
    "residual_add": ("aten::add", "aten::add_"),
    "elementwise": (
        "aten::mul",
        "aten::mul_",
        "aten::div",
        "aten::div_",
        "aten::sub",
        "aten::neg",
        "aten::abs",
        "aten::clamp",
        "aten::_to_copy",
        "aten::copy_",
        "aten::where",
    ),
    "reduction": ("aten::max", "aten::amax", "aten::sum", "aten::mean"),
    "embedding": ("aten::embedding", "aten::index_select", "aten::gather", "aten::index"),
    "quantize": (
        "castcore::quantize_per_token",
        "castcore::quantize_per_token_group",
        "castcore::quantize_blocks",
    ),
    "kv_cache_write": (
        "castcore::kv_cache_write",
        "aten::index_put",
        "aten::index_put_",
        "aten::index_copy_",
        "aten::scatter",
        "aten::scatter_",
    ),
    "sampling": (
        "aten::topk",
        "aten::sort",
        "aten::_softmax",
        "aten::argmax",
        "aten::multinomial",
        "aten::cumsum",
    ),
}
MEMORY_FAMILIES = tuple(_FAMILY_OPS)
_FAMILY_OF = {op: family for family, ops in _FAMILY_OPS.items() for op in ops}
FIELDS = ("efficiency", "floor_s", "half_bytes")


def memory_family(op_name: str) -> str:
    """The family of an operator named as torch prints it (``aten::add.Tensor``), or "" outside every family."""
    return _FAMILY_OF.get(op_name.split(".", 1)[0], "")


@dataclass(frozen=True, slots=True)
class MemoryKernel:
    """What one family's kernels reach on a device; None: the device-wide number."""

    efficiency: float | None = None  # fraction of memory_bandwidth, for memory_efficiency
    floor_s: float | None = None  # the least a call takes, for gp_op_cost_s
    half_bytes: float | None = None  # bytes at half bandwidth, for memory_half_bytes


def parse_memory_kernels(raw: Any, number: Callable[[Any, str], float], fail) -> MappingProxyType:
    """The ``[memory_kernels]`` table checked: family = {efficiency, floor_s, half_bytes}, each optional."""
    if not isinstance(raw, dict):
        raise fail("'memory_kernels' must be a table of family = {efficiency, floor_s, half_bytes}")
    found = {}
    for family, entry in raw.items():
        key = f"memory_kernels.{family}"
        if family not in _FAMILY_OPS:
            raise fail(f"'{key}' is not a memory-bound family; families: {', '.join(MEMORY_FAMILIES)}")
        if not isinstance(entry, dict) or not entry:
            raise fail(f"'{key}' must be a table of {', '.join(FIELDS)} (at least one)")
        unknown = sorted(set(entry) - set(FIELDS))
        if unknown:
            raise fail(f"'{key}' has unknown field(s) {', '.join(unknown)}; known: {', '.join(FIELDS)}")
        values = {name: number(value, f"{key}.{name}") for name, value in entry.items()}
        if "efficiency" in values and not 0 < values["efficiency"] <= 1:
            raise fail(f"'{key}.efficiency' = {values['efficiency']} must be in (0, 1]")
        found[family] = MemoryKernel(**values)
    return MappingProxyType(found)
