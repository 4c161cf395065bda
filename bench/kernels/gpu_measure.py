"""Time a fixed grid of single kernels on one NVIDIA GPU with CUDA events; write them as JSONL.

Runs where only Python and torch are installed (no castcore): it imports the standard library and torch.
``python3 gpu_measure.py --out $OUT/kernels.jsonl`` on the GPU machine; ``--list`` prints the grid anywhere.
``build(point, device)`` is also what bench/kernels/score.py calls with ``device="meta"``, so castcore prices
exactly the call timed here.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import re
import statistics
import sys
import tempfile
import time
import warnings

import torch
import torch.nn.functional as F

TOOL = "castcore bench/kernels/gpu_measure.py"
BF16 = torch.bfloat16
FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite float8_e4m3fn
TARGET_S = 0.010  # one timed repeat lasts about this long
MIN_REPS, MAX_REPS, REPEATS, WARMUP = 3, 200, 5, 3
COLD_BYTES = 256 * 2**20  # inputs cycled through for the cold times: several times a Hopper's 50-60 MB L2
KV_CAP_BYTES = 8 * 2**30  # decode points whose K and V exceed this are left out
DEVICE = "cuda"  # the tests point it at the CPU to run the whole script without a GPU
clock = time.monotonic  # the budget's clock (a test moves it)

# (layer, n, k): a [m, k] @ [k, n] product
GEMM_SHAPES = [
    ("llama-3-8b qkv", 6144, 4096),
    ("llama-3-8b o", 4096, 4096),
    ("llama-3-8b gate_up", 28672, 4096),
    ("llama-3-8b down", 4096, 14336),
    ("llama-3-70b tp4 qkv", 2560, 8192),
    ("llama-3-70b tp4 o", 8192, 2048),
    ("llama-3-70b tp4 gate_up", 14336, 8192),
    ("llama-3-70b tp4 down", 8192, 3584),
    ("llama-3 lm_head", 128256, 4096),
]
GEMM_M = [1, 4, 16, 64, 256, 1024, 4096, 16384]
HEADS = [(32, 8), (64, 8), (8, 1), (16, 16)]  # (q heads, kv heads)
HEAD_DIM = 128
PREFILL_SEQ = [512, 2048, 8192, 16384]
MAX_TOKENS = 32768
DECODE_BATCH = [1, 8, 32, 128]
DECODE_KV = [512, 2048, 8192, 32768]
NORM_TOKENS = [1, 16, 256, 4096, 32768]
NORM_HIDDEN = [4096, 8192]
SWIGLU_HALF = 14336

FAMILIES = [
    "gemm_bf16",
    "gemm_fp8",
    "fp8_quantize",
    "attention_prefill",
    "attention_decode",
    "rms_norm",
    "layer_norm",
    "swiglu",
]
OPS = {
    "gemm_bf16": "torch.mm(a, b)",
    "gemm_fp8": "torch._scaled_mm(a, b, scale_a, scale_b, out_dtype=torch.bfloat16)",
    "fp8_quantize": "(x / (x.abs().max().float() / 448)).clamp(-448, 448).to(torch.float8_e4m3fn)",
    "attention_prefill": "torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)",
    "attention_decode": "torch.nn.functional.scaled_dot_product_attention(q, k, v)",
    "rms_norm": "torch.nn.functional.rms_norm(x, (hidden,), weight, eps=1e-6)",
    "layer_norm": "torch.nn.functional.layer_norm(x, (hidden,), weight, bias, eps=1e-5)",
    "swiglu": "torch.nn.functional.silu(x[:, :h]) * x[:, h:]",
}
SHAPE_FIELDS = [
    "layer",
    "m",
    "n",
    "k",
    "batch",
    "seq",
    "kv_len",
    "q_heads",
    "kv_heads",
    "head_dim",
    "tokens",
    "hidden",
]


def grid(families: list[str]) -> list[dict]:
    """Every point of the chosen families, in run order; each a row without its times."""
    points: list[dict] = []
    for family in families:
        points += [{"family": family, "op": OPS[family], **p} for p in _family_points(family)]
    return points


def _family_points(family: str) -> list[dict]:
    if family in ("gemm_bf16", "gemm_fp8"):
        kind = (
            {"dtype": "bfloat16"}
            if family == "gemm_bf16"
            else {"dtype": "float8_e4m3fn", "out_dtype": "bfloat16", "scaling": "per-tensor"}
        )
        return [
            {**kind, "layer": layer, "m": m, "n": n, "k": k} for layer, n, k in GEMM_SHAPES for m in GEMM_M
        ]
    if family == "fp8_quantize":  # the activation of each GEMM above: one point per (m, k)
        ks = sorted({k for _, _, k in GEMM_SHAPES})
        return [
            {"dtype": "bfloat16", "out_dtype": "float8_e4m3fn", "m": m, "k": k} for k in ks for m in GEMM_M
        ]
    if family == "attention_prefill":
        points = []
        for qh, kvh in HEADS:
            for seq in PREFILL_SEQ:
                batches = sorted({b for b in (1, 4, 16, 64) if b * seq <= MAX_TOKENS} | {MAX_TOKENS // seq})
                points += [
                    {
                        "dtype": "bfloat16",
                        "batch": b,
                        "seq": seq,
                        "kv_len": seq,
                        "q_heads": qh,
                        "kv_heads": kvh,
                        "head_dim": HEAD_DIM,
                        "tokens": b * seq,
                    }
                    for b in batches
                ]
        return points
    if family == "attention_decode":
        return [
            {
                "dtype": "bfloat16",
                "batch": b,
                "seq": 1,
                "kv_len": kv,
                "q_heads": qh,
                "kv_heads": kvh,
                "head_dim": HEAD_DIM,
                "tokens": b,
            }
            for (qh, kvh) in HEADS
            for b in DECODE_BATCH
            for kv in DECODE_KV
            if kv_bytes(b, kvh, kv) <= KV_CAP_BYTES
        ]
    if family in ("rms_norm", "layer_norm"):
        return [{"dtype": "bfloat16", "tokens": t, "hidden": h} for h in NORM_HIDDEN for t in NORM_TOKENS]
    if family == "swiglu":
        return [{"dtype": "bfloat16", "tokens": t, "hidden": SWIGLU_HALF} for t in NORM_TOKENS]
    raise ValueError(family)


def kv_bytes(batch: int, kv_heads: int, kv_len: int) -> int:
    return 2 * batch * kv_heads * kv_len * HEAD_DIM * 2  # K and V, bf16


def quick(points: list[dict]) -> list[dict]:
    """First, middle and last point of each family: a smoke run."""
    chosen = []
    for family in dict.fromkeys(p["family"] for p in points):
        mine = [p for p in points if p["family"] == family]
        chosen += [mine[i] for i in sorted({0, len(mine) // 2, len(mine) - 1})]
    return chosen


def label(point: dict) -> str:
    return " ".join(f"{f}={point[f]}" for f in SHAPE_FIELDS if f in point and f != "layer")


# --- the calls, shared with score.py ---------------------------------------------------------------


def mm(a, b):
    return torch.mm(a, b)


def scaled_mm(a, b, scale_a, scale_b):
    return torch._scaled_mm(a, b, scale_a=scale_a, scale_b=scale_b, out_dtype=BF16)


def quantize(x):
    scale = x.abs().max().float() / FP8_MAX
    return (x / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)


def attention(causal: bool, gqa: bool):
    extra = {"enable_gqa": True} if gqa else {}

    def sdpa(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, **extra)

    return sdpa


def rms_norm(x, weight):
    return F.rms_norm(x, (x.shape[-1],), weight, eps=1e-6)


def layer_norm(x, weight, bias):
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps=1e-5)


def swiglu(x):
    h = x.shape[-1] // 2
    return F.silu(x[:, :h]) * x[:, h:]


def build(point: dict, device: str):
    """``(fn, inputs)`` for a point: random normal inputs on a GPU, empty ones on ``meta``.

    An attention point's ``gqa`` says how grouped K/V heads were handled: ``enable_gqa`` (the keyword),
    ``repeat_kv`` (K/V repeated to the query heads before timing), ``none`` (as many K/V heads as query heads).
    """

    def new(*shape, dtype=BF16):
        if device == "meta":
            return torch.empty(shape, dtype=dtype, device="meta")
        return torch.randn(shape, dtype=dtype, device=device)

    family = point["family"]
    if family == "gemm_bf16":
        return mm, (new(point["m"], point["k"]), new(point["k"], point["n"]))
    if family == "gemm_fp8":
        one = torch.ones((), dtype=torch.float32, device=device)
        # _scaled_mm wants A row-major and B column-major: B is a transposed [n, k] tensor.
        a = new(point["m"], point["k"]).to(FP8)
        b = new(point["n"], point["k"]).to(FP8).t()
        return scaled_mm, (a, b, one, one)
    if family == "fp8_quantize":
        return quantize, (new(point["m"], point["k"]),)
    if family.startswith("attention"):
        b, qh, kvh, d = point["batch"], point["q_heads"], point["kv_heads"], point["head_dim"]
        gqa = point.get("gqa", "enable_gqa" if qh != kvh else "none")
        heads = qh if gqa == "repeat_kv" else kvh
        q = new(b, qh, point["seq"], d)
        k, v = new(b, heads, point["kv_len"], d), new(b, heads, point["kv_len"], d)
        return attention(family == "attention_prefill", gqa == "enable_gqa"), (q, k, v)
    if family == "rms_norm":
        return rms_norm, (new(point["tokens"], point["hidden"]), new(point["hidden"]))
    if family == "layer_norm":
        return layer_norm, (new(point["tokens"], point["hidden"]), new(point["hidden"]), new(point["hidden"]))
    if family == "swiglu":
        return swiglu, (new(point["tokens"], 2 * point["hidden"]),)
    raise ValueError(family)


# --- timing ----------------------------------------------------------------------------------------


def _events_time(fn, sets, reps: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for i in range(reps):
        fn(*sets[i % len(sets)])
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / reps


def _graph_time(fn, sets, reps: int) -> float | None:
    """Per-call time of ``reps`` calls replayed from one CUDA graph: launch overhead gone; None if capture fails."""
    try:
        side = torch.cuda.Stream()  # warm up on a side stream, as torch.cuda.graphs advises
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn(*sets[0])
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for i in range(reps):
                fn(*sets[i % len(sets)])
        graph.replay()
        torch.cuda.synchronize()
        times = []
        for _ in range(REPEATS):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3 / reps)
        return statistics.median(times)
    except Exception as exc:  # any capture failure: record null, keep going
        print(f" [graph capture failed: {type(exc).__name__}: {_first_line(exc)}]", end="", flush=True)
        torch.cuda.synchronize()
        return None


def time_point(fn, sets) -> dict:
    """Back to back on the same inputs (``time_s``, ``graph_time_s``: what fits in L2 stays there), and cycling
    through ``sets``, copies enough to overflow L2 (``cold_*``: every call reads its inputs from memory, as a
    serving step reads weights too large for L2)."""
    hot = sets[:1]
    for _ in range(WARMUP):
        fn(*hot[0])
    torch.cuda.synchronize()
    once = _events_time(fn, hot, MIN_REPS)
    reps = max(MIN_REPS, min(MAX_REPS, math.ceil(TARGET_S / max(once, 1e-9))))
    return {
        "time_s": statistics.median(_events_time(fn, hot, reps) for _ in range(REPEATS)),
        "graph_time_s": _graph_time(fn, hot, reps),
        "cold_time_s": statistics.median(_events_time(fn, sets, reps) for _ in range(REPEATS)),
        "cold_graph_time_s": _graph_time(fn, sets, reps),
        "copies": len(sets),
        "reps": reps,
    }


def input_sets(row: dict, inputs: tuple) -> list[tuple]:
    """``inputs`` and as many fresh copies as make ``COLD_BYTES`` together (at most ``MAX_REPS``)."""
    size = sum(t.numel() * t.element_size() for t in inputs if isinstance(t, torch.Tensor))
    copies = min(MAX_REPS, max(1, math.ceil(COLD_BYTES / max(size, 1))))
    return [inputs, *(build(row, DEVICE)[1] for _ in range(copies - 1))]


# --- attention backends ----------------------------------------------------------------------------


def _has_enable_gqa() -> bool:
    q = torch.zeros(1, 2, 4, 8, device=DEVICE)
    kv = torch.zeros(1, 1, 4, 8, device=DEVICE)
    try:
        F.scaled_dot_product_attention(q, kv, kv, enable_gqa=True)
    except TypeError:
        return False
    except RuntimeError:  # the keyword was taken; a kernel refused these tiny tensors
        pass
    return True


def _pick_backend(fn, inputs):
    """The first backend that runs this call, flash first; ``(name, context factory)``."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        return "default", None
    order = ["FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH"]
    for name in order:
        backend = getattr(SDPBackend, name, None)
        if backend is None:
            continue
        try:
            with warnings.catch_warnings(), sdpa_kernel(backend):
                warnings.simplefilter("ignore")  # torch warns why each backend it skips cannot run
                fn(*inputs)
            torch.cuda.synchronize()
            return name.lower(), lambda b=backend: sdpa_kernel(b)
        except RuntimeError:
            continue
    return "default", None


# --- the run ---------------------------------------------------------------------------------------


def measure(point: dict, gqa_keyword: bool) -> dict | None:
    """Time one point; the finished row, or None (with a printed line) when it cannot run here."""
    row = dict(point)
    if point["family"].startswith("attention"):
        if point["q_heads"] != point["kv_heads"]:
            row["gqa"] = "enable_gqa" if gqa_keyword else "repeat_kv"
            if not gqa_keyword and kv_bytes(point["batch"], point["q_heads"], point["kv_len"]) > KV_CAP_BYTES:
                print(f": skipped, K/V repeated to {point['q_heads']} heads exceed 8 GiB", flush=True)
                return None
        else:
            row["gqa"] = "none"
        row["causal"] = point["family"] == "attention_prefill"
    fn, inputs = build(row, DEVICE)
    sets = input_sets(row, inputs)
    if row["family"].startswith("attention"):
        row["backend"], context = _pick_backend(fn, inputs)
        if context is not None:
            with context():
                row.update(time_point(fn, sets))
            return row
    row.update(time_point(fn, sets))
    return row


def provenance(started: datetime.datetime) -> dict:
    props = torch.cuda.get_device_properties(0)
    return {
        "gpu": torch.cuda.get_device_name(0),
        "sm_count": props.multi_processor_count,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "date": started.isoformat(timespec="seconds"),
        "tool": TOOL,
    }


def _fp8_gemm_works() -> str | None:
    """None if torch._scaled_mm runs here, else why not."""
    try:
        a = torch.zeros(16, 32, device=DEVICE).to(FP8)
        b = torch.zeros(16, 32, device=DEVICE).to(FP8).t()
        one = torch.ones((), device=DEVICE)
        scaled_mm(a, b, one, one)
        torch.cuda.synchronize()
        return None
    except (RuntimeError, AttributeError, TypeError) as exc:
        return f"{type(exc).__name__}: {_first_line(exc)}"


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0][:160] if lines else ""


def run(points: list[dict], budget_s: float) -> list[dict]:
    started = clock()
    gqa_keyword = _has_enable_gqa()
    if not gqa_keyword:
        print(
            "enable_gqa is not a keyword of this torch's SDPA: grouped K/V are repeated before timing",
            flush=True,
        )
    skip = set()
    if any(p["family"] == "gemm_fp8" for p in points) and (why := _fp8_gemm_works()):
        print(f"gemm_fp8: skipped, torch._scaled_mm does not run on this GPU ({why})", flush=True)
        skip.add("gemm_fp8")
    rows, family = [], None
    for i, point in enumerate(points, 1):
        if point["family"] in skip:
            continue
        spent = clock() - started
        if spent > budget_s:
            print(
                f"budget of {budget_s:g} s spent after {spent:.0f} s: {i - 1} of {len(points)} points tried, "
                f"the rest left out",
                flush=True,
            )
            break
        if point["family"] != family:
            family = point["family"]
            torch.cuda.empty_cache()  # free the last family's inputs and graph pools
        layer = f" ({point['layer']})" if "layer" in point else ""
        print(f"[{i}/{len(points)} {spent:5.1f}s] {family} {label(point)}{layer}", end="", flush=True)
        try:
            row = measure(point, gqa_keyword)
        except RuntimeError as exc:  # out of memory or a kernel this GPU lacks: say so, go on
            print(f": failed, {type(exc).__name__}: {_first_line(exc)}", flush=True)
            row = None
        if row is None:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()  # after the except block, so the traceback no longer holds the inputs
            continue
        graph = f"{row['graph_time_s'] * 1e6:.2f} us" if row["graph_time_s"] is not None else "n/a"
        extra = f" {row['backend']}" if "backend" in row else ""
        print(f": {row['time_s'] * 1e6:.2f} us (graph {graph}) x{row['reps']}{extra}", flush=True)
        rows.append(row)
    return rows


def write_atomically(path: str, rows: list[dict]) -> None:
    """Temp file in the same folder, then rename: a reader never sees half a file."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".kernels-", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "w") as file:
            for row in rows:
                file.write(json.dumps(row) + "\n")
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="JSONL to write (default kernels-<gpu>-<date>.jsonl here)")
    parser.add_argument("--families", help=f"comma-separated subset of: {','.join(FAMILIES)}")
    parser.add_argument("--quick", action="store_true", help="first, middle and last point of each family")
    parser.add_argument(
        "--budget-s", type=float, default=420.0, help="stop adding points after this many seconds"
    )
    parser.add_argument("--list", action="store_true", help="print the grid and exit (no GPU needed)")
    args = parser.parse_args(argv)

    families = FAMILIES
    if args.families:
        families = [f.strip() for f in args.families.split(",") if f.strip()]
        unknown = [f for f in families if f not in FAMILIES]
        if unknown:
            print(
                f"gpu_measure.py: unknown family {', '.join(unknown)}; known: {', '.join(FAMILIES)}",
                file=sys.stderr,
            )
            return 2
    points = grid(families)
    if args.quick:
        points = quick(points)
    if args.list:
        for p in points:
            print(f"{p['family']:<18} {label(p)}" + (f"  ({p['layer']})" if "layer" in p else ""))
        counts = ", ".join(f"{f} {sum(p['family'] == f for p in points)}" for f in families)
        print(f"{len(points)} points: {counts}")
        return 0
    if not torch.cuda.is_available():
        print(
            f"gpu_measure.py: CUDA is not available to torch {torch.__version__} (cuda {torch.version.cuda}); "
            "run it on a machine with an NVIDIA GPU, or use --list",
            file=sys.stderr,
        )
        return 2

    started = datetime.datetime.now(datetime.timezone.utc)
    stamp = provenance(started)
    out = args.out or f"kernels-{slug(stamp['gpu'])}-{started.date().isoformat()}.jsonl"
    print(
        f"{stamp['gpu']} ({stamp['sm_count']} SMs), torch {stamp['torch']}, CUDA {stamp['cuda']}: "
        f"{len(points)} points, budget {args.budget_s:g} s -> {out}",
        flush=True,
    )
    t0 = time.monotonic()
    with torch.inference_mode():
        rows = run(points, args.budget_s)
    rows = [{**row, **stamp} for row in rows]
    write_atomically(out, rows)
    print(f"wrote {len(rows)} of {len(points)} points to {out} in {time.monotonic() - t0:.0f} s", flush=True)
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
