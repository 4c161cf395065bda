"""Quantized layers: a linear layer's or an experts module's weights swapped for quantized codes and scales of
their real dtypes and shapes, and its forward for the quantized products (weight-only, W8A8, fp8 with block-wise
scales; the 4-bit formats through castcore.deploy.quantize.fp4). castcore.deploy.quantize.apply says which
layers, and how.
"""

from __future__ import annotations

import functools
import math
import types
from typing import Any

import torch
from torch import nn

from castcore.builtin import quantized_ops  # noqa: F401  (defines the torch.ops.castcore quantized ops)
from castcore.deploy.parallel.tensor_plan import EXPERT_WEIGHTS, _expert_weights
from castcore.deploy.quantize import fp4
from castcore.hf.layers import experts_grouped_forward
from castcore.options.catalog import say
from castcore.options.parts import BLOCK_FP8
from castcore.recording.dtensor import dtensor_type
from castcore.workload.spec import ModelError

ops = torch.ops.castcore
STORED = {
    "int8": torch.int8,
    "int4": torch.uint8,
    "fp8": torch.float8_e4m3fn,
    BLOCK_FP8: torch.float8_e4m3fn,
    "nvfp4": fp4.FP4,
    "mxfp4": fp4.FP4,
}
GROUP_SIZE = 128  # int4: input columns per scale (GPTQ's and AWQ's usual group); fp8-block: the block's side
WEIGHT_ONLY, W8A8 = "weight-only", "w8a8"


def _codes(
    out_features: int,
    in_features: int,
    kind: str,
    w8a8: bool,
    dtype: torch.dtype,
    device: Any,
    experts: int | None = None,
    group_size: int = GROUP_SIZE,
) -> tuple[nn.Parameter, nn.Parameter, int]:
    """(quantized weight, its scales, input columns per scale) for an [out, in] weight, or [experts, out, in];
    ``group_size`` is int4's columns per scale."""
    if kind in fp4.FORMATS:
        return fp4.codes(out_features, in_features, kind, dtype, device, experts)
    lead = () if experts is None else (experts,)
    if kind == "int4":
        if in_features % 2:
            raise ModelError(
                f"{say('weights', 'int4')} packs two weights per byte along the input dimension, which "
                f"has {in_features} columns here (odd); use {say('weights', 'int8')}"
            )
        codes = torch.empty((*lead, out_features, in_features // 2), dtype=torch.uint8, device=device)
        group = group_size
    else:
        codes = torch.empty((*lead, out_features, in_features), dtype=STORED[kind], device=device)
        group = in_features  # one scale per output channel
    if kind == BLOCK_FP8 and experts is None:  # fp32, one per 128 x 128 block of the [out, in] weight
        scales = torch.empty(
            (-(-out_features // GROUP_SIZE), -(-in_features // GROUP_SIZE)),
            dtype=torch.float32,
            device=device,
        )
        return nn.Parameter(codes, requires_grad=False), nn.Parameter(scales, requires_grad=False), GROUP_SIZE
    if w8a8:  # fp32 per-channel scales, [1, out] as torch._scaled_mm takes them ([experts, out] for experts)
        scales = torch.empty(
            (*lead, out_features) if experts else (1, out_features), dtype=torch.float32, device=device
        )
    else:
        scales = torch.empty(
            (*lead, out_features, math.ceil(in_features / group)), dtype=dtype, device=device
        )
    return nn.Parameter(codes, requires_grad=False), nn.Parameter(scales, requires_grad=False), group


def _local(t: torch.Tensor) -> torch.Tensor:
    dtensor = dtensor_type()
    return t.to_local() if dtensor is not None and isinstance(t, dtensor) else t


def _output_placements(weight: torch.Tensor) -> tuple | None:
    """How a linear layer sharded by parallelize_module lays out its output: column-parallel (weight rows split)
    holds some output features, row-parallel (weight columns split) a partial sum; None for a plain weight."""
    dtensor = dtensor_type()
    if dtensor is None or not isinstance(weight, dtensor):
        return None
    from torch.distributed.tensor import Partial, Shard

    return tuple(Shard(-1) if p.is_shard(0) else Partial() if p.is_shard(1) else p for p in weight.placements)


def quantize_linear(
    module: nn.Module, kind: str, quantization: str, fused: bool, group_size: int = GROUP_SIZE
) -> None:
    """Swap the layer's weight for its quantized codes and scales, and its forward for the quantized product.
    The module itself stays, so hooks on it (parallelize_module's input and output layouts) keep working."""
    weight = module.weight
    local = _local(weight)
    out_features, in_features = local.shape if isinstance(module, nn.Linear) else local.shape[::-1]
    placements = _output_placements(weight)
    module.qweight, module.weight_scale, module.group_size = _codes(
        out_features,
        in_features,
        kind,
        quantization == W8A8,
        local.dtype,
        local.device,
        group_size=group_size,
    )
    fp4.per_tensor_scales(module, "", kind, local.device)
    del module.weight
    # one device's bias, a plain tensor
    if module.bias is not None and module.bias is not _local(module.bias):
        bias = _local(module.bias)
        module.bias = nn.Parameter(
            torch.empty(bias.shape, dtype=bias.dtype, device=bias.device), requires_grad=False
        )
    module.quantization = quantization
    module.block_scaled = kind == BLOCK_FP8
    module.fused_epilogue = fused
    module.tp_layout = None if placements is None else (weight.device_mesh, placements)
    module.forward = types.MethodType(_linear_forward, module)


def _linear_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The quantized layer on one device's shard; under tensor parallelism its input and output are DTensors,
    as parallelize_module's hooks hand them in and take them out."""
    dtensor = dtensor_type()
    if self.tp_layout is not None and dtensor is not None and isinstance(x, dtensor):
        mesh, placements = self.tp_layout
        out = _linear_product(self, x.to_local())
        return dtensor.from_local(
            out,
            mesh,
            tuple(x.placements[i] if p.is_replicate() else p for i, p in enumerate(placements)),
            run_check=False,
        )
    return _linear_product(self, x)


def _linear_product(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    if self.quantization == WEIGHT_ONLY:
        return ops.weight_only_linear(x, self.qweight, self.weight_scale, self.group_size, self.bias)
    if self.quantization in fp4.BLOCK_SCALED_KINDS:  # W4A4, W4A8
        return fp4.linear_product(self, x)
    rows = x.reshape(-1, x.shape[-1])
    if self.block_scaled:  # fp8-block: activations in 1 x 128 groups, a block-wise scaled product
        codes, scale = ops.quantize_per_token_group(rows, self.group_size, self.qweight.dtype)
        out = torch._scaled_mm(
            codes, self.qweight.t(), scale, self.weight_scale.t(), bias=self.bias, out_dtype=x.dtype
        )
        return out.reshape(*x.shape[:-1], out.shape[-1])
    codes, scale = ops.quantize_per_token(rows, self.qweight.dtype)
    if self.qweight.dtype == torch.int8 and self.fused_epilogue:
        out = ops.int8_scaled_mm(codes, self.qweight.t(), scale, self.weight_scale, self.bias, x.dtype)
    elif self.qweight.dtype == torch.int8:
        out = ops.dequantize_int_mm(
            torch._int_mm(codes, self.qweight.t()), scale, self.weight_scale, self.bias, x.dtype
        )
    else:
        out = torch._scaled_mm(
            codes, self.qweight.t(), scale, self.weight_scale, bias=self.bias, out_dtype=x.dtype
        )
    return out.reshape(*x.shape[:-1], out.shape[-1])


# --- mixture-of-experts weights -------------------------------------------------------------------------------

# The grouped products an experts forward calls by these global names: transformers' grouped-GEMM forward
# (_grouped_linear) and castcore's expert-parallel one (castcore.deploy.parallel.experts: _grouped).
GROUPED_PRODUCTS = ("_grouped_linear", "_grouped")


def _experts_base_forward(module: nn.Module) -> Any:
    """The experts forward to quantize: one swapped in on the instance (expert parallelism), else transformers'
    grouped-GEMM forward, whatever experts implementation the model was built with; None when neither fits."""
    swapped = vars(module).get("forward")
    if swapped is not None:
        return getattr(swapped, "__func__", None)
    return experts_grouped_forward(module)


def quantize_experts(
    module: nn.Module, path: str, kind: str, quantization: str, group_size: int = GROUP_SIZE
) -> None:
    """Each 3-D expert weight held quantized as [experts, out, in'] (however transformers laid it out), with its
    scales as ``<name>_scale``; the forward is the module's grouped-GEMM one with the quantized products."""
    base = _experts_base_forward(module)
    if base is None or not set(GROUPED_PRODUCTS) & set(base.__code__.co_names):
        raise ModelError(
            f"{say('weights', kind)}: {path} holds mixture-of-experts weights that castcore cannot "
            f"quantize (not a transformers grouped-GEMM experts module); drop {say('weights')}"
        )
    # [experts, in, out] rather than [experts, out, in]
    transposed = bool(getattr(module, "is_transposed", False))
    for name in _expert_weights(module):
        param = getattr(module, name)
        experts, rows, columns = param.shape
        out_features, in_features = (columns, rows) if transposed else (rows, columns)
        codes, scales, group = _codes(
            out_features,
            in_features,
            kind,
            quantization == W8A8,
            param.dtype,
            param.device,
            experts,
            group_size,
        )
        fp4.per_tensor_scales(module, f"{name}_", kind, param.device, experts)
        setattr(module, name, codes)
        setattr(module, f"{name}_scale", scales)
        setattr(module, f"{name}_group_size", group)
    module.quantization = quantization
    product = functools.partial(_grouped_linear, module)
    scope = {
        **base.__globals__,
        "_grouped_linear": product,
        "_grouped": lambda x, weight, offsets, transposed: product(x, weight, offsets),
    }
    forward = types.FunctionType(base.__code__, scope, base.__name__, base.__defaults__, base.__closure__)
    module.forward = types.MethodType(forward, module)


def _grouped_linear(
    self: nn.Module,
    input: torch.Tensor,
    weight: torch.Tensor,
    offs: torch.Tensor,
    bias: torch.Tensor | None = None,
    is_transposed: bool = False,
) -> torch.Tensor:
    """transformers' _grouped_linear for quantized [experts, out, in'] weights (the layout is ours, so
    ``is_transposed`` does not apply)."""
    name = next(n for n in EXPERT_WEIGHTS if getattr(self, n, None) is weight)
    scales = getattr(self, f"{name}_scale")
    if self.quantization == WEIGHT_ONLY:
        out = ops.weight_only_grouped_mm(input, weight, scales, offs, getattr(self, f"{name}_group_size"))
    elif self.quantization in fp4.BLOCK_SCALED_KINDS:
        out = fp4.grouped_product(self, input, weight, name, offs)
    else:
        codes, scale = ops.quantize_per_token(input, weight.dtype)
        if weight.dtype == torch.int8:
            out = ops.int8_scaled_grouped_mm(
                codes, weight.transpose(-2, -1), scale.squeeze(-1), scales, offs, input.dtype
            )
        else:
            out = torch._scaled_grouped_mm(
                codes, weight.transpose(-2, -1), scale.squeeze(-1), scales, offs=offs, out_dtype=input.dtype
            )
    if bias is not None:
        out.add_(bias)
    return out
