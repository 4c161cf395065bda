"""Matrix products on the Cube unit: base blocks over the AI cores, each padded to whole fractals.

The Cube multiplies 16 x K0 by K0 x 16 fractals (the profile's ``mma_unit``; K0 = 32 bytes of the input
dtype: 16 for fp16/bf16, 32 for int8, 8 for fp32). A CANN matmul kernel cuts the M x N output into base
blocks (the profile's ``mma_tile``, e.g. 128 x 256 x 64 for fp16), gives each AI core one block at a time and
steps through K: ``pack.tiled_matmul`` prices that (waves over ``compute_units``, the last one part-empty;
split-K for skinny products; the fastest of the profile's blocks). A block is a whole number of fractals, so
padding to the block includes the fractal padding. A profile or dtype without blocks pays for whole fractals
only: cube ops = 2 * batch * M' * K' * N'. HBM traffic is the real tensors (the padding happens in L1/L0
through the ND-to-NZ move, never in HBM). The bias of addmm/linear is added in the Cube's fixpipe on its way
out, so it costs bytes, not vector work.
"""

from __future__ import annotations

import math

import torch

from castcore import pack

from .hardware import padded_mkn, timed

aten = torch.ops.aten
DEVICES = "ascend-*"


def cube_estimate(invoke: pack.OpInvoke, device: pack.DeviceProfile, a, b_shape: tuple[int, ...],
                  batch: int) -> pack.Estimate:
    """``a`` (..., M, K) times a (K, N) operand of ``b_shape``; ``batch`` independent products."""
    m, k = (a.shape[-2] if a.dim() >= 2 else 1), a.shape[-1]
    n = b_shape[-1]
    mp, kp, np_ = padded_mkn(m, k, n, a.dtype, device)
    real, padded = 2 * batch * m * k * n, 2 * batch * mp * kp * np_
    detail = {"shape": f"{batch}x{m}x{k}x{n}" if batch > 1 else f"{m}x{k}x{n}",
              "padded_shape": f"{batch}x{mp}x{kp}x{np_}" if batch > 1 else f"{mp}x{kp}x{np_}"}
    tiled = _blocks(device, a.dtype, batch, m, n, k)
    if tiled is not None:
        # Cube work the kernel's time pays for: every core busy for every wave, a part-empty last one included.
        padded = tiled[0] * tiled[1]
        detail.update(tiled[2])
    detail.update({"cube_ops": padded, "useful_ops": real, "padding_waste": (1 - real / padded) if padded else 0.0})
    props = invoke.memory_access_properties()
    return timed(device, cube={a.dtype: padded}, read_bytes=props.memory_read_bytes,
                 write_bytes=props.memory_write_bytes, detail=detail)


def _blocks(device: pack.DeviceProfile, dtype: torch.dtype, batch: int, m: int, n: int,
            k: int) -> tuple[float, float, dict] | None:
    """(Cube seconds, sustained op/s, how) of the product as base blocks over the AI cores; None when the
    profile has no blocks for ``dtype`` or the Cube does not run it (the 310P's bf16)."""
    if pack.dtype_name(dtype) not in device.mma_flops:
        return None
    rate = device.rate("mma", dtype)[0] * device.compute_efficiency  # as hardware.timed sustains it
    tiled = pack.tiled_matmul(device, dtype, batch, m, n, k, rate)
    if tiled is None:
        return None
    seconds, how = tiled
    return seconds, rate, {"tile": how["tile"], "tiles": how["tiles"], "waves": how["waves"],
                           "split_k": how["split_k"]}


@pack.register_op_estimator(aten.mm.default, device=DEVICES)
def mm(invoke, device):
    a, b = invoke.args[:2]
    return cube_estimate(invoke, device, a, b.shape, 1)


@pack.register_op_estimator(aten.addmm.default, device=DEVICES)
def addmm(invoke, device):
    a, b = invoke.args[1:3]
    return cube_estimate(invoke, device, a, b.shape, 1)


@pack.register_op_estimator(aten.bmm.default, device=DEVICES)
def bmm(invoke, device):
    a, b = invoke.args[:2]
    return cube_estimate(invoke, device, a, b.shape, a.shape[0])


@pack.register_op_estimator(aten.baddbmm.default, device=DEVICES)
def baddbmm(invoke, device):
    a, b = invoke.args[1:3]
    return cube_estimate(invoke, device, a, b.shape, a.shape[0])


@pack.register_op_estimator(aten.linear.default, device=DEVICES)
def linear(invoke, device):
    # x (..., K) @ weight.T (K, N): the leading dims of x are one M.
    x, weight = invoke.args[:2]
    rows = math.prod(x.shape[:-1])
    flat = pack.TensorMeta(shape=(rows, x.shape[-1]), dtype=x.dtype)
    return cube_estimate(invoke, device, flat, (weight.shape[-1], weight.shape[0]), 1)


@pack.register_op_estimator(aten.matmul.default, device=DEVICES)
def matmul(invoke, device):
    a, b = invoke.args[:2]
    out = invoke.outputs()[0]
    if a.dim() < 2 or b.dim() < 2:  # a vector product: one row or one column
        a2 = pack.TensorMeta(shape=(1, a.shape[-1]) if a.dim() == 1 else a.shape, dtype=a.dtype)
        n = b.shape[-1] if b.dim() >= 2 else 1
        batch = math.prod(out.shape[:-2]) if out.dim() > 2 else 1
        return cube_estimate(invoke, device, a2, (a.shape[-1], n), batch)
    batch = math.prod(out.shape[:-2]) if out.dim() > 2 else 1
    return cube_estimate(invoke, device, a, b.shape, batch)


# W8A8 int8 as vllm-ascend's W8A8_DYNAMIC runs it: torch_npu.npu_dynamic_quant gives each token an int8 row and a
# scale, torch_npu.npu_quant_matmul multiplies int8 fractals on the Cube and applies both scales in the fixpipe.
@pack.register_op_estimator(torch.ops.castcore.int8_scaled_mm.default, device=DEVICES)
def int8_scaled_mm(invoke, device):
    a, b = invoke.args[:2]
    return cube_estimate(invoke, device, a, b.shape, 1)
