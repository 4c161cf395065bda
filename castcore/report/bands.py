"""Error bands: how far castcore's estimate of a kernel family has been off on a device, on held-out points.

A profile's ``[error_bands]`` table gives, for each of castcore.devices.profile.BAND_FAMILIES, the held-out
median |error| a fidelity report measured on that device, with its source under ``[sources]``. ``op_band`` finds
the family of an op row's calls and its band; ``castcore estimate --json`` prints it on the row
(``error_band``), ``null`` where the profile has none.
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Any

from castcore.devices.memory_kernels import memory_family

if TYPE_CHECKING:
    from castcore.devices.profile import DeviceProfile

_ATTENTION = (
    "castcore::attention",
    "castcore::latent_attention",
    "castcore::varlen_attention",
    "castcore::varlen_latent_attention",
)
_GEMMS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::_scaled_mm")
_GROUPED = (
    "aten::_grouped_mm",
    "aten::_scaled_grouped_mm",
    "castcore::weight_only_grouped_mm",
    "castcore::int8_scaled_grouped_mm",
    "castcore::block_scaled_grouped_mm",
)
_ENGINE_KERNELS = ("one_shot", "two_shot")


def family(record: Any) -> str | None:
    """The kernel family of one call (an OpRecord: its invoke and estimate), as the fidelity reports group them;
    None for any other."""
    invoke, name = record.invoke, record.invoke.name
    if name in _ATTENTION:
        queries = (
            max(invoke.argument("new")) if name.startswith("castcore::varlen_") else invoke.args[0].shape[-2]
        )
        return "attention_decode" if queries == 1 else "attention_prefill"
    if name in _GEMMS:
        if invoke.args[-2 if name == "aten::addmm" else 0].dtype.itemsize != 1:
            return "gemm_bf16"
        scale = invoke.argument("scale_a")  # one per row (per-tensor or per-token), or one per 128 columns
        return (
            "gemm_fp8_block" if scale is not None and scale.dim() == 2 and scale.shape[-1] > 1 else "gemm_fp8"
        )
    if name in _GROUPED:
        return "moe"
    algorithm = (record.estimate.detail or {}).get("algorithm")
    if name == "_c10d_functional::all_reduce" and algorithm in _ENGINE_KERNELS:
        return "engine_allreduce"
    if name == "_c10d_functional::all_to_all_single" and algorithm == "low_latency":
        return "low_latency_a2a"
    if name.startswith("_c10d_functional::") and name != "_c10d_functional::wait_tensor":
        return "collective"  # the library's own algorithms (ring, tree, in-switch, all-to-all)
    if memory_family(name):
        return "memory_bound"
    return None


def op_band(records: list[Any], device: DeviceProfile) -> dict[str, Any] | None:
    """The band of the family that takes most of these calls' time, when the device has one."""
    time_by_family: dict[str, float] = defaultdict(float)
    for record in records:
        found = family(record)
        if found is not None:
            time_by_family[found] += record.estimate.time_s
    if not time_by_family:
        return None
    chosen = max(time_by_family, key=time_by_family.__getitem__)
    band = device.error_bands.get(chosen)
    return None if band is None else {"family": chosen, "held_out_median_abs_error": band}
