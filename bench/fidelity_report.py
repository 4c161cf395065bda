"""How far castcore's estimates are from real times: on this machine, and against published figures.

Local: calibrate this machine (``castcore.measure.calibrate``), estimate an operator suite on that
profile with the core's formulas, run each operator for real (``castcore.measure.time_call``: warm-up,
repeats, median) and report each one's error and the median absolute percentage error (MdAPE),
overall and per family. The calibrated profile's rates are what calibration achieved here, so this
checks the formulas and the roofline's shape, not any accelerator's numbers.

Published: figures others measured on accelerators (``fidelity_published.json``, each with its
source), estimated the same way on the matching device profile.
"""

from __future__ import annotations

import datetime
import json
import math
import platform
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from castcore.plugins.config import Config, ConfigError
from castcore.devices.profile import DeviceError, DeviceProfile, device_from_dict, tomllib
from castcore.ops.timing import Calibration, calibrate, profile_toml, time_call
from castcore.report.records import format_seconds

FAMILIES = ("matmul", "pointwise", "norm", "softmax", "attention")
LOCAL_NOTE = ("The local profile is this machine calibrated by castcore calibrate: its rates are the ones "
              "calibration achieved and its efficiencies are 1.0, so these errors test castcore's operator "
              "formulas and the roofline's shape (compute- vs memory-bound, fixed cost per call) on this CPU, "
              "not the accelerator numbers of any device profile.")


# ---------------------------------------------------------------------------------------------
# Errors

def percentage_error(estimated: float, measured: float) -> float:
    """Signed error of an estimate in percent of the measurement: above 0 the estimate is pessimistic."""
    if not measured > 0:
        raise ValueError(f"a measured time must be positive, not {measured!r}")
    return (estimated - measured) / measured * 100.0


def median_ape(pairs: Iterable[tuple[float, float]]) -> float | None:
    """Median absolute percentage error over (estimated, measured) pairs; None when there are none."""
    errors = [abs(percentage_error(est, meas)) for est, meas in pairs]
    return statistics.median(errors) if errors else None


def summarize(rows: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """MdAPE overall and per family over rows that have both an estimate and a measurement."""
    done = [r for r in rows if r.get("measured_s") and r.get("estimated_s") is not None]
    by_family: dict[str, list[dict[str, Any]]] = {}
    for row in done:
        by_family.setdefault(row["family"], []).append(row)

    def block(group: list[dict[str, Any]]) -> dict[str, Any]:
        pairs = [(r["estimated_s"], r["measured_s"]) for r in group]
        signed = [percentage_error(e, m) for e, m in pairs]
        return {"ops": len(group), "median_ape_pct": median_ape(pairs),
                "median_error_pct": statistics.median(signed) if signed else None}

    order = [f for f in FAMILIES if f in by_family] + sorted(set(by_family) - set(FAMILIES))
    return {"overall": block(done), "by_family": {f: block(by_family[f]) for f in order}}


# ---------------------------------------------------------------------------------------------
# The local operator suite

@dataclass(frozen=True, slots=True)
class SuiteOp:
    """One operator call of the suite: ``fn(*inputs)`` with inputs of ``shapes`` in ``dtype``."""

    name: str
    family: str
    fn: Callable[..., Any]
    shapes: tuple[tuple[int, ...], ...]
    dtype: torch.dtype = torch.float32

    def inputs(self, device: str) -> list[torch.Tensor]:
        """Meta tensors to estimate with, or random [0, 1) tensors on a real device to time."""
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


def _dims(shape: tuple[int, ...]) -> str:
    return "x".join(map(str, shape))


def operator_suite(quick: bool = False) -> list[SuiteOp]:
    """Matmuls (square, skinny, matrix-vector, batched), pointwise ops, norms, softmax and attention.

    Sizes keep each call between microseconds and a few hundred milliseconds on one CPU core, and
    every tensor under 32 MiB: glibc gives larger blocks fresh pages from the kernel on every call, and
    their page faults would swamp the operator. ``quick`` divides the sizes (for tests) and keeps the
    same operators.
    """
    d = 8 if quick else 1  # divisor for sizes
    f32, bf16 = torch.float32, torch.bfloat16
    ops: list[SuiteOp] = []

    def mm(m, k, n, dtype=f32):
        m, k, n = max(1, m // d), max(1, k // d), max(1, n // d)
        tag = "bf16" if dtype == bf16 else "fp32"
        ops.append(SuiteOp(f"mm {m}x{k}x{n} {tag}", "matmul", torch.mm, ((m, k), (k, n)), dtype))

    for n in (256, 512, 1024, 2048):
        mm(n, n, n)
    mm(1024, 1024, 1024, bf16)
    mm(2048, 2048, 2048, bf16)
    mm(16, 4096, 4096)     # skinny: a few tokens through a weight (weight-read bound)
    mm(8, 4096, 4096)
    mm(2048, 64, 2048)     # skinny inner dimension: outer product-like, output bound
    mm(4096, 4096, 32)
    mm(1, 4096, 4096)      # matrix-vector
    for b, m, k, n in ((32, 128, 64, 128), (16, 256, 256, 256), (8, 512, 512, 512)):
        m, k, n = max(1, m // d), max(1, k // d), max(1, n // d)
        ops.append(SuiteOp(f"bmm {b}x{m}x{k}x{n} fp32", "matmul", torch.bmm, ((b, m, k), (b, k, n)), f32))

    for numel in (1 << 14, 1 << 18, 1 << 22):
        n = max(1, numel // (d * d))
        for label, fn, arity in (("add", torch.add, 2), ("mul", torch.mul, 2), ("silu", F.silu, 1),
                                 ("gelu", F.gelu, 1), ("exp", torch.exp, 1)):
            ops.append(SuiteOp(f"{label} {n} fp32", "pointwise", fn, ((n,),) * arity, f32))
    n = max(1, (1 << 22) // (d * d))
    ops.append(SuiteOp(f"add {n} bf16", "pointwise", torch.add, ((n,), (n,)), bf16))
    ops.append(SuiteOp(f"silu {n} bf16", "pointwise", F.silu, ((n,),), bf16))

    for rows, width in ((4096, 1024), (1024, 4096), (64, 4096)):
        r, w = max(1, rows // d), max(1, width // d)
        ops.append(SuiteOp(f"layer_norm {r}x{w} fp32", "norm", _layer_norm, ((r, w), (w,), (w,)), f32))
        ops.append(SuiteOp(f"rms_norm {r}x{w} fp32", "norm", _rms_norm, ((r, w), (w,)), f32))

    for lead, rows, width in ((), 4096, 1024), ((4, 4), 512, 512), ((), 64, 1024):
        shape = (*lead, max(1, rows // d), max(1, width // d))
        ops.append(SuiteOp(f"softmax {_dims(shape)} fp32", "softmax", _softmax, (shape,), f32))

    for b, h, s, hd, dtype in ((1, 8, 512, 64, f32), (2, 8, 1024, 64, f32), (1, 8, 1024, 128, bf16)):
        s = max(1, s // d)
        tag = "bf16" if dtype == bf16 else "fp32"
        qkv = ((b, h, s, hd),) * 3
        ops.append(SuiteOp(f"sdpa {b}x{h}x{s}x{hd} {tag}", "attention", _sdpa, qkv, dtype))
        ops.append(SuiteOp(f"sdpa causal {b}x{h}x{s}x{hd} {tag}", "attention", _sdpa_causal, qkv, dtype))
    return ops


# ---------------------------------------------------------------------------------------------
# Local: calibrate, estimate, measure

def calibrated_profile(quick: bool = False, name: str = "local-calibrated") -> tuple[DeviceProfile, Calibration, str]:
    """Calibrate this machine with castcore calibrate's own code; the profile, the raw numbers, the TOML."""
    cal = calibrate(quick=quick)
    text = profile_toml(cal, name=name)
    return device_from_dict(tomllib.loads(text), origin="castcore calibrate"), cal, text


def core_session(device_files: Iterable[str | Path] = (), packs: tuple[str, ...] = ()):
    """A session with only the core (plus ``packs``), untouched by config files and CASTCORE_* variables."""
    from castcore.workload.session import Session

    return Session(Config(load_packs=packs), device_files=[str(p) for p in device_files] or None)


def estimate_suite_op(session, profile: DeviceProfile, op: SuiteOp) -> dict[str, Any]:
    """Capture ``op`` on fake tensors and estimate every call on ``profile``."""
    report = session.estimate(op.fn, *op.inputs("meta"), device=profile)
    slowest = max(report.records, key=lambda r: r.estimate.time_s, default=None)
    return {"estimated_s": report.time_s, "aten": [r.invoke.name for r in report.records],
            "bound": slowest.estimate.bound if slowest else "none", "flops": report.flops}


def measure_suite_op(op: SuiteOp, warmup: int = 2, min_repeat: int = 5, max_repeat: int = 50,
                     budget_s: float = 0.3, device: str = "cpu") -> list[float]:
    """Seconds per call of ``op`` run for real: ``warmup`` untimed calls, then as many timed ones as fit
    ``budget_s`` (at least ``min_repeat``, at most ``max_repeat``) judged by one probe call."""
    args = op.inputs(device)
    with torch.no_grad():
        probe = time_call(lambda: op.fn(*args), warmup=warmup, repeat=1, device=device)[0]
        repeat = int(min(max_repeat, max(min_repeat, budget_s / max(probe, 1e-7))))
        return time_call(lambda: op.fn(*args), warmup=0, repeat=repeat, device=device)


def run_local(quick: bool = False, profile: DeviceProfile | None = None, warmup: int = 2, min_repeat: int = 5,
              max_repeat: int = 50, budget_s: float = 0.3, threads: int | None = 1, ops: list[SuiteOp] | None = None,
              progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Calibrate (unless ``profile`` is given), then estimate and measure every suite op.

    Calibration and timing both run with ``threads`` intra-op threads (None: torch's default). One is
    the default because on a shared machine a parallel op waits for its slowest thread, and a thread
    that loses its core to other work costs a whole scheduler tick (4 ms here) per call.
    """
    previous = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        return _run_local(quick, profile, warmup, min_repeat, max_repeat, budget_s, ops, progress)
    finally:
        torch.set_num_threads(previous)


def _run_local(quick, profile, warmup, min_repeat, max_repeat, budget_s, ops, progress) -> dict[str, Any]:
    started = time.perf_counter()
    calibration, toml_text = None, None
    if profile is None:
        profile, cal, toml_text = calibrated_profile(quick=quick)
        calibration = asdict(cal)
    session = core_session()
    rows = []
    for op in ops if ops is not None else operator_suite(quick):
        row: dict[str, Any] = {"name": op.name, "family": op.family, "dtype": str(op.dtype).removeprefix("torch."),
                               "shapes": [list(s) for s in op.shapes]}
        row.update(estimate_suite_op(session, profile, op))
        samples = measure_suite_op(op, warmup, min_repeat, max_repeat, budget_s)
        row.update(measured_s=statistics.median(samples), min_s=min(samples), repeat=len(samples))
        row["error_pct"] = percentage_error(row["estimated_s"], row["measured_s"])
        rows.append(row)
        if progress:
            progress(f"{op.name:<34} measured {format_seconds(row['measured_s']):>10}  "
                     f"estimated {format_seconds(row['estimated_s']):>10}  {row['error_pct']:+7.1f}%")
    return {"device": profile.name, "profile": _profile_summary(profile), "calibration": calibration,
            "profile_toml": toml_text, "note": LOCAL_NOTE, "runtime": "cpu", "threads": torch.get_num_threads(),
            "settings": {"warmup": warmup, "min_repeat": min_repeat, "max_repeat": max_repeat, "budget_s": budget_s,
                         "statistic": "median of the timed calls (min also kept)"},
            "rows": rows, "summary": summarize(rows), "wall_s": time.perf_counter() - started}


def _profile_summary(profile: DeviceProfile) -> dict[str, Any]:
    return {"name": profile.name, "mma_flops": dict(profile.mma_flops), "gp_flops": dict(profile.gp_flops),
            "memory_bandwidth": profile.memory_bandwidth, "compute_efficiency": profile.compute_efficiency,
            "memory_efficiency": profile.memory_efficiency, "mma_op_cost_s": profile.mma_op_cost_s,
            "gp_op_cost_s": profile.gp_op_cost_s}


# ---------------------------------------------------------------------------------------------
# Published figures

def published_figures() -> list[dict[str, Any]]:
    """The cited figures beside this file (fidelity_published.json)."""
    text = (Path(__file__).parent / "fidelity_published.json").read_text(encoding="utf-8")
    return json.loads(text)["figures"]


def source_work_flops(workload: dict[str, Any]) -> float:
    """The work a TFLOPS figure divides, counted as its source counts it."""
    kind = workload["kind"]
    if kind == "mm":
        return 2.0 * workload["m"] * workload["k"] * workload["n"]
    if kind == "attention":  # FlashAttention's count: two products over seq^2 pairs, half when causal
        flops = 4.0 * workload["batch"] * workload["heads"] * workload["seq"] ** 2 * workload["head_dim"]
        return flops / 2 if workload["causal"] else flops
    raise ValueError(f"a {kind!r} workload has no FLOP count; give its figure in ms")


def published_seconds(entry: dict[str, Any]) -> float:
    """The published figure as seconds per call."""
    figure = entry["figure"]
    if figure["unit"] == "ms":
        return figure["value"] / 1e3
    if figure["unit"] == "TFLOPS":
        return source_work_flops(entry["workload"]) / (figure["value"] * 1e12)
    raise ValueError(f"{entry['id']}: unknown figure unit {figure['unit']!r}; use ms or TFLOPS")


def published_workload(workload: dict[str, Any]) -> tuple[Any, tuple, dict[str, Any]]:
    """(callable or model, meta inputs, keyword inputs) for a published workload."""
    dtype = getattr(torch, workload["dtype"])
    kind = workload["kind"]
    if kind == "mm":
        a = torch.empty(workload["m"], workload["k"], dtype=dtype, device="meta")
        b = torch.empty(workload["k"], workload["n"], dtype=dtype, device="meta")
        return torch.mm, (a, b), {}
    if kind == "attention":
        shape = (workload["batch"], workload["heads"], workload["seq"], workload["head_dim"])
        q, k, v = (torch.empty(shape, dtype=dtype, device="meta") for _ in range(3))
        return (_sdpa_causal if workload["causal"] else _sdpa), (q, k, v), {}
    if kind == "causal_lm_prefill":
        from castcore.workload.hf import build_causal_lm

        model, _ = build_causal_lm(workload["config"], dtype)  # published models all take castcore attention
        ids = torch.zeros((workload["batch"], workload["seq"]), dtype=torch.long, device="meta")
        kwargs = {"input_ids": ids, "use_cache": False}
        if workload.get("logits_to_keep"):
            kwargs["logits_to_keep"] = workload["logits_to_keep"]
        return model, (), kwargs
    raise ValueError(f"unknown published workload kind {kind!r}; use mm, attention or causal_lm_prefill")


def _checkout_root() -> Path:
    return Path(__file__).resolve().parent.parent


def estimate_published(entry: dict[str, Any], root: Path | None = None,
                       sessions: dict[Any, Any] | None = None) -> dict[str, Any]:
    """Estimate one published figure on its device; ``skipped`` says why when that device is missing.

    A ``device_file`` is relative to ``root`` (default: the checkout holding this castcore); a ``pack``
    must be installed. ``sessions`` caches one session per device source across entries.
    """
    root = Path(root) if root is not None else _checkout_root()
    device = entry["device"]
    row: dict[str, Any] = {"id": entry["id"], "description": entry["description"], "device": device["name"],
                           "published": entry["figure"], "published_s": published_seconds(entry),
                           "source": entry["source"], "note": entry.get("note", "")}
    key = (device.get("device_file"), device.get("pack"))
    sessions = {} if sessions is None else sessions
    try:
        if key not in sessions:
            files = [root / device["device_file"]] if device.get("device_file") else []
            sessions[key] = core_session(files, (device["pack"],) if device.get("pack") else ())
        session = sessions[key]
        profile = session.device(device["name"])
    except (ConfigError, DeviceError) as exc:
        row["skipped"] = str(exc)
        return row
    target, args, kwargs = published_workload(entry["workload"])
    report = session.estimate(target, *args, kwargs=kwargs, device=profile)
    row.update(estimated_s=report.time_s, error_pct=percentage_error(report.time_s, row["published_s"]),
               calls=len(report.records), castcore_flops=report.flops,
               answered_by=sorted({str(r.estimate.source) for r in report.records if r.estimate.source}))
    if entry["figure"]["unit"] == "TFLOPS":
        row["source_work_flops"] = source_work_flops(entry["workload"])
    if len(report.records) == 1:
        est = report.records[0].estimate
        row["parts"] = {"compute_s": est.compute_s, "memory_s": est.memory_s, "overhead_s": est.overhead_s}
    return row


def run_published(root: Path | None = None, entries: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Every published figure against castcore's estimate, with the MdAPE of those estimated."""
    sessions: dict[Any, Any] = {}
    rows = [estimate_published(e, root, sessions) for e in (entries if entries is not None else published_figures())]
    done = [(r["estimated_s"], r["published_s"]) for r in rows if "estimated_s" in r]
    return {"rows": rows, "median_ape_pct": median_ape(done), "estimated": len(done), "skipped": len(rows) - len(done)}


# ---------------------------------------------------------------------------------------------
# The report

def fidelity_report(local: dict[str, Any] | None, published: dict[str, Any] | None) -> dict[str, Any]:
    return {"generated": datetime.datetime.now().isoformat(timespec="seconds"), "machine": platform.platform(),
            "processor": platform.processor() or platform.machine(), "python": platform.python_version(),
            "torch": torch.__version__, "local": local, "published": published}


def _pct(value: float | None, signed: bool = False) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:+.1f}%" if signed else f"{value:.1f}%"


def format_markdown(report: dict[str, Any]) -> str:
    """The report as Markdown: summary tables first, then every operator, then published figures."""
    lines = ["# castcore fidelity report", "",
             f"Generated {report['generated']} on {report['machine']} ({report['processor']}), "
             f"Python {report['python']}, torch {report['torch']}.", ""]
    local = report.get("local")
    if local:
        prof = local["profile"]
        rates = ", ".join(f"{k} {v / 1e9:.1f}" for k, v in prof["mma_flops"].items())
        vec = ", ".join(f"{k} {v / 1e9:.2f}" for k, v in prof["gp_flops"].items())
        s = local["settings"]
        lines += ["## Local: estimated on this machine's calibrated profile vs measured here", "",
                  f"> {local['note']}", "",
                  f"Profile `{prof['name']}`: matmul GFLOP/s {rates}; vector Gop/s {vec}; copy bandwidth "
                  f"{prof['memory_bandwidth'] / 1e9:.1f} GB/s; fixed cost per call {format_seconds(prof['mma_op_cost_s'])}"
                  f" (matrix), {format_seconds(prof['gp_op_cost_s'])} (vector). Measured on {local['runtime']} with "
                  f"{local['threads']} thread(s): {s['warmup']} warm-up calls, then {s['min_repeat']}-{s['max_repeat']} "
                  f"timed calls (about {s['budget_s']} s per op), median. Error = (estimated - measured) / measured; "
                  f"MdAPE = median of |error|. Run took {local['wall_s']:.0f} s.", "",
                  "| family | ops | MdAPE | median error |", "|---|---:|---:|---:|"]
        summary = local["summary"]
        for fam, block in summary["by_family"].items():
            lines.append(f"| {fam} | {block['ops']} | {_pct(block['median_ape_pct'])} | "
                         f"{_pct(block['median_error_pct'], True)} |")
        o = summary["overall"]
        lines += [f"| **all** | {o['ops']} | **{_pct(o['median_ape_pct'])}** | {_pct(o['median_error_pct'], True)} |",
                  "", "| op | family | aten calls | measured (median) | min | estimated | error | bound |",
                  "|---|---|---|---:|---:|---:|---:|---|"]
        for r in local["rows"]:
            aten = ", ".join(dict.fromkeys(a.removeprefix("aten::") for a in r["aten"]))
            lines.append(f"| {r['name']} | {r['family']} | {aten} | {format_seconds(r['measured_s'])} | "
                         f"{format_seconds(r['min_s'])} | {format_seconds(r['estimated_s'])} | "
                         f"{_pct(r['error_pct'], True)} | {r['bound']} |")
        lines.append("")
    published = report.get("published")
    if published:
        lines += ["## Published measurements vs castcore's estimate", "",
                  "Each figure is stored with its source in `castcore/fidelity_published.json`; TFLOPS figures are "
                  "turned into seconds with the source's own work count.", "",
                  f"MdAPE over {published['estimated']} figures: **{_pct(published['median_ape_pct'])}**"
                  + (f" ({published['skipped']} skipped: device not available)" if published["skipped"] else ""), "",
                  "| figure | device | published | as time | estimated | error |", "|---|---|---:|---:|---:|---:|"]
        for r in published["rows"]:
            fig = r["published"]
            est = format_seconds(r["estimated_s"]) if "estimated_s" in r else f"skipped: {r['skipped']}"
            lines.append(f"| {r['description']} | {r['device']} | {fig['value']} {fig['unit']} | "
                         f"{format_seconds(r['published_s'])} | {est} | {_pct(r.get('error_pct'), True)} |")
        lines += ["", "Sources:", ""]
        for r in published["rows"]:
            lines.append(f"- `{r['id']}`: {r['source']['document']} (read {r['source']['read']})."
                         + (f" Note: {r['note']}" if r.get("note") else ""))
        lines.append("")
    return "\n".join(lines)


def write_report(report: dict[str, Any], out_json: str | Path, out_md: str | Path | None = None) -> tuple[Path, Path]:
    """Write the report as JSON and Markdown (next to the JSON unless ``out_md`` says where)."""
    out_json = Path(out_json)
    out_md = Path(out_md) if out_md else out_json.with_suffix(".md")
    out_json.parent.mkdir(parents=True, exist_ok=True)
    out_md.parent.mkdir(parents=True, exist_ok=True)
    out_json.write_text(json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8")
    out_md.write_text(format_markdown(report), encoding="utf-8")
    return out_json, out_md


__all__ = ["FAMILIES", "LOCAL_NOTE", "SuiteOp", "calibrated_profile", "core_session", "estimate_published",
           "estimate_suite_op", "fidelity_report", "format_markdown", "measure_suite_op", "median_ape",
           "operator_suite", "percentage_error", "published_figures", "published_seconds", "published_workload",
           "run_local", "run_published", "source_work_flops", "summarize", "write_report"]
