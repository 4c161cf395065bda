"""Op-level published points as the code that ran them: the function, its meta inputs and the source's work count.

``plan_op(point)`` gives an ``OpPlan`` (or ``NotExpressible`` with the reason) for the kinds ``mm``,
``attention`` and ``memory``; collectives are in ``collectives.py``. Each function is what the measured code
called: ``a @ b`` / ``F.linear`` / ``torch.bmm`` / ``torch._scaled_mm`` for GEMMs; the deployed fused kernel
``castcore::attention`` for attention; castcore's fused ops for fused memory-bound kernels and the eager ops
Hugging Face's modules run for unfused ones.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

import castcore.builtin.fused_ops  # noqa: F401  (defines torch.ops.castcore)

EPS = 1e-6


@dataclass(frozen=True)
class NotExpressible:
    """A point castcore cannot estimate as the source ran it; ``reason`` says why, in one line."""

    reason: str


@dataclass
class OpPlan:
    """``fn(*inputs)`` on meta tensors; ``work`` is the source's own work count (FLOPs or bytes) for its rate."""

    fn: Callable[..., Any]
    inputs: tuple
    work: float = 0.0
    describe: str = ""
    notes: list[str] = field(default_factory=list)


def parse_dtype(text: str) -> torch.dtype:
    """The torch dtype a point names, from the first word of its dtype text ("bfloat16 (assumed)")."""
    name = str(text).split()[0]
    found = getattr(torch, name, None)
    if not isinstance(found, torch.dtype):
        raise ValueError(f"unknown dtype {text!r}")
    return found


def meta(*shape: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="meta")


def plan_op(point: dict[str, Any]) -> OpPlan | NotExpressible:
    """How to estimate an op-level point, or why it cannot be."""
    workload = point["workload"]
    kind = workload["kind"]
    if kind == "mm":
        return plan_mm(workload)
    if kind == "attention":
        return plan_attention(workload)
    if kind == "memory":
        return plan_memory(workload)
    return NotExpressible(f"no op-level plan for workload kind {kind!r}")


# ---------------------------------------------------------------------------------------------
# GEMM


def _scaled_mm(out_dtype: torch.dtype) -> Callable[..., torch.Tensor]:
    def scaled_mm(a, b, scale_a, scale_b):
        return torch._scaled_mm(a, b, scale_a=scale_a, scale_b=scale_b, out_dtype=out_dtype)

    return scaled_mm


def _matmul(a, b):
    return a @ b


def _tf32_matmul(a, b):
    """a @ b with TF32 allowed (torch.backends.cuda.matmul.allow_tf32 = True), as the source ran it."""
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        return a @ b
    finally:
        torch.set_float32_matmul_precision(before)


def _linear(x, weight):
    return F.linear(x, weight)


def plan_mm(w: dict[str, Any]) -> OpPlan | NotExpressible:
    m, n, k, batch = w["m"], w["n"], w["k"], w.get("batch", 1)
    dtype = parse_dtype(w["dtype"])
    work = 2.0 * batch * m * n * k
    if str(w.get("math", "")).lower().startswith("tf32"):
        if batch != 1 or dtype != torch.float32:
            return NotExpressible("TF32 applies to a plain float32 product here")
        return OpPlan(
            _tf32_matmul,
            (meta(m, k, dtype=dtype), meta(k, n, dtype=dtype)),
            work,
            f"a @ b {m}x{k} @ {k}x{n} float32 with TF32 allowed",
        )
    linear = str(w.get("op", "")).startswith("linear")
    if dtype.itemsize == 1:  # fp8: torch._scaled_mm, B column-major as cuBLASLt requires
        if batch != 1:
            return NotExpressible("a batched fp8 product: torch._scaled_mm takes 2-D operands only")
        # vLLM's kernels write bf16; mamf-finder.py and the CUTLASS example keep the fp8 input type.
        scaling = str(w.get("scaling", ""))
        out = torch.bfloat16 if "bf16 output" in scaling else dtype
        b = meta(n, k, dtype=dtype).t()
        # DeepSeek-V3's block scaling: a scale per 1x128 row group of A, per 128x128 block of B
        if scaling.startswith("block"):
            groups = -(-k // 128)
            scales = (
                meta(m, groups, dtype=torch.float32),
                meta(-(-n // 128), groups, dtype=torch.float32).t(),
            )
        else:
            one = torch.ones((), dtype=torch.float32, device="meta")
            scales = (one, one)
        return OpPlan(
            _scaled_mm(out),
            (meta(m, k, dtype=dtype), b, *scales),
            work,
            f"torch._scaled_mm {m}x{k} @ {k}x{n} {dtype} -> {out}"
            + (", block-scaled" if scales[0].dim() else ""),
        )
    if linear:
        return OpPlan(
            _linear,
            (meta(m, k, dtype=dtype), meta(n, k, dtype=dtype)),
            work,
            f"F.linear x[{m}, {k}] W[{n}, {k}] {dtype}",
        )
    if batch != 1:
        return OpPlan(
            torch.bmm,
            (meta(batch, m, k, dtype=dtype), meta(batch, k, n, dtype=dtype)),
            work,
            f"torch.bmm {batch}x{m}x{k} @ {batch}x{k}x{n} {dtype}",
        )
    return OpPlan(
        _matmul, (meta(m, k, dtype=dtype), meta(k, n, dtype=dtype)), work, f"a @ b {m}x{k} @ {k}x{n} {dtype}"
    )


# ---------------------------------------------------------------------------------------------
# Attention


def attention_work(w: dict[str, Any]) -> float:
    """FlashAttention's convention: 4 * batch * heads * q_len * kv_len * head_dim, halved when causal."""
    work = 4.0 * w["batch"] * w["heads"] * w["q_len"] * w["kv_len"] * w["head_dim"]
    return work / 2 if w.get("causal") else work


def _attention(scale: float, causal: bool) -> Callable[..., torch.Tensor]:
    def attention(q, k, v):
        return torch.ops.castcore.attention(q, k, v, scale, causal, 0, 0.0)

    return attention


def plan_attention(w: dict[str, Any]) -> OpPlan | NotExpressible:
    if w.get("direction", "forward") != "forward":
        return NotExpressible("a backward attention pass: castcore::attention is the forward kernel")
    dtype = parse_dtype(w["dtype"])
    b, h, kvh, d = w["batch"], w["heads"], w.get("kv_heads", w["heads"]), w["head_dim"]
    q = meta(b, h, w["q_len"], d, dtype=dtype)
    k, v = meta(b, kvh, w["kv_len"], d, dtype=dtype), meta(b, kvh, w["kv_len"], d, dtype=dtype)
    notes = []
    if "paged" in str(w.get("kv_layout", "")):
        notes.append(
            "the KV cache is paged in the source; castcore::attention reads it as one contiguous tensor"
        )
    return OpPlan(
        _attention(1 / math.sqrt(d), bool(w.get("causal"))),
        (q, k, v),
        attention_work(w),
        f"castcore::attention q[{b}, {h}, {w['q_len']}, {d}] kv[{b}, {kvh}, {w['kv_len']}, {d}] "
        f"{dtype}{' causal' if w.get('causal') else ''}",
        notes,
    )


# ---------------------------------------------------------------------------------------------
# Memory-bound ops


def hf_rms_norm(x, weight):
    """transformers' LlamaRMSNorm.forward as eager PyTorch runs it: fp32 upcast, pow, mean, rsqrt, mul, downcast,
    times the weight."""
    dtype = x.dtype
    x32 = x.to(torch.float32)
    variance = x32.pow(2).mean(-1, keepdim=True)
    x32 = x32 * torch.rsqrt(variance + EPS)
    return weight * x32.to(dtype)


def hf_add_rms_norm(x, residual, weight):
    """The residual add, then LlamaRMSNorm (Liger's NaiveAddRMSNorm baseline)."""
    total = x + residual
    return hf_rms_norm(total, weight), total


def fused_rms_norm(x, weight):
    return torch.ops.castcore.rms_norm(x, weight, EPS, 0.0)


def fused_add_rms_norm(x, residual, weight):
    return torch.ops.castcore.add_rms_norm(x, residual, weight, EPS, 0.0)


def eager_silu_and_mul(y):
    """F.silu(y1) * y2 over torch.chunk(y, 2, -1): two kernels, the silu output written and read again."""
    y1, y2 = torch.chunk(y, 2, -1)
    return F.silu(y1) * y2


def fused_silu_and_mul(y):
    return torch.ops.castcore.silu_and_mul(y)


def layer_norm(x, weight, bias):
    return F.layer_norm(x, (x.shape[-1],), weight, bias)


def softmax(x):
    return torch.softmax(x, dim=-1)


def plan_memory(w: dict[str, Any]) -> OpPlan | NotExpressible:
    op, fused, shape = w["op"], bool(w.get("fused")), tuple(w["shape"])
    dtype = parse_dtype(w["dtype"])
    x, hidden = meta(*shape, dtype=dtype), shape[-1]
    weight = meta(hidden, dtype=dtype)
    tag = "fused" if fused else "eager"
    if op == "rms_norm":
        return OpPlan(fused_rms_norm if fused else hf_rms_norm, (x, weight), describe=f"{tag} rms_norm")
    if op == "add_rms_norm":
        residual = meta(*shape, dtype=dtype)
        return OpPlan(
            fused_add_rms_norm if fused else hf_add_rms_norm,
            (x, residual, weight),
            describe=f"{tag} add_rms_norm",
        )
    if op == "silu_and_mul":
        return OpPlan(
            fused_silu_and_mul if fused else eager_silu_and_mul, (x,), describe=f"{tag} silu_and_mul"
        )
    if op == "layer_norm":
        return OpPlan(layer_norm, (x, weight, meta(hidden, dtype=dtype)), describe="F.layer_norm")
    if op == "softmax":
        # The source's "model" throughput: the input read once and the output written once.
        return OpPlan(softmax, (x,), work=2.0 * x.numel() * x.element_size(), describe="torch.softmax")
    return NotExpressible(f"no castcore op for memory-bound op {op!r}")
