"""Mixture-of-experts blocks as AITER's fused MoE runs them on AMD Instinct GPUs.

vLLM and SGLang on ROCm run a routed-experts block through AITER's ``fused_moe`` (ROCm/aiter, aiter/fused_moe.py,
read 2026-11-29), not the sort-copy / product / activation / product / combine chain castcore's deployed kernels
capture (castcore.deploy.kernels.moe, as vLLM's CUDA path runs it). AITER's form:

- ``moe_sorting``: one kernel reads the top-k ids and weights, writes the (token, k) pairs' ids and weights sorted
  by expert, and zeroes the block's output buffer. No hidden row is copied: the first stage gathers its rows
  through the sorted ids.
- stage 1: the gate and up products with the activation in their epilogue, writing ``inter_dim`` per pair.
- stage 2: the down product, each pair's row scaled by its router weight and added into the zeroed output.

So on these devices the captured ``castcore::moe_permute`` is priced as the sort (the ids and weights, and the
output buffer's zeroing), and the activation and ``castcore::moe_unpermute`` as the epilogues they are: no kernel
and no time of their own. Only ops castcore marks as one fused kernel's parts (``attrs["fused_moe"]``,
castcore.recording.routing) are repriced: under a dispatch over expert parallelism the sort and combine move rows
over the network and keep the core's pricing, as does anything unmarked.

Left as castcore counts it: stage 1's output is written at the product's width (gate and up), twice what AITER
writes, and the products are not padded to AITER's 32-, 64- or 128-row blocks per expert.
"""

from __future__ import annotations

import math

import torch

from castcore import pack

DEVICES = "mi3*"  # the MI300 series and MI355X: the GPUs AITER's kernels are built for (gfx942, gfx950)
ops = torch.ops.castcore  # castcore's deployed-kernel operators
SORTED_ID_BYTES = 4 + 4  # each sorted pair: its int32 token-and-slot id and its fp32 router weight


def _fused(invoke) -> bool:
    return bool(invoke.attrs.get("fused_moe"))


def _epilogue(kernel: str) -> pack.Estimate:
    return pack.Estimate(time_s=0.0, bound="none", detail={"fused_into": f"AITER fused_moe {kernel}"})


@pack.register_op_estimator(ops.moe_permute.default, device=DEVICES)
def moe_sorting(invoke, device):
    """AITER's moe_sorting: the ids and weights read and written sorted, the output buffer zeroed."""
    if not _fused(invoke):
        return None
    hidden, ids = invoke.args[:2]
    pairs = ids.numel()
    props = pack.PerformanceProperties(
        memory_read_bytes=pairs * SORTED_ID_BYTES,
        memory_write_bytes=pairs * SORTED_ID_BYTES + hidden.numel() * hidden.element_size(),
    ).add(ids.dtype, gp=pairs * max(1.0, math.log2(max(pairs, 2))))
    estimate = pack.roofline(props, device)
    estimate.detail["kernel"] = "AITER moe_sorting"
    return estimate


@pack.register_op_estimator(ops.silu_and_mul.default, device=DEVICES)
@pack.register_op_estimator(ops.gelu_and_mul.default, device=DEVICES)
@pack.register_op_estimator(ops.clamped_swiglu.default, device=DEVICES)
def stage1_activation(invoke, device):
    """The gated activation between the experts' products: stage 1's epilogue."""
    return _epilogue("stage 1 (gate-up product)") if _fused(invoke) else None


@pack.register_op_estimator(ops.moe_unpermute.default, device=DEVICES)
def stage2_combine(invoke, device):
    """The weighted combine of each token's k rows: stage 2's epilogue, added into the zeroed output."""
    return _epilogue("stage 2 (down product)") if _fused(invoke) else None
