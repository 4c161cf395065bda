"""Fidelity on this machine: calibrate a profile of it on one set of shapes, then estimate and time others.

Calibration measures what ``castcore calibrate`` measures (matrix rate per dtype, vector rate, copy bandwidth,
fixed cost per call), with the same method (best of a few timed calls) and castcore's own ``profile_toml``, but
on shapes none of the scored operators use (``CALIBRATION``), so the score is not the calibration read back.
Each scored operator is then captured on meta tensors, estimated on that profile by the core alone, and run for
real (warm-up, then timed calls for about ``budget_s``; the fastest is scored, as calibration takes the best of its
calls, and the median is kept beside it).

bf16 SDPA is timed and shown but not scored: torch.mm in bf16 (what calibration measures) runs CPUBlas's bf16 GEMM,
which on a CPU without AVX512-BF16 falls to a generic loop (about 0.4 GFLOP/s here), while the CPU flash-attention
kernel multiplies bf16 into fp32 buffers through MKL's cblas_gemm_bf16bf16f32, at about the fp32 rate. The two
paths have rates two orders of magnitude apart that one bf16 matrix rate cannot describe; the report prints the
measured rates that show it.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from fidelity.published import percentage_error

FAMILIES = ("matmul", "pointwise", "norm", "softmax", "attention")
F32, BF16 = torch.float32, torch.bfloat16
# The shapes calibration runs; the suite below uses none of them.
CALIBRATION = {
    "mm float32": [(384, 384, 384), (768, 768, 768)],
    "mm bfloat16": [(128, 128, 128), (320, 320, 320)],
    "add": [(3 << 16,)],
    "copy": [(1 << 24,)],
    "fixed cost": [(1, 1, 1), (1,)],
}
NOT_SCORED_BF16_SDPA = (
    "bf16 SDPA multiplies through MKL's bf16 x bf16 -> fp32 GEMM, another path than the "
    "torch.mm bf16 GEMM calibration measures (see the rates above)"
)


@dataclass(frozen=True)
class SuiteOp:
    """``fn(*inputs)`` with inputs of ``shapes`` in ``dtype``; ``unscored`` says why it is shown but not scored."""

    name: str
    family: str
    fn: Callable[..., Any]
    shapes: tuple[tuple[int, ...], ...]
    dtype: torch.dtype = F32
    unscored: str = ""

    def inputs(self, device: str) -> list[torch.Tensor]:
        if device == "meta":
            return [torch.empty(s, dtype=self.dtype, device="meta") for s in self.shapes]
        return [torch.rand(s, dtype=self.dtype, device=device) for s in self.shapes]


def _layer_norm(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b)


def _rms_norm(x, w):
    return F.rms_norm(x, (x.shape[-1],), w)


def _softmax(x):
    return torch.softmax(x, dim=-1)


def _sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v)


def _sdpa_causal(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def _tag(dtype: torch.dtype) -> str:
    return "bf16" if dtype == BF16 else "fp32"


def operator_suite() -> list[SuiteOp]:
    """The scored operators: every tensor under 32 MiB (glibc gives larger blocks fresh pages on every call)."""
    ops: list[SuiteOp] = []
    for m, k, n, dtype in (
        (256, 256, 256, F32),
        (512, 512, 512, F32),
        (1024, 1024, 1024, F32),
        (16, 4096, 4096, F32),
        (1, 4096, 4096, F32),
        (2048, 64, 2048, F32),
        (192, 256, 320, BF16),
        (64, 512, 512, BF16),
    ):
        ops.append(SuiteOp(f"mm {m}x{k}x{n} {_tag(dtype)}", "matmul", torch.mm, ((m, k), (k, n)), dtype))
    for b, m, k, n in ((32, 128, 64, 128), (16, 256, 256, 256)):
        ops.append(SuiteOp(f"bmm {b}x{m}x{k}x{n} fp32", "matmul", torch.bmm, ((b, m, k), (b, k, n))))
    for numel in (1 << 14, 1 << 18, 1 << 22):
        for label, fn, arity in (
            ("add", torch.add, 2),
            ("mul", torch.mul, 2),
            ("silu", F.silu, 1),
            ("gelu", F.gelu, 1),
            ("exp", torch.exp, 1),
        ):
            ops.append(SuiteOp(f"{label} {numel} fp32", "pointwise", fn, ((numel,),) * arity))
    ops.append(SuiteOp(f"add {1 << 22} bf16", "pointwise", torch.add, ((1 << 22,),) * 2, BF16))
    ops.append(SuiteOp(f"silu {1 << 22} bf16", "pointwise", F.silu, ((1 << 22,),), BF16))
    for rows, width in ((4096, 1024), (1024, 4096), (64, 4096)):
        ops.append(
            SuiteOp(
                f"layer_norm {rows}x{width} fp32", "norm", _layer_norm, ((rows, width), (width,), (width,))
            )
        )
        ops.append(SuiteOp(f"rms_norm {rows}x{width} fp32", "norm", _rms_norm, ((rows, width), (width,))))
    for shape in ((4096, 1024), (4, 4, 512, 512), (64, 1024)):
        ops.append(SuiteOp(f"softmax {'x'.join(map(str, shape))} fp32", "softmax", _softmax, (shape,)))
    for b, h, s, d, dtype in ((1, 8, 512, 64, F32), (2, 8, 1024, 64, F32), (1, 8, 1024, 128, BF16)):
        unscored = NOT_SCORED_BF16_SDPA if dtype == BF16 else ""
        for label, fn in (("sdpa", _sdpa), ("sdpa causal", _sdpa_causal)):
            ops.append(
                SuiteOp(
                    f"{label} {b}x{h}x{s}x{d} {_tag(dtype)}",
                    "attention",
                    fn,
                    ((b, h, s, d),) * 3,
                    dtype,
                    unscored,
                )
            )
    return ops


def scored_shapes(ops: list[SuiteOp]) -> set[tuple[int, ...]]:
    """Every matmul problem (m, k, n) and every tensor shape the suite times: none may be a calibration shape."""
    shapes = {s for op in ops for s in op.shapes}
    shapes |= {(op.shapes[0][-2], op.shapes[0][-1], op.shapes[1][-1]) for op in ops if op.family == "matmul"}
    return shapes


# ---------------------------------------------------------------------------------------------
# Calibrate, estimate, measure


def _best(work: float, fn: Callable[[], Any], repeat: int) -> float:
    from castcore.operator_tools.timing import time_call

    return work / min(time_call(fn, warmup=1, repeat=repeat))


def calibrate_local():
    """This machine's Calibration on the CALIBRATION shapes (castcore calibrate's method and fields)."""
    from castcore.operator_tools.timing import Calibration, time_call

    mma, gp = {}, {}
    with torch.no_grad():
        for dtype in (F32, BF16):
            best = 0.0
            for m, k, n in CALIBRATION[f"mm {str(dtype).removeprefix('torch.')}"]:
                a, b = torch.rand(m, k, dtype=dtype), torch.rand(k, n, dtype=dtype)
                best = max(best, _best(2 * m * k * n, lambda: torch.mm(a, b), repeat=5))
            mma[str(dtype).removeprefix("torch.")] = best
            (numel,) = CALIBRATION["add"][0]
            x, y = torch.rand(numel, dtype=dtype), torch.rand(numel, dtype=dtype)
            out = torch.empty_like(x)
            gp[str(dtype).removeprefix("torch.")] = _best(numel, lambda: torch.add(x, y, out=out), repeat=50)
        (numel,) = CALIBRATION["copy"][0]
        src = torch.rand(numel)
        dst = torch.empty_like(src)
        bandwidth = _best(2 * src.numel() * src.element_size(), lambda: dst.copy_(src), repeat=10)
        tiny, one = torch.rand(1, 1), torch.rand(1)
        mma_cost = min(time_call(lambda: torch.mm(tiny, tiny), 3, 40))
        gp_cost = min(time_call(lambda: torch.add(one, one), 3, 40))
    memory = float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    return Calibration(mma, gp, bandwidth, memory, mma_cost, gp_cost, "cpu")


def local_profile(calibration):
    from castcore.devices.profile_files import device_from_dict
    from castcore.tomlfiles import tomllib
    from castcore.operator_tools.timing import profile_toml

    text = profile_toml(calibration, name="local-calibrated")
    return device_from_dict(tomllib.loads(text), origin="bench/fidelity/local.py"), text


def estimate_suite_op(session, profile, op: SuiteOp) -> dict[str, Any]:
    import castcore

    report = session.estimate_capture(castcore.capture(op.fn, *op.inputs("meta")), profile)
    slowest = max(report.records, key=lambda r: r.estimate.time_s)
    return {
        "estimated_s": report.time_s,
        "aten": sorted({r.invoke.name for r in report.records}),
        "bound": slowest.estimate.bound,
        "flops": report.flops,
    }


def measure_suite_op(op: SuiteOp, budget_s: float, min_repeat: int = 5, max_repeat: int = 50) -> list[float]:
    """Seconds per call: one untimed call, then as many timed ones as fit ``budget_s`` (judged by a probe)."""
    from castcore.operator_tools.timing import time_call

    args = op.inputs("cpu")
    with torch.no_grad():
        probe = time_call(lambda: op.fn(*args), warmup=1, repeat=1)[0]
        repeat = int(min(max_repeat, max(min_repeat, budget_s / max(probe, 1e-7))))
        return time_call(lambda: op.fn(*args), warmup=0, repeat=repeat)


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """MdAPE (median |error|), median signed error and worst |error| per family and overall, scored rows only."""
    scored = [r for r in rows if not r.get("unscored")]

    def stats(group: list[dict[str, Any]]) -> dict[str, Any]:
        errors = [r["error_pct"] for r in group]
        return {
            "ops": len(group),
            "median_ape_pct": statistics.median(map(abs, errors)) if errors else None,
            "median_error_pct": statistics.median(errors) if errors else None,
            "worst_ape_pct": max(map(abs, errors)) if errors else None,
        }

    return {
        "overall": stats(scored),
        "by_family": {f: stats([r for r in scored if r["family"] == f]) for f in FAMILIES},
    }


def run_local(
    budget_s: float = 0.3,
    threads: int = 1,
    ops: list[SuiteOp] | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Calibrate, then estimate and time every suite op, with ``threads`` intra-op threads throughout."""
    from fidelity.published import make_session

    started = time.perf_counter()
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        calibration = calibrate_local()
        calibrated_s = time.perf_counter() - started
        profile, toml_text = local_profile(calibration)
        session = make_session(packs=())
        rows = []
        for op in ops if ops is not None else operator_suite():
            row: dict[str, Any] = {
                "name": op.name,
                "family": op.family,
                "dtype": _tag(op.dtype),
                "shapes": [list(s) for s in op.shapes],
                "unscored": op.unscored,
            }
            row.update(estimate_suite_op(session, profile, op))
            samples = measure_suite_op(op, budget_s)
            # Scored on the fastest call, the statistic calibration uses (its rates are best-of): on a shared
            # machine the median mixes in time the process spent waiting for a core.
            row.update(measured_s=min(samples), median_s=statistics.median(samples), repeat=len(samples))
            row["error_pct"] = percentage_error(row["estimated_s"], row["measured_s"])
            rows.append(row)
            if progress:
                progress(
                    f"{op.name:<34} measured {row['measured_s'] * 1e3:9.3f} ms  estimated "
                    f"{row['estimated_s'] * 1e3:9.3f} ms  {row['error_pct']:+8.1f}%"
                )
    finally:
        torch.set_num_threads(previous)
    evidence = _bf16_evidence(rows, calibration)
    return {
        "device": profile.name,
        "calibration": {**vars(calibration), "shapes": CALIBRATION, "seconds": calibrated_s},
        "profile_toml": toml_text,
        "threads": threads,
        "budget_s": budget_s,
        "rows": rows,
        "summary": summarize(rows),
        "bf16_sdpa": evidence,
        "wall_s": time.perf_counter() - started,
    }


def _bf16_evidence(rows: list[dict[str, Any]], calibration) -> dict[str, Any]:
    """Achieved GFLOP/s of SDPA in bf16 and fp32 next to the calibrated bf16 and fp32 matrix rates."""

    def rate(dtype: str) -> float | None:
        done = [
            r["flops"] / r["measured_s"] / 1e9
            for r in rows
            if r["family"] == "attention" and r["dtype"] == dtype and r["flops"]
        ]
        return max(done) if done else None

    return {
        "sdpa_bf16_gflops": rate("bf16"),
        "sdpa_fp32_gflops": rate("fp32"),
        "mm_bf16_gflops": calibration.mma_flops.get("bfloat16", 0) / 1e9,
        "mm_fp32_gflops": calibration.mma_flops.get("float32", 0) / 1e9,
    }


def local_markdown(local: dict[str, Any]) -> list[str]:
    cal, summary, ev = local["calibration"], local["summary"], local["bf16_sdpa"]
    shapes = "; ".join(f"{k} {', '.join('x'.join(map(str, s)) for s in v)}" for k, v in cal["shapes"].items())
    lines = [
        "## This machine: calibrate, then estimate and time other shapes",
        "",
        f"Calibrated in {cal['seconds']:.1f} s on {shapes} (the scored operators use none of these shapes), "
        f"{local['threads']} thread: matmul fp32 {cal['mma_flops']['float32'] / 1e9:.1f} GFLOP/s, bf16 "
        f"{cal['mma_flops']['bfloat16'] / 1e9:.2f} GFLOP/s; vector fp32 {cal['gp_flops']['float32'] / 1e9:.2f} "
        f"Gop/s; copy {cal['memory_bandwidth'] / 1e9:.1f} GB/s; fixed cost {cal['mma_op_cost_s'] * 1e6:.1f} us "
        f"(matrix), {cal['gp_op_cost_s'] * 1e6:.1f} us (vector). Each operator is estimated by the core alone "
        f"on that profile, then run: one warm-up call, then timed calls for about {local['budget_s']} s; the "
        "fastest is scored (calibration's rates are best-of too) and the median shown beside it. "
        f"The whole local run took **{local['wall_s']:.0f} s**.",
        "",
        "| family | ops | median \\|error\\| | median error | worst \\|error\\| |",
        "|---|---:|---:|---:|---:|",
    ]
    for family, b in [*summary["by_family"].items(), ("**all**", summary["overall"])]:
        lines.append(
            f"| {family} | {b['ops']} | {_pct(b['median_ape_pct'])} | {_pct(b['median_error_pct'], True)} "
            f"| {_pct(b['worst_ape_pct'])} |"
        )
    if ev["sdpa_bf16_gflops"] and ev["sdpa_fp32_gflops"]:
        line = (
            f"bf16 SDPA is shown, not scored: it ran at {ev['sdpa_bf16_gflops']:.1f} GFLOP/s (fp32 SDPA "
            f"{ev['sdpa_fp32_gflops']:.1f}) while torch.mm ran at {ev['mm_bf16_gflops']:.2f} in bf16 (fp32 "
            f"{ev['mm_fp32_gflops']:.1f})"
        )
        if 4 * ev["mm_bf16_gflops"] < ev["sdpa_bf16_gflops"]:
            line += (
                ": the CPU flash-attention kernel multiplies bf16 into fp32 buffers through MKL's "
                "cblas_gemm_bf16bf16f32, while torch.mm's bf16-output GEMM falls to a generic loop on a CPU "
                "without AVX512-BF16, so one bf16 matrix rate cannot describe both"
            )
        lines += ["", line + "."]
    lines += [
        "",
        "| op | aten calls | measured (fastest) | median | estimated | error | bound |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for r in local["rows"]:
        aten = ", ".join(a.removeprefix("aten::") for a in r["aten"])
        err = _pct(r["error_pct"], True) + (" (not scored)" if r["unscored"] else "")
        lines.append(
            f"| {r['name']} | {aten} | {r['measured_s'] * 1e3:.3f} ms | {r['median_s'] * 1e3:.3f} ms | "
            f"{r['estimated_s'] * 1e3:.3f} ms | "
            f"{err} | {r['bound']} |"
        )
    return lines


def _pct(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value:+.1f}%" if signed else f"{value:.1f}%"
