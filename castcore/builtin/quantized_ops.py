"""The core's device-neutral quantized operators: what a serving engine runs for a quantized checkpoint.

Each is a ``torch.library`` custom op in the ``castcore`` namespace with a reference implementation (what the
kernel computes, on real tensors) and a fake one (so it captures on the meta device as one call). Their work is
counted in ``castcore.builtin.formulas.quantized``; ``castcore.deploy.quantize.layers`` makes models call them.

Weight layouts (``qweight`` [out, in'] for a linear layer, [experts, out, in'] for MoE experts):

- int8: int8 [out, in], code q in -127..127;
- int4: packed two per byte, uint8 [out, in / 2], input column 2j in the low nibble and 2j + 1 in the high
  one, each stored as q + 8 for q in -8..7 (symmetric, no zero points, as GPTQ-for-Marlin);
- fp8: float8_e4m3fn [out, in]; fp8-block the same, with one scale per 128 x 128 block ([ceil(out / 128),
  ceil(in / 128)]), its activations quantized per 1 x 128 group (``quantize_per_token_group``) for
  torch._scaled_mm's block-wise scaling.

- nvfp4 and mxfp4: E2M1 codes packed two per byte, float4_e2m1fn_x2 [out, in / 2], input column 2j in the low
  nibble and 2j + 1 in the high one (as gpt-oss's checkpoint and torch's own packing store them); each nibble is
  sign, two exponent bits and one mantissa bit (``E2M1``). nvfp4 has one float8_e4m3fn scale per 16 input
  columns and fp32 per-tensor scales; mxfp4 one float8_e8m0fnu (a power of two) per 32.

``scales`` [out, groups] (or [experts, out, groups]) hold one scale per ``group_size`` input columns; one
group per row is a per-channel scale. The weight is ``q * scale``.

``block_scaled_mm`` and ``block_scaled_grouped_mm`` multiply quantized activations (``quantize_blocks``, or
``quantize_per_token``) by quantized weights, each operand's scales applied per block of input columns: NVFP4 x
NVFP4, MXFP8 x MXFP4, and fp8 x int4 (W4A8).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

INT4_OFFSET = 8  # an int4 code q in -8..7 is stored as the nibble q + 8
FP4 = torch.float4_e2m1fn_x2
# The value of each E2M1 nibble: bit 3 the sign, bits 2-1 the exponent (bias 1), bit 0 the mantissa; exponent 0 is
# subnormal (0 and 0.5). OCP Microscaling Formats (MX) Specification v1.0, section 5.3.3 (FP4 E2M1), 2023-09.
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def _nibbles(packed: torch.Tensor) -> torch.Tensor:
    packed = packed.view(torch.uint8)
    return torch.stack((packed & 0xF, packed >> 4), dim=-1).flatten(-2)


def dequantize(
    qweight: torch.Tensor, scales: torch.Tensor, group_size: int, dtype: torch.dtype
) -> torch.Tensor:
    """The weight a quantized ``qweight`` stands for, [..., out, in] in ``dtype``."""
    if qweight.dtype == torch.uint8:  # two int4 codes per byte
        codes = _nibbles(qweight).to(torch.int16) - INT4_OFFSET
    elif qweight.dtype == FP4:  # two E2M1 codes per byte
        codes = torch.tensor(E2M1, device=qweight.device)[_nibbles(qweight).long()]
    else:
        codes = qweight
    columns = codes.shape[-1]
    scale = scales.float().repeat_interleave(group_size, dim=-1)[..., :columns]
    return (codes.float() * scale).to(dtype)


def in_features(qweight: torch.Tensor) -> int:
    """The input columns a quantized weight stands for: two per byte for packed int4 and fp4."""
    return qweight.shape[-1] * (2 if qweight.dtype in (torch.uint8, FP4) else 1)


def _check_columns(x: torch.Tensor, qweight: torch.Tensor) -> None:
    torch._check(
        x.shape[-1] == in_features(qweight),
        lambda: (
            f"x has {x.shape[-1]} columns but the quantized "
            f"weight {tuple(qweight.shape)} ({qweight.dtype}) takes {in_features(qweight)}"
        ),
    )


@torch.library.custom_op("castcore::weight_only_linear", mutates_args=())
def weight_only_linear(
    x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, group_size: int, bias: torch.Tensor | None
) -> torch.Tensor:
    """x @ dequantize(qweight)^T + bias in x's dtype, the weight dequantized tile by tile in registers (Marlin,
    Machete, AWQ kernels): no copy of the weight in x's dtype is ever written to memory."""
    return F.linear(x, dequantize(qweight, scales, group_size, x.dtype), bias)


@weight_only_linear.register_fake
def _(x, qweight, scales, group_size, bias):
    _check_columns(x, qweight)
    return x.new_empty((*x.shape[:-1], qweight.shape[0]))


def _groups(offs: torch.Tensor) -> list[tuple[int, int]]:
    """(start, end) rows of each expert from a grouped matmul's cumulative offsets."""
    ends = offs.tolist()
    return list(zip([0, *ends[:-1]], ends))


@torch.library.custom_op("castcore::weight_only_grouped_mm", mutates_args=())
def weight_only_grouped_mm(
    x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, offs: torch.Tensor, group_size: int
) -> torch.Tensor:
    """Mixture-of-experts rows x [rows, in], sorted by expert, times each expert's dequantized weight
    (qweight [experts, out, in']); ``offs`` are the cumulative row counts per expert (torch._grouped_mm's)."""
    out = x.new_zeros((x.shape[0], qweight.shape[1]))
    for expert, (start, end) in enumerate(_groups(offs)):
        if end > start:
            out[start:end] = F.linear(
                x[start:end], dequantize(qweight[expert], scales[expert], group_size, x.dtype)
            )
    return out


@weight_only_grouped_mm.register_fake
def _(x, qweight, scales, offs, group_size):
    _check_columns(x, qweight)
    return x.new_empty((x.shape[0], qweight.shape[1]))


def _code_max(dtype: torch.dtype) -> float:
    return 127.0 if dtype == torch.int8 else torch.finfo(dtype).max


@torch.library.custom_op("castcore::quantize_per_token", mutates_args=())
def quantize_per_token(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic per-token quantization of activations x [..., in] to int8 or fp8: one scale per row (its largest
    magnitude over the code range), fp32 [..., 1], and the codes x / scale, in one kernel (vLLM's
    dynamic_scaled_int8_quant / dynamic_per_token_scaled_fp8_quant)."""
    scale = x.abs().amax(-1, keepdim=True).float().clamp(min=1e-12) / _code_max(dtype)
    codes = x.float() / scale
    if dtype == torch.int8:
        codes = codes.round().clamp(-128, 127)
    return codes.to(dtype), scale


@quantize_per_token.register_fake
def _(x, dtype):
    return x.new_empty(x.shape, dtype=dtype), x.new_empty((*x.shape[:-1], 1), dtype=torch.float32)


@torch.library.custom_op("castcore::quantize_per_token_group", mutates_args=())
def quantize_per_token_group(
    x: torch.Tensor, group: int, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic quantization of activations x [rows, in] with one scale per ``group`` columns of each row (the
    1 x 128 groups of DeepSeek-V3's fp8 checkpoints, vLLM's per_token_group_quant_fp8) -> (codes [rows, in],
    fp32 scales [rows, ceil(in / group)]), in one kernel."""
    rows, columns = x.shape
    padded = F.pad(x.float(), (0, -columns % group)).view(rows, -1, group)
    scale = padded.abs().amax(-1, keepdim=True).clamp(min=1e-12) / _code_max(dtype)
    codes = (padded / scale).view(rows, -1)[:, :columns]
    if dtype == torch.int8:
        codes = codes.round().clamp(-128, 127)
    return codes.to(dtype), scale.squeeze(-1)


@quantize_per_token_group.register_fake
def _(x, group, dtype):
    return x.new_empty(x.shape, dtype=dtype), x.new_empty(
        (x.shape[0], -(-x.shape[1] // group)), dtype=torch.float32
    )


@torch.library.custom_op("castcore::int8_scaled_mm", mutates_args=())
def int8_scaled_mm(
    a: torch.Tensor,
    b: torch.Tensor,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """torch._scaled_mm for int8, which torch lacks (CUTLASS's scaled_mm, vLLM's cutlass_scaled_mm): a [rows, in]
    int8 times b [in, out] int8, the int32 accumulators scaled per row (scale_a [rows, 1]) and per channel
    (scale_b [1, out]) and the bias added in the product's epilogue, written once in ``out_dtype``."""
    return dequantize_int_mm(a.long() @ b.long(), scale_a, scale_b, bias, out_dtype)


@int8_scaled_mm.register_fake
def _(a, b, scale_a, scale_b, bias, out_dtype):
    torch._check(
        a.dim() == 2 and b.dim() == 2 and a.shape[1] == b.shape[0],
        lambda: f"int8_scaled_mm takes [rows, in] x [in, out], got {tuple(a.shape)} x {tuple(b.shape)}",
    )
    return a.new_empty((a.shape[0], b.shape[1]), dtype=out_dtype)


@torch.library.custom_op("castcore::dequantize_int_mm", mutates_args=())
def dequantize_int_mm(
    acc: torch.Tensor,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor,
    bias: torch.Tensor | None,
    dtype: torch.dtype,
) -> torch.Tensor:
    """The epilogue of an int8 product (torch._int_mm): int32 accumulators [rows, out] times the per-token scales
    [rows, 1] and the per-channel weight scales [1, out], plus the bias, in ``dtype``."""
    out = acc.double() * scale_a * scale_b
    if bias is not None:
        out = out + bias.float()
    return out.to(dtype)


@dequantize_int_mm.register_fake
def _(acc, scale_a, scale_b, bias, dtype):
    return acc.new_empty(acc.shape, dtype=dtype)


@torch.library.custom_op("castcore::int8_scaled_grouped_mm", mutates_args=())
def int8_scaled_grouped_mm(
    a: torch.Tensor,
    b: torch.Tensor,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor,
    offs: torch.Tensor,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """torch._scaled_grouped_mm for int8, which torch lacks: rows a [rows, in] int8 sorted by expert times
    b [experts, in, out] int8, scaled per row (scale_a [rows]) and per expert channel (scale_b [experts, out])."""
    out = torch.zeros((a.shape[0], b.shape[-1]), dtype=out_dtype, device=a.device)
    for expert, (start, end) in enumerate(_groups(offs)):
        if end > start:
            acc = a[start:end].long() @ b[expert].long()
            out[start:end] = (acc.double() * scale_a[start:end, None] * scale_b[expert]).to(out_dtype)
    return out


@int8_scaled_grouped_mm.register_fake
def _(a, b, scale_a, scale_b, offs, out_dtype):
    torch._check(
        a.shape[-1] == b.shape[-2],
        lambda: f"a has {a.shape[-1]} columns but b {tuple(b.shape)} takes {b.shape[-2]}",
    )
    return a.new_empty((a.shape[0], b.shape[-1]), dtype=out_dtype)


@torch.library.custom_op("castcore::quantize_blocks", mutates_args=())
def quantize_blocks(
    x: torch.Tensor,
    dtype: torch.dtype,
    block: int,
    scale_dtype: torch.dtype,
    global_scale: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic quantization of activations x [rows, in] with one ``scale_dtype`` scale per ``block`` columns of a
    row, in one kernel -> (codes [rows, in] in ``dtype``, or packed fp4 [rows, in / 2]; scales [rows, in / block]).
    NVFP4: fp4, 16 columns, float8_e4m3fn scales over the per-tensor ``global_scale`` (vLLM's scaled_fp4_quant);
    MX: fp8 or fp4, 32 columns, float8_e8m0fnu scales, each block's amax rounded up to a power of two."""
    rows, columns = x.shape
    top = 6.0 if dtype == FP4 else torch.finfo(dtype).max
    blocks = x.float().view(rows, columns // block, block) / (1.0 if global_scale is None else global_scale)
    scale = (blocks.abs().amax(-1, keepdim=True) / top).clamp(min=2.0**-126)
    if scale_dtype == torch.float8_e8m0fnu:
        scale = torch.exp2(torch.ceil(torch.log2(scale)))
    scale = scale.to(scale_dtype)
    values = (blocks / scale.float()).view(rows, columns)
    if dtype != FP4:
        return values.to(dtype), scale.squeeze(-1)
    nearest = (values.abs().unsqueeze(-1) - torch.tensor(E2M1[:8], device=x.device)).abs().argmin(-1)
    nibbles = (nearest | (values < 0).long() << 3).to(torch.uint8)
    return (nibbles[:, 0::2] | nibbles[:, 1::2] << 4).view(FP4), scale.squeeze(-1)


@quantize_blocks.register_fake
def _(x, dtype, block, scale_dtype, global_scale):
    torch._check(x.shape[-1] % block == 0, lambda: f"{x.shape[-1]} columns are not whole blocks of {block}")
    codes = (x.shape[0], x.shape[1] // (2 if dtype == FP4 else 1))
    return x.new_empty(codes, dtype=dtype), x.new_empty((x.shape[0], x.shape[1] // block), dtype=scale_dtype)


def _block_scaled(a, b, scale_a, scale_b, group, alpha):
    x = dequantize(a, scale_a, in_features(a) // scale_a.shape[-1], torch.float32)
    out = x @ dequantize(b, scale_b, group, torch.float32).T
    return out if alpha is None else out * alpha


@torch.library.custom_op("castcore::block_scaled_mm", mutates_args=())
def block_scaled_mm(
    a: torch.Tensor,
    b: torch.Tensor,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor,
    group: int,
    alpha: torch.Tensor | None,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """Quantized activations a [rows, in'] (scale_a [rows, blocks]) times quantized weights b [out, in']
    (scale_b [out, in / group]) transposed, each scale applied to its block of input columns inside the product
    (CUTLASS's block-scaled GEMMs on Blackwell; TensorRT-LLM's and vLLM's W4A8 kernels convert int4 weights to fp8
    in registers), then times ``alpha`` (NVFP4's per-tensor scales) plus the bias, written once in out_dtype."""
    out = _block_scaled(a, b, scale_a, scale_b, group, alpha)
    return (out if bias is None else out + bias.float()).to(out_dtype)


@block_scaled_mm.register_fake
def _(a, b, scale_a, scale_b, group, alpha, bias, out_dtype):
    torch._check(
        in_features(a) == in_features(b),
        lambda: (
            f"a {tuple(a.shape)} ({a.dtype}) and b {tuple(b.shape)} ({b.dtype}) hold different input columns"
        ),
    )
    return a.new_empty((a.shape[0], b.shape[0]), dtype=out_dtype)


@torch.library.custom_op("castcore::block_scaled_grouped_mm", mutates_args=())
def block_scaled_grouped_mm(
    a: torch.Tensor,
    b: torch.Tensor,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor,
    group: int,
    alpha: torch.Tensor | None,
    offs: torch.Tensor,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """block_scaled_mm for mixture-of-experts rows a [rows, in'] sorted by expert against b [experts, out, in']
    (scale_b [experts, out, in / group], alpha [experts]); ``offs`` are the cumulative rows per expert."""
    out = torch.zeros((a.shape[0], b.shape[1]), dtype=out_dtype, device=a.device)
    for expert, (start, end) in enumerate(_groups(offs)):
        if end > start:
            out[start:end] = _block_scaled(
                a[start:end],
                b[expert],
                scale_a[start:end],
                scale_b[expert],
                group,
                None if alpha is None else alpha[expert],
            ).to(out_dtype)
    return out


@block_scaled_grouped_mm.register_fake
def _(a, b, scale_a, scale_b, group, alpha, offs, out_dtype):
    torch._check(
        in_features(a) == in_features(b),
        lambda: (
            f"a {tuple(a.shape)} ({a.dtype}) and b {tuple(b.shape)} ({b.dtype}) hold different input columns"
        ),
    )
    return a.new_empty((a.shape[0], b.shape[1]), dtype=out_dtype)


OPS = {
    name: getattr(torch.ops.castcore, name).default
    for name in (
        "weight_only_linear",
        "weight_only_grouped_mm",
        "quantize_per_token",
        "quantize_per_token_group",
        "int8_scaled_mm",
        "dequantize_int_mm",
        "int8_scaled_grouped_mm",
        "quantize_blocks",
        "block_scaled_mm",
        "block_scaled_grouped_mm",
    )
}
