"""The one table of dtype names: short aliases users type (bf16, fp8) to torch's names (bfloat16).

Torch-free on purpose: device profiles and the command line use it before torch is imported.
"""

from __future__ import annotations

from typing import Any

# torch dtype names that profiles and tables may use, plus the accelerator-only formats torch lacks.
TORCH_NAMES = frozenset(
    {
        "float64",
        "float32",
        "float16",
        "bfloat16",
        "float8_e4m3fn",
        "float8_e5m2",
        "float8_e4m3fnuz",
        "float8_e5m2fnuz",
        "float8_e8m0fnu",
        "float4_e2m1fn_x2",
        "complex64",
        "complex128",
        "complex32",
        "int64",
        "int32",
        "int16",
        "int8",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "bool",
        "int4",
        "uint4",
    }
)
DEVICE_ONLY = frozenset({"hf32", "tf32"})  # matrix-unit modes for float32 inputs

ALIASES = {
    "bf16": "bfloat16",
    "fp16": "float16",
    "half": "float16",
    "fp32": "float32",
    "float": "float32",
    "fp64": "float64",
    "double": "float64",
    "fp8": "float8_e4m3fn",
    "fp8_e4m3": "float8_e4m3fn",
    "fp8_e5m2": "float8_e5m2",
    "long": "int64",
    "int": "int32",
}
# What --dtype accepts for a model's weights and activations; tf32 is float32 with TF32 matrix products.
MODEL_DTYPES = ("bf16", "fp16", "fp32", "tf32", "bfloat16", "float16", "float32")
# What --input SPEC:dtype accepts for one tensor.
TENSOR_DTYPES = ("bf16", "fp16", "fp32", "fp64", "int64", "int32", "int8", "bool")


def dtype_name(dtype: Any) -> str:
    """torch.bfloat16 or "torch.bfloat16" or "bf16" -> "bfloat16"; an unknown string is returned unchanged."""
    text = dtype if isinstance(dtype, str) else str(dtype)
    text = text.strip().removeprefix("torch.")
    return ALIASES.get(text.lower(), text)


def is_dtype_name(name: str) -> bool:
    """A dtype name a profile may list: torch's own spelling, or a device-only mode."""
    return name in TORCH_NAMES or name in DEVICE_ONLY


def torch_dtype(name: Any):
    """The torch.dtype for a name or alias (tf32: its values are float32); ValueError for anything else."""
    import torch

    if isinstance(name, torch.dtype):
        return name
    found = getattr(torch, "float32" if dtype_name(name) == "tf32" else dtype_name(name), None)
    if not isinstance(found, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return found
