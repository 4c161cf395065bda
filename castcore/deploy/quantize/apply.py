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

Quantized weights are Parameters of their real dtype and shape, so memory counts their bytes.
"""

from __future__ import annotations

import functools
import math
import types
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from castcore.builtin import quantized_ops  # noqa: F401  (defines the torch.ops.castcore quantized ops)
from castcore.devices.dtypes import dtype_name, torch_dtype
from castcore.recording.dtensor import dtensor_type
from castcore.hf.cache import cast_on_write
from castcore.hf.layers import experts_grouped_forward, is_conv1d
from castcore.options.catalog import any_value, say
from castcore.options.parts import BLOCK_FP8
from castcore.deploy.quantize import fp4
from castcore.workload import checkpoint
from castcore.workload.models import BuiltModel
from castcore.deploy.parallel.tensor_plan import EXPERT_WEIGHTS, _expert_weights
from castcore.workload.spec import ModelError, Workload, is_factory, load_model_config

if TYPE_CHECKING:
    from castcore.devices.profile import DeviceProfile

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
ROUTERS = ("gate", "router", "shared_expert_gate")  # MoE routing linears, kept in the model dtype
WEIGHT_ONLY, W8A8 = "weight-only", "w8a8"


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
        left = (
            checkpoint.unquantized(workload.model, load_model_config(workload.model))
            if (workload.named and not is_factory(workload.model))
            else ()
        )
        _quantize_weights(built, weights, paired or (W8A8 if w8a8 else WEIGHT_ONLY), workload.fuse, left)
    if cache is not None:
        _quantize_cache(built, workload, cache)


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
    name = dtype_name(activations)
    if name not in device.mma_flops:
        raise ModelError(
            f"{say('activations', workload.activations)}: {device.name} has no {name} matrix rate (its "
            f"matrix unit lists {', '.join(device.mma_flops) or 'none'}); drop {say('activations')} for "
            f"weight-only quantization, whose products run in {workload.dtype}, or choose another "
            f"{say('device')}"
        )


# --- weights ---------------------------------------------------------------------------------------------


def _quantize_weights(
    built: BuiltModel, kind: str, quantization: str, fused: bool, left: tuple[str, ...]
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
        if checkpoint.listed(path, left):
            unlisted += _is_linear(module)
        elif _expert_weights(module):
            _quantize_experts(module, path, kind, quantization)
            experts += 1
        elif _is_linear(module) and path.rpartition(".")[2] not in ROUTERS:
            _quantize_linear(module, kind, quantization, fused)
            linears += 1
    if not linears and not experts:
        raise ModelError(
            f"{say('weights', kind)}: {type(model).__name__} has no linear layers (nn.Linear) or "
            f"mixture-of-experts weights to quantize; drop {say('weights')}"
        )
    note = _weights_note(kind, quantization, fused, linears, experts, model_dtype)
    built.notes.append(
        note
        + (
            f"; {unlisted} more linear layers stay {model_dtype}, as the checkpoint's "
            "modules_to_not_convert says"
            if unlisted
            else ""
        )
    )


def _weights_note(
    kind: str, quantization: str, fused: bool, linears: int, experts: int, model_dtype: str
) -> str:
    held = f"{linears} linear layers" + (f" and {experts} mixture-of-experts weight sets" if experts else "")
    tail = f"the embedding, LM head and MoE routers stay {model_dtype}, as vLLM keeps them"
    if kind in fp4.FORMATS or quantization == fp4.BLOCK_SCALED:
        layout, how, said = fp4.describe(
            kind, quantization if quantization == fp4.BLOCK_SCALED else None, experts, model_dtype
        )
        return f"--weights {kind}{said}: {held} hold {layout}; {how}; {tail}"
    w8a8 = quantization == W8A8
    layout = {
        "int8": "int8 with per-channel scales",
        "fp8": "fp8 (e4m3) with per-channel scales",
        BLOCK_FP8: f"fp8 (e4m3) with a scale per {GROUP_SIZE}x{GROUP_SIZE} block",
        "int4": f"int4, two per byte, with a scale per {GROUP_SIZE} input columns",
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


def _codes(
    out_features: int,
    in_features: int,
    kind: str,
    w8a8: bool,
    dtype: torch.dtype,
    device: Any,
    experts: int | None = None,
) -> tuple[nn.Parameter, nn.Parameter, int]:
    """(quantized weight, its scales, input columns per scale) for an [out, in] weight, or [experts, out, in]."""
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
        group = GROUP_SIZE
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


def _quantize_linear(module: nn.Module, kind: str, quantization: str, fused: bool) -> None:
    """Swap the layer's weight for its quantized codes and scales, and its forward for the quantized product.
    The module itself stays, so hooks on it (parallelize_module's input and output layouts) keep working."""
    weight = module.weight
    local = _local(weight)
    out_features, in_features = local.shape if isinstance(module, nn.Linear) else local.shape[::-1]
    placements = _output_placements(weight)
    module.qweight, module.weight_scale, module.group_size = _codes(
        out_features, in_features, kind, quantization == W8A8, local.dtype, local.device
    )
    fp4.per_tensor_scales(module, "", kind, local.device)
    del module.weight
    if module.bias is not None and module.bias is not _local(
        module.bias
    ):  # one device's bias, a plain tensor
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
    if self.quantization == fp4.BLOCK_SCALED:  # W4A4, W4A8
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


def _quantize_experts(module: nn.Module, path: str, kind: str, quantization: str) -> None:
    """Each 3-D expert weight held quantized as [experts, out, in'] (however transformers laid it out), with its
    scales as ``<name>_scale``; the forward is the module's grouped-GEMM one with the quantized products."""
    base = _experts_base_forward(module)
    if base is None or not set(GROUPED_PRODUCTS) & set(base.__code__.co_names):
        raise ModelError(
            f"{say('weights', kind)}: {path} holds mixture-of-experts weights that castcore cannot "
            f"quantize (not a transformers grouped-GEMM experts module); drop {say('weights')}"
        )
    transposed = bool(
        getattr(module, "is_transposed", False)
    )  # [experts, in, out] rather than [experts, out, in]
    for name in _expert_weights(module):
        param = getattr(module, name)
        experts, rows, columns = param.shape
        out_features, in_features = (columns, rows) if transposed else (rows, columns)
        codes, scales, group = _codes(
            out_features, in_features, kind, quantization == W8A8, param.dtype, param.device, experts
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
    elif self.quantization == fp4.BLOCK_SCALED:
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


# --- KV cache --------------------------------------------------------------------------------------------


def _quantize_cache(built: BuiltModel, workload: Workload, dtype: torch.dtype) -> None:
    option = f"--kv-cache {workload.kv_cache}"  # for the notes
    if built.inputs_fn is not None:  # a decode step: the static cache among its inputs
        with_dtype = getattr(built.inputs_fn, "with_cache_dtype", None)
        built.inputs_fn = (
            with_dtype(dtype)
            if with_dtype is not None
            else _recast_cache(built.inputs_fn, dtype, workload.kv_cache)
        )
        built.notes.append(
            f"{option}: the decode step's static KV cache holds keys and values in {dtype_name(dtype)}, "
            "the new token's cast to it as they are written"
            + ("" if workload.fuse else "; eager attention dequantizes the whole cache first")
        )
    elif built.config is not None and (workload.named or built.kv_cache_shape is not None):
        batch, seq, _ = built.kv_cache_shape or (workload.batch, workload.seq, dtype)
        built.kv_cache_shape = (batch, seq, dtype)
        built.notes.append(f"{option}: the KV cache this prefill fills is counted in {dtype_name(dtype)}")
    else:
        raise ModelError(
            f"{say('kv_cache', workload.kv_cache)}: castcore finds no KV cache in this workload (no "
            f"transformers config, no cache among its inputs); drop {say('kv_cache')}"
        )


def _recast_cache(inner: Any, dtype: torch.dtype, kind: str) -> Any:
    """``inner`` (an inputs_fn another step wrapped, e.g. to cut the batch) with the static KV caches it makes
    re-made in ``dtype``, each layer casting the new token's keys and values as it writes them; ``kind`` is the
    kv_cache option's value, which a refusal names."""

    def make():
        args, kwargs = inner()
        layers = [
            layer
            for value in (*args, *kwargs.values())
            for layer in getattr(value, "layers", None) or ()
            if isinstance(getattr(layer, "keys", None), torch.Tensor)
            and hasattr(layer, "lazy_initialization")
        ]
        if not layers:
            raise ModelError(
                f"{say('kv_cache', kind)}: this workload's inputs hold no static KV cache to keep in "
                f"another dtype; drop {say('kv_cache')}"
            )
        for layer in layers:
            layer.lazy_initialization(
                layer.keys.narrow(2, 0, 0).to(dtype), layer.values.narrow(2, 0, 0).to(dtype)
            )
            layer.__class__ = cast_on_write(type(layer))
        return args, kwargs

    return make
