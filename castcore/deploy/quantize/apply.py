"""Quantized weights, activations and KV cache: --weights, --activations, --kv-cache.

``quantize(built, workload, device)`` runs after tensor-parallel sharding, so each weight it quantizes is one
device's shard. It deploys the model as vLLM deploys a quantized checkpoint:

- ``--weights int8|int4|fp8`` alone (weight-only: W8A16, W4A16): every linear layer but the LM head and the
  mixture-of-experts routers holds its weight quantized (see castcore.builtin.quantized_ops: int8 or fp8
  [out, in] with one scale per output channel; int4 packed two per byte, uint8 [out, in / 2], with one scale
  per 128 input columns) and runs one ``castcore::weight_only_linear`` call, which dequantizes the weight in
  registers as Marlin and Machete kernels do: the product runs in the model dtype, and no copy of the weight in
  that dtype is ever written.
- with ``--activations`` of the same dtype (W8A8, FP8): each linear layer quantizes its input per token
  (``castcore::quantize_per_token``), then multiplies fp8 by fp8 with ``torch._scaled_mm``, or int8 by int8 with
  ``castcore::int8_scaled_mm`` (torch._scaled_mm's int8 twin, which torch lacks: CUTLASS's scaled_mm scales the
  int32 accumulators in its epilogue). Under ``--eager`` the int8 product is torch's own ``torch._int_mm``, its
  int32 result written out and scaled by ``castcore::dequantize_int_mm``, as torch runs it without a compiler.
  The products run at the device's int8 or fp8 matrix rate, which the device must have.
- ``--weights nvfp4|mxfp4`` and ``--weights int4 --activations fp8`` (W4A4, W4A8, and mxfp4's weight-only path
  where the device has no FP4 rate): castcore.deploy.quantize.fp4 says how, and why.
- mixture-of-experts weights stored as 3-D Parameters (transformers' grouped-GEMM ``experts`` modules) the same
  way, through ``castcore::weight_only_grouped_mm``, ``torch._scaled_grouped_mm`` (fp8) or
  ``castcore::int8_scaled_grouped_mm`` (torch has no int8 grouped product); the rest of the experts' forward is
  transformers' grouped-GEMM one, whatever experts implementation the model was built with.
- The token embedding, the LM head and MoE routers keep the model dtype, as vLLM keeps them: its quantization
  methods cover linear and fused-MoE layers, the LM head only when a GPTQ/AWQ checkpoint sets lm_head_quantized,
  and routers are built unquantized. (GenZ instead applies one bit width to every operator.) A checkpoint that
  names the modules it leaves unquantized (``modules_to_not_convert``, ModelOpt's ``exclude_modules``; gpt-oss
  quantizes its experts only) keeps those in the model dtype too (castcore.workload.checkpoint.unquantized).
- ``--kv-cache``: a decode step's static cache holds keys and values in that dtype, the new token's cast to it as
  they are written (castcore.hf.cache.decode_inputs); a prefill's cache is counted in it. The fused
  ``castcore::attention`` reads the cache as it is; the eager path (``--eager``) dequantizes it first.

Quantized weights are Parameters of their real dtype and shape, so memory counts their bytes. This module decides
what is quantized and how; castcore.deploy.quantize.layers swaps the layers, castcore.deploy.quantize.kv_cache
the cache.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from castcore.devices.dtypes import dtype_name, torch_dtype
from castcore.hf.layers import is_conv1d
from castcore.options.catalog import any_value, say
from castcore.options.parts import BLOCK_FP8
from castcore.deploy.quantize import fp4
from castcore.workload import checkpoint
from castcore.workload.models import BuiltModel
from castcore.deploy.parallel.tensor_plan import _expert_weights
from castcore.deploy.quantize.kv_cache import quantize_cache
from castcore.deploy.quantize.layers import (
    GROUP_SIZE,
    STORED,
    W8A8,
    WEIGHT_ONLY,
    quantize_experts,
    quantize_linear,
)
from castcore.workload.spec import ModelError, Workload, is_factory, load_model_config

if TYPE_CHECKING:
    from castcore.devices.profile import DeviceProfile

ROUTERS = ("gate", "router", "shared_expert_gate")  # MoE routing linears, kept in the model dtype


def quantize(built: BuiltModel, workload: Workload, device: DeviceProfile | None = None) -> None:
    """Make ``built`` run with the workload's quantized weights, activations and KV cache (in place); its notes
    say what changed. ModelError names the option a model or ``device`` cannot use, and the fix."""
    model_dtype = torch_dtype(workload.dtype)
    weights = _weights(workload, model_dtype)
    cache = torch_dtype(workload.kv_cache) if workload.kv_cache else None
    if cache == model_dtype:
        cache = None
    if weights is None and cache is None:
        return
    if workload.train:
        raise ModelError(
            f"{say('weights')}, {say('activations')} and {say('kv_cache')} price quantized inference; "
            f"drop them with {say('train', True)}"
        )
    if weights is not None:
        _check_device(workload, device)
        paired = fp4.pairing(weights, workload.activations, device)
        w8a8 = paired is None and (workload.activations is not None or weights == BLOCK_FP8)
        shipped = workload.named and not is_factory(workload.model)
        config = load_model_config(workload.model) if shipped else {}
        left = checkpoint.unquantized(workload.model, config) if shipped else ()
        group = (checkpoint.weight_group(workload.model, config) if shipped else None) or GROUP_SIZE
        _quantize_weights(
            built, weights, paired or (W8A8 if w8a8 else WEIGHT_ONLY), workload.fuse, left, group
        )
    if cache is not None:
        quantize_cache(built, workload, cache)


def _weights(workload: Workload, model_dtype: torch.dtype) -> str | None:
    """The --weights to quantize to; None when the weights stay in the model dtype."""
    kind = workload.weights
    if kind in STORED:
        return kind
    if kind is not None and torch_dtype(kind) != model_dtype:
        raise ModelError(
            f"{say('weights', kind)} with {say('dtype', workload.dtype)}: 16-bit weights in another "
            f"dtype than the model's are not a quantization; use {say('dtype', kind)}, or "
            f"{say('weights', any_value('fp8, int8 or int4'))}"
        )
    return None


def _check_device(workload: Workload, device: DeviceProfile | None) -> None:
    """W8A8 runs its products in the quantized dtype: the device's matrix unit must have a rate for it."""
    activations = "fp8" if workload.weights == BLOCK_FP8 else workload.activations
    if activations is None or device is None:
        return
    name = fp4.FP4_RATE if activations == "mxfp4" else dtype_name(activations)
    if name not in device.mma_flops:
        raise ModelError(
            f"{say('activations', workload.activations)}: {device.name} has no {name} matrix rate (its "
            f"matrix unit lists {', '.join(device.mma_flops) or 'none'}); drop {say('activations')} for "
            f"weight-only quantization, whose products run in {workload.dtype}, or choose another "
            f"{say('device')}"
        )


# --- weights ---------------------------------------------------------------------------------------------


def _quantize_weights(
    built: BuiltModel, kind: str, quantization: str, fused: bool, left: tuple[str, ...], group: int
) -> None:
    model = built.model
    if not isinstance(model, nn.Module):
        raise ModelError(
            f"{say('weights', kind)}: the workload is a function, not an nn.Module; castcore quantizes "
            f"a module's linear layers (pass the module, or drop {say('weights')})"
        )
    kept, model_dtype = _kept_whole(model), _float_dtype(model)
    linears = experts = unlisted = 0
    for path, module in list(model.named_modules()):
        if id(module) in kept:
            continue
        if checkpoint.listed(path, left) or _merged_part_listed(path, left):
            unlisted += _is_linear(module)
        elif _expert_weights(module):
            quantize_experts(module, path, kind, quantization, group)
            experts += 1
        elif _is_linear(module) and path.rpartition(".")[2] not in ROUTERS:
            quantize_linear(module, kind, quantization, fused, group)
            linears += 1
    if not linears and not experts:
        raise ModelError(
            f"{say('weights', kind)}: {type(model).__name__} has no linear layers (nn.Linear) or "
            f"mixture-of-experts weights to quantize; drop {say('weights')}"
        )
    note = _weights_note(kind, quantization, fused, linears, experts, model_dtype, group)
    built.notes.append(
        note
        + (
            f"; {unlisted} more linear layers stay {model_dtype}, as the checkpoint leaves them unquantized"
            if unlisted
            else ""
        )
    )


def _merged_part_listed(path: str, left: tuple[str, ...]) -> bool:
    """castcore's merged ``qkv_proj`` (castcore.deploy.kernels.qkv) stays in the model dtype when the checkpoint
    leaves any of q, k, v so: an engine's merged layer holds one format."""
    parent, _, leaf = path.rpartition(".")
    return leaf == "qkv_proj" and any(
        checkpoint.listed(f"{parent}.{part}", left) for part in ("q_proj", "k_proj", "v_proj")
    )


def _weights_note(
    kind: str, quantization: str, fused: bool, linears: int, experts: int, model_dtype: str, group: int
) -> str:
    held = f"{linears} linear layers" + (f" and {experts} mixture-of-experts weight sets" if experts else "")
    tail = f"the embedding, LM head and MoE routers stay {model_dtype}, as vLLM keeps them"
    if kind in fp4.FORMATS or quantization in fp4.BLOCK_SCALED_KINDS:
        layout, how, said = fp4.describe(
            kind, quantization if quantization in fp4.BLOCK_SCALED_KINDS else None, experts, model_dtype
        )
        return f"--weights {kind}{said}: {held} hold {layout}; {how}; {tail}"
    w8a8 = quantization == W8A8
    layout = {
        "int8": "int8 with per-channel scales",
        "fp8": "fp8 (e4m3) with per-channel scales",
        BLOCK_FP8: f"fp8 (e4m3) with a scale per {GROUP_SIZE}x{GROUP_SIZE} block",
        "int4": f"int4, two per byte, with a scale per {group} input columns",
    }[kind]
    if not w8a8:
        how = (
            f"castcore::weight_only_linear{', castcore::weight_only_grouped_mm' if experts else ''} dequantize in "
            f"registers, products in {model_dtype}"
        )
    elif kind == "int8":
        how = (
            "activations quantized per token (castcore::quantize_per_token), int8 products by "
            + (
                "castcore::int8_scaled_mm, scaled in its epilogue"
                if fused
                else "torch._int_mm, whose int32 result castcore::dequantize_int_mm scales (--eager)"
            )
            + (", experts by castcore::int8_scaled_grouped_mm" if experts else "")
        )
    elif kind == BLOCK_FP8:
        how = (
            f"activations quantized per 1x{GROUP_SIZE} group (castcore::quantize_per_token_group), fp8 products "
            "with block-wise scales by torch._scaled_mm"
            + (
                ", the experts' by torch._scaled_grouped_mm with per-token and per-channel scales"
                if experts
                else ""
            )
        )
    else:
        how = (
            "activations quantized per token (castcore::quantize_per_token), fp8 products by torch._scaled_mm"
            + (" and torch._scaled_grouped_mm" if experts else "")
        )
    activations = f" --activations {kind}" if w8a8 and kind != BLOCK_FP8 else ""
    return f"--weights {kind}{activations}: {held} hold {layout}; {how}; {tail}"


def _float_dtype(model: nn.Module) -> str:
    """The dtype the model computes in: its first floating-point parameter's (a user's module may not be --dtype's)."""
    found = next((p.dtype for p in model.parameters() if p.is_floating_point()), None)
    return dtype_name(found) if found is not None else "the model dtype"


def _kept_whole(model: nn.Module) -> set[int]:
    """The token embedding and the LM head: they keep the model dtype."""
    found = set()
    for getter in ("get_input_embeddings", "get_output_embeddings"):
        try:
            module = getattr(model, getter)() if hasattr(model, getter) else None
        except (AttributeError, NotImplementedError):  # transformers' default for a model without one
            module = None
        if module is not None:
            found.add(id(module))
    return found


def _is_linear(module: nn.Module) -> bool:
    """nn.Linear, or transformers' Conv1D (GPT-2's linear layers, weight stored [in, out])."""
    return isinstance(module, nn.Linear) or is_conv1d(module)
