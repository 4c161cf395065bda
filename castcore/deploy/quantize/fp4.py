"""4-bit floating-point weights (--weights nvfp4, mxfp4) and int4 weights with fp8 activations (W4A8).

castcore.deploy.quantize.apply and castcore.deploy.quantize.layers call this module for these formats; their layouts are castcore.builtin.quantized_ops's.

- ``--weights nvfp4``: E2M1 codes two per byte, one float8_e4m3fn scale per 16 input columns and fp32 per-tensor
  scales, with activations quantized as they come to NVFP4 too, per 16 columns over a calibrated per-tensor scale
  (``castcore::quantize_blocks``), and the W4A4 product (``castcore::block_scaled_mm``) at the device's FP4 matrix
  rate (``mma_flops.float4_e2m1fn_x2``), as TensorRT-LLM and vLLM (FlashInfer's and CUTLASS's FP4 GEMMs) run
  ModelOpt's NVFP4 checkpoints on Blackwell. A device without an FP4 rate is refused: engines have no NVFP4 path
  there worth pricing. Layout: "NVBlock: NVIDIA NVFP4 Block Format for GPU Inference",
  https://stillwater-sc.github.io/universal/number-systems/nvblock, read 2026-11-27 (16-element blocks, an E4M3
  scale each, an FP32 per-tensor scale), as NVIDIA's "Introducing NVFP4 for Efficient and Accurate Low-Precision
  Inference" (developer.nvidia.com technical blog, 2025-06) describes it.
- ``--weights mxfp4``: E2M1 codes two per byte, one float8_e8m0fnu (power of two) scale per 32 input columns
  (OCP Microscaling Formats (MX) Specification v1.0, 2023-09). gpt-oss ships its experts so. What it pairs with
  depends on the device, as engines decide:

  - no FP4 matrix rate (Hopper): weight-only (W4A16), ``castcore::weight_only_linear`` and
    ``weight_only_grouped_mm`` dequantize in registers and multiply in the model dtype, as vLLM's triton
    matmul_ogs and Marlin MXFP4 kernels and TensorRT-LLM's TRITON MoE backend run gpt-oss on H100/H200;
  - an FP4 rate (Blackwell): W4A8, activations quantized as they come to MXFP8 (fp8 E4M3, an E8M0 scale per 32
    columns) and the MXFP8 x MXFP4 product at the FP8 rate (Blackwell's kind::mxf8f6f4 MMA). TensorRT-LLM's gpt-oss
    guide recommends exactly this pairing on Blackwell ("mxfp8 activation x mxfp4 weight", CUTLASS and TRTLLM MoE
    backends; bf16 activations on Hopper): TensorRT-LLM examples/models/core/gpt_oss/README.md, MoE support
    matrix, https://github.com/NVIDIA/TensorRT-LLM/tree/main/examples/models/core/gpt_oss, read 2026-11-27. vLLM
    picks FlashInfer's MXFP4 MoE on B200 with bf16 activations unless VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8 is set
    (get_mxfp4_backend, vllm/model_executor/layers/quantization/mxfp4.py, https://github.com/vllm-project/vllm,
    read 2026-11-27), and its gpt-oss recipe for Blackwell sets it ("Blackwell (B200) with FlashInfer
    MXFP4+MXFP8 MoE", vLLM Recipes, openai/gpt-oss-20b, read 2026-11-27). W4A8 is priced because it is what both
    engines' Blackwell guides deploy; the product at the FP8 rate, not the FP4 one (both operands must be fp4 for
    that).
- ``--weights int4 --activations fp8`` (W4A8): int4 weights as ``--weights int4`` stores them (a scale per 128
  input columns), activations quantized per token to fp8, the int4 codes converted to fp8 in registers and the
  product at the FP8 rate, as TensorRT-LLM's W4A8 AWQ and vLLM's CUTLASS W4A8 kernels run on Hopper: "[kernel]
  Support W4A8 on Hopper", https://github.com/vllm-project/vllm/pull/23198 (int4 weights with fp8 scales per 128,
  activations fp8 per token, per-token and per-channel scales in the epilogue, "approach peak FP8 throughput"),
  and its grouped twin for experts, https://github.com/vllm-project/vllm/pull/29691, both read 2026-11-27.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from castcore.builtin.quantized_ops import FP4
from castcore.options.catalog import say
from castcore.workload.spec import ModelError

if TYPE_CHECKING:
    from castcore.devices.profile import DeviceProfile

ops = torch.ops.castcore
BLOCK_SCALED = (
    "block-scaled"  # a module's quantization: quantized activations times quantized weights, per block
)
BLOCK_SCALED_MX4 = "block-scaled mxfp4"  # the same with MXFP4 activations (W4A4)
BLOCK_SCALED_KINDS = (BLOCK_SCALED, BLOCK_SCALED_MX4)
FP4_RATE, FP8_RATE = "float4_e2m1fn_x2", "float8_e4m3fn"  # the profile's mma_flops keys
# format: (input columns per weight scale, the scales' dtype); nvfp4 adds fp32 per-tensor scales.
FORMATS = {"nvfp4": (16, torch.float8_e4m3fn), "mxfp4": (32, torch.float8_e8m0fnu)}
MX_BLOCK = 32


def pairing(kind: str, activations: str | None, device: DeviceProfile | None) -> str | None:
    """What runs the products of ``--weights kind``: BLOCK_SCALED (W4A4, W4A8) or None (weight-only, or W8A8,
    which castcore.deploy.quantize.apply decides). ModelError for NVFP4 on a device without an FP4 rate."""
    rates = device.mma_flops if device is not None else {FP4_RATE: 0, FP8_RATE: 0}
    if (kind, activations) == ("mxfp4", "mxfp4"):  # the device's FP4 rate is checked before (apply)
        return BLOCK_SCALED_MX4
    if kind == "nvfp4" and FP4_RATE not in rates:
        raise ModelError(
            f"{say('weights', 'nvfp4')}: {device.name} has no FP4 matrix rate ({FP4_RATE}), which "
            "NVFP4's W4A4 products run at; choose a device whose profile has one (a Blackwell such as "
            f"b200), or use {say('weights', 'fp8')} or {say('weights', 'mxfp4')}"
        )
    if kind == "nvfp4" or (kind == "mxfp4" and FP4_RATE in rates and FP8_RATE in rates):
        return BLOCK_SCALED
    return BLOCK_SCALED if (kind, activations) == ("int4", "fp8") else None


def codes(
    out_features: int,
    in_features: int,
    kind: str,
    dtype: torch.dtype,
    device: Any,
    experts: int | None = None,
) -> tuple[nn.Parameter, nn.Parameter, int]:
    """(packed E2M1 codes [.., out, in / 2], block scales [.., out, in / block], block) of an fp4 weight."""
    block, scale_dtype = FORMATS[kind]
    if in_features % block:
        raise ModelError(
            f"{say('weights', kind)} scales blocks of {block} input columns, and a weight here has "
            f"{in_features}; use {say('weights', 'int4')} or {say('weights', 'fp8')}"
        )
    lead = () if experts is None else (experts,)
    packed = torch.empty((*lead, out_features, in_features // 2), dtype=FP4, device=device)
    scales = torch.empty((*lead, out_features, in_features // block), dtype=scale_dtype, device=device)
    return nn.Parameter(packed, requires_grad=False), nn.Parameter(scales, requires_grad=False), block


def per_tensor_scales(
    module: nn.Module, prefix: str, kind: str, device: Any, experts: int | None = None
) -> None:
    """NVFP4's fp32 per-tensor scales, as ``<prefix>input_scale`` for the activations and ``<prefix>alpha``, the
    activations' and the weight's multiplied (one per expert for experts), which the product's epilogue applies
    (vLLM folds them so at load); None for the other formats."""
    scales = (
        torch.empty((), device=device),
        torch.empty(() if experts is None else (experts,), device=device),
    )
    for name, scale in zip(("input_scale", "alpha"), scales):
        setattr(module, prefix + name, nn.Parameter(scale, requires_grad=False) if kind == "nvfp4" else None)


def _activations(
    rows: torch.Tensor,
    weight: torch.Tensor,
    scales: torch.Tensor,
    input_scale: torch.Tensor | None,
    quantization: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The activations quantized as the weight's format pairs them: NVFP4 (the weight's scales are e4m3), MXFP4
    (W4A4 asked), MXFP8 (e8m0), or fp8 per token (int4 weights)."""
    if weight.dtype != FP4:
        return ops.quantize_per_token(rows, torch.float8_e4m3fn)
    if scales.dtype == torch.float8_e4m3fn:
        return ops.quantize_blocks(rows, FP4, FORMATS["nvfp4"][0], torch.float8_e4m3fn, input_scale)
    codes = FP4 if quantization == BLOCK_SCALED_MX4 else torch.float8_e4m3fn
    return ops.quantize_blocks(rows, codes, MX_BLOCK, torch.float8_e8m0fnu, None)


def linear_product(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    rows = x.reshape(-1, x.shape[-1])
    codes_, scale = _activations(
        rows, module.qweight, module.weight_scale, module.input_scale, module.quantization
    )
    out = ops.block_scaled_mm(
        codes_,
        module.qweight,
        scale,
        module.weight_scale,
        module.group_size,
        module.alpha,
        module.bias,
        x.dtype,
    )
    return out.reshape(*x.shape[:-1], out.shape[-1])


def grouped_product(
    module: nn.Module, rows: torch.Tensor, weight: torch.Tensor, name: str, offs: torch.Tensor
) -> torch.Tensor:
    scales = getattr(module, f"{name}_scale")
    codes_, scale = _activations(
        rows, weight, scales, getattr(module, f"{name}_input_scale"), module.quantization
    )
    return ops.block_scaled_grouped_mm(
        codes_,
        weight,
        scale,
        scales,
        getattr(module, f"{name}_group_size"),
        getattr(module, f"{name}_alpha"),
        offs,
        rows.dtype,
    )


def describe(kind: str, quantization: str | None, experts: int, model_dtype: str) -> tuple[str, str, str]:
    """(the weights' layout, how the products run, the --activations said) for a note."""
    grouped = ", castcore::block_scaled_grouped_mm for the experts" if experts else ""
    if kind == "int4":
        return (
            "int4, two per byte, with a scale per 128 input columns",
            "activations quantized per token to fp8 (castcore::quantize_per_token), the int4 codes converted to "
            f"fp8 in registers and the products at the fp8 rate (castcore::block_scaled_mm{grouped})",
            " --activations fp8",
        )
    block, scale_dtype = FORMATS[kind]
    layout = (
        f"fp4 (e2m1), two per byte, with a {str(scale_dtype).removeprefix('torch.')} scale per {block} "
        f"input columns" + (" and fp32 per-tensor scales" if kind == "nvfp4" else "")
    )
    if quantization is None:
        how = (
            f"castcore::weight_only_linear{', castcore::weight_only_grouped_mm' if experts else ''} dequantize in "
            f"registers, products in {model_dtype} (W4A16: the device has no FP4 matrix rate)"
        )
    elif quantization == BLOCK_SCALED_MX4:
        how = (
            "activations quantized to MXFP4 per 32 columns (castcore::quantize_blocks), W4A4 products at the fp4 "
            f"rate (castcore::block_scaled_mm{grouped})"
        )
    elif kind == "nvfp4":
        how = (
            "activations quantized to NVFP4 per 16 columns (castcore::quantize_blocks), W4A4 products at the fp4 "
            f"rate (castcore::block_scaled_mm{grouped})"
        )
    else:
        how = (
            "activations quantized to MXFP8 per 32 columns (castcore::quantize_blocks), MXFP8 x MXFP4 products "
            f"at the fp8 rate (castcore::block_scaled_mm{grouped})"
        )
    return layout, how, " --activations mxfp4" if quantization == BLOCK_SCALED_MX4 else ""
