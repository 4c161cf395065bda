"""Score castcore's kernel estimates against the kernel latencies NVIDIA measured in vLLM and SGLang, shipped in
the aiconfigurator-core wheel (Apache-2.0, ``systems/data/<gpu>/...``). Only the vLLM and SGLang tables are read.

- engine all-reduce: ``comm/{vllm,sglang}/*/custom_allreduce_perf.parquet``, CUDA-graph rows up to the profile's
  ``engine_allreduce_max_bytes``, against castpack-collectives' one_shot / two_shot. Fitted: the vLLM tables of
  H100 SXM, A100 SXM and B200. Held out: every SGLang table, and H200's vLLM tables (H200 takes the H100 fit). Each
  point is also priced with a collective library's algorithms alone (castcore before the engine kernels).
- DeepEP low-latency dispatch and combine: ``comm/sglang/*/wideep_deepep_ll_perf.parquet`` (FP8 dispatch with a
  scale per 128 columns, BF16 combine), against ``--ep-kernels low-latency``. Fitted: H100's one-node rows. Held
  out: H100's 2- to 8-node rows and every H200 row (H200 takes the H100 fit).
- GEMM: ``gemm/{vllm,sglang}/*/gemm_perf.parquet``, a seeded sample of 300 a dtype and table, priced as castcore
  runs a linear layer: bf16 ``F.linear``; fp8 per-tensor the activation quantize plus ``torch._scaled_mm``; fp8
  block-scaled the 1 x 128 group quantize plus the block-scaled ``torch._scaled_mm``. bf16 sets no constant (its
  efficiency comes from published matmul figures): every bf16 point is held out. fp8's ``mma_efficiency`` was fitted
  to the vLLM tables of H100, B200 and L40S; the SGLang tables, H200's and every block-scaled row are held out.
  vLLM's block-scaled rows are left out: its smallest block-scaled products take 57 us or more on H100 and 240 us on
  B200 whatever the kernel (DeepGEMM, FlashInfer, CUTLASS), ten times SGLang's DeepGEMM rows of the same shapes: a
  floor outside any kernel. Their count is printed.
- fused MoE: ``moe/{vllm,sglang}/*/moe_perf.parquet``, bf16 rows without expert parallelism (an expert-parallel
  rank's share of the routing is the engine's own choice, and castcore prices EP with its dispatch and combine),
  a seeded sample of 300 a table and routing, priced as castcore runs an experts block: ``moe_permute``, the two
  grouped GEMMs with ``silu_and_mul`` between, ``moe_unpermute``; a power-law row with ``--expert-skew`` at its
  exponent (castcore.recording.routing). Fitted (``grouped_mm_efficiency``): the balanced rows of H100's, B200's
  and L40S's vLLM tables and of A100's SGLang table (its vLLM table has no balanced rows). Held out: the rest, and
  every power-law row (the skew model sets no constant).
- attention: ``attention/{vllm,sglang}/*/{context,generation}_attention_perf.parquet``, bf16 with a bf16 cache and
  no window (a seeded sample of 300 a table), and 150 a table of each measured variant: an fp8 KV cache, fp8
  attention (SGLang's fp8 prefill) and a sliding window. The measured layer ropes the new keys and queries and writes the keys
  and values to the cache before it attends, so it is priced as castcore prices those steps in a model:
  ``castcore::rotary_embedding``, the two cache writes (cast to the cache's dtype), ``castcore::attention``.
  Fitted: H100's and A100's vLLM bf16 rows (``attention_op_cost_s``, ``attention_wave_s``). Held out: the rest,
  every variant included; B200 has no fitted attention constant.
- DeepSeek's latent-attention module: ``mla/vllm/*/mla_generation_module_perf.parquet`` (H100, H200), every row
  held out and no constant fitted; how it is read and why nothing is fitted to it: bench/kernels/aic_mla.py.

``nox -s kernels`` runs this with the wheel installed and ``--check``: it fails when a family's held-out median
|error| rose by more than two points against the committed ``bench/results/aic_tables.json`` (bench/kernels/
heldout.py), and writes nothing. ``nox -s kernels -- --write`` (or ``python bench/kernels/aic_tables.py`` where the
wheel is installed) rewrites the markdown report and that JSON.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from importlib import resources
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # score.py sits beside this file
import aic_mla  # noqa: E402
import heldout  # noqa: E402
from score import WITHIN, quantile  # noqa: E402

PROFILES = {
    "h100_sxm": "h100-sxm5-80gb",
    "h200_sxm": "h200-sxm",
    "a100_sxm": "a100-sxm4-80gb",
    "b200_sxm": "b200",
    "l40s": "l40s",
}
# where the all-reduce constants came from
FITTED = {
    ("h100_sxm", "vllm"),
    ("a100_sxm", "vllm"),
    ("b200_sxm", "vllm"),
    ("l40s", "vllm"),
}
ATTENTION_FITTED = {("h100_sxm", "vllm"), ("a100_sxm", "vllm")}  # attention_op_cost_s and attention_wave_s
# (A100's vLLM table has power-law rows only)
MOE_FITTED = {
    ("h100_sxm", "vllm"),
    ("b200_sxm", "vllm"),
    ("l40s", "vllm"),  # grouped_mm_efficiency: balanced rows
    ("a100_sxm", "sglang"),
}
# where fp8's mma_efficiency came from
GEMM_FITTED = {
    ("h100_sxm", "vllm"),
    ("b200_sxm", "vllm"),
    ("l40s", "vllm"),
}


def table(system: str, family: str, engine: str, name: str) -> list[dict]:
    """Every version's rows of one measured table."""
    import pyarrow.parquet as pq

    root = resources.files("aiconfigurator_core") / "systems" / "data" / system / family / engine
    rows = []
    for version in sorted(p.name for p in root.iterdir()) if root.is_dir() else []:
        if (root / version / name).is_file():
            rows += [
                {**r, "table": f"{system}/{family}/{engine}/{version}"}
                for r in pq.read_table(str(root / version / name)).to_pylist()
            ]
    return rows


def score_allreduce() -> list[dict]:
    import castcore
    from castpack_collectives.alphabeta import ENGINE, NCCL, collective_cost

    session = castcore.Session()
    results = []
    for system, name in PROFILES.items():
        profile = session.device(name)
        level = profile.interconnect[0]
        for engine in ("vllm", "sglang"):
            rows = table(system, "comm", engine, "custom_allreduce_perf.parquet")
            for row in (
                r for r in rows if "graph" in str(r.get("backend", r.get("kernel_source", ""))).lower()
            ):
                size, n, seconds = float(row["message_size"]), int(row["num_gpus"]), row["latency"] * 1e-3
                if size > level.engine_allreduce_max_bytes or n > level.devices:
                    continue
                priced = {
                    kind: collective_cost(
                        "all_reduce", size, n, profile.interconnect, profile.comm_op_cost_s, algorithms
                    ).time_s
                    for kind, algorithms in (("engine", ENGINE), ("library", NCCL))
                }
                results.append(
                    {
                        "family": "engine all-reduce",
                        "gpu": system,
                        "engine": engine,
                        "point": f"{row['table']} {n} GPUs {int(size)} B",
                        "measured_s": seconds,
                        "split": "fitted" if (system, engine) in FITTED else "held out",
                        "error": priced["engine"] / seconds - 1,
                        "library_error": priced["library"] / seconds - 1,
                        "estimated_s": priced["engine"],
                    }
                )
    return results


def score_low_latency() -> list[dict]:
    import castcore
    from castpack_collectives.alphabeta import collective_cost

    session = castcore.Session()
    results = []
    for system in ("h100_sxm", "h200_sxm"):
        profile = session.device(PROFILES[system])
        for row in table(system, "comm", "sglang", "wideep_deepep_ll_perf.parquet"):
            hidden, rows = row["hidden_size"], row["num_token"] * row["num_topk"]
            for kind, row_bytes in (("dispatch", hidden + hidden // 128 * 4), ("combine", 2 * hidden)):
                ranks, seconds = 8 * row["node_num"], row[f"{kind}_avg_t_us"] * 1e-6
                cost = collective_cost(
                    "all_to_all",
                    rows * row_bytes,
                    ranks,
                    profile.interconnect,
                    profile.low_latency_a2a_cost_s,
                    ("low_latency",),
                )
                results.append(
                    {
                        "family": "DeepEP low-latency",
                        "gpu": system,
                        "engine": "sglang",
                        "point": f"{row['table']} {kind} {ranks} ranks {row['num_token']} tokens x top-"
                        f"{row['num_topk']}, hidden {hidden}",
                        "measured_s": seconds,
                        "split": "fitted" if (system, row["node_num"]) == ("h100_sxm", 1) else "held out",
                        "error": cost.time_s / seconds - 1,
                        "estimated_s": cost.time_s,
                    }
                )
    return results


def _linear(dtype: str):
    """The function castcore's linear layer runs for a weight ``dtype``, and the extra tensors it takes."""
    import torch

    ops = torch.ops.castcore

    def bf16(x, w):
        return torch.nn.functional.linear(x, w)

    def fp8(x, w, scale):
        codes, row_scale = ops.quantize_per_token(x, torch.float8_e4m3fn)
        return torch._scaled_mm(codes, w.t(), row_scale, scale, out_dtype=torch.bfloat16)

    def fp8_block(x, w, scale):
        codes, group_scale = ops.quantize_per_token_group(x, 128, torch.float8_e4m3fn)
        return torch._scaled_mm(codes, w.t(), group_scale, scale.t(), out_dtype=torch.bfloat16)

    def scales(n, k):
        shape = {"fp8": (1, n), "fp8_block": (-(-n // 128), -(-k // 128))}.get(dtype)
        return (torch.empty(shape, device="meta"),) if shape else ()

    return {"bfloat16": bf16, "fp8": fp8, "fp8_block": fp8_block}[dtype], scales


def score_gemm(sample: int = 300) -> list[dict]:
    import random

    import torch

    import castcore

    session = castcore.Session()
    results, floored = [], 0
    names = {"bfloat16": "GEMM bf16", "fp8": "GEMM fp8", "fp8_block": "GEMM fp8 block-scaled"}
    for system, device in PROFILES.items():
        for engine in ("vllm", "sglang"):
            rows = table(system, "gemm", engine, "gemm_perf.parquet")
            random.Random(0).shuffle(rows)
            for dtype, family in names.items():
                mine = [r for r in rows if r["gemm_dtype"] == dtype]
                if dtype == "fp8_block" and engine == "vllm":
                    floored += len(mine)
                    continue
                fn, scales = _linear(dtype)
                weight = torch.bfloat16 if dtype == "bfloat16" else torch.float8_e4m3fn
                for row in mine[:sample]:
                    m, n, k = row["m"], row["n"], row["k"]
                    x = torch.empty(m, k, dtype=torch.bfloat16, device="meta")
                    w = torch.empty(n, k, dtype=weight, device="meta")
                    estimated = session.estimate(fn, x, w, *scales(n, k), device=device).time_s
                    seconds = row["latency"] * 1e-3
                    fitted = dtype == "fp8" and (system, engine) in GEMM_FITTED
                    results.append(
                        {
                            "family": family,
                            "gpu": system,
                            "engine": engine,
                            "point": f"{row['table']} {dtype} m {m} n {n} k {k}",
                            "measured_s": seconds,
                            "split": "fitted" if fitted else "held out",
                            "error": estimated / seconds - 1,
                            "estimated_s": estimated,
                        }
                    )
    print(
        f"aic_tables: left out {floored} vLLM block-scaled GEMM rows (a floor of 57 us and more)",
        file=sys.stderr,
    )
    return results


def _experts_block(hidden, expert_ids, weights, gate_up, down):
    import torch

    ops = torch.ops.castcore
    rows, order, offsets = ops.moe_permute(hidden, expert_ids, gate_up.shape[0])
    rows = ops.silu_and_mul(torch._grouped_mm(rows, gate_up.transpose(-2, -1), offs=offsets))
    return ops.moe_unpermute(torch._grouped_mm(rows, down.transpose(-2, -1), offs=offsets), order, weights)


def score_moe(sample: int = 300) -> list[dict]:
    import random

    import torch

    import castcore
    from castcore.pack import expert_routing

    session = castcore.Session()
    results = []

    def meta(*shape, dtype=torch.bfloat16):
        return torch.empty(shape, dtype=dtype, device="meta")

    for system, device in PROFILES.items():
        for engine in ("vllm", "sglang"):
            # grouped GEMM rows 16-byte aligned
            rows = [
                r
                for r in table(system, "moe", engine, "moe_perf.parquet")
                if r["moe_dtype"] == "bfloat16"
                and r["moe_ep_size"] == 1
                and r["inter_size"] % (8 * r["moe_tp_size"]) == 0
            ]
            random.Random(0).shuffle(rows)
            for routing in ("balanced", "power law"):
                mine = [r for r in rows if (r["distribution"] == "balanced") == (routing == "balanced")][
                    :sample
                ]
                for row in mine:
                    t, k, experts, hidden = (
                        row["num_tokens"],
                        row["topk"],
                        row["num_experts"],
                        row["hidden_size"],
                    )
                    inter = row["inter_size"] // row["moe_tp_size"]
                    skew = 0.0 if routing == "balanced" else float(row["distribution"].rsplit("_", 1)[1])
                    # the table's power law, as --expert-skew prices it
                    with expert_routing(skew=skew, top_k=k):
                        estimated = session.estimate(
                            _experts_block,
                            meta(t, hidden),
                            meta(t, k, dtype=torch.long),
                            meta(t, k, dtype=torch.float32),
                            meta(experts, 2 * inter, hidden),
                            meta(experts, hidden, inter),
                            device=device,
                        ).time_s
                    seconds = row["latency"] * 1e-3
                    fitted = routing == "balanced" and (system, engine) in MOE_FITTED
                    results.append(
                        {
                            "family": f"fused MoE bf16, {routing} routing",
                            "gpu": system,
                            "engine": engine,
                            "point": f"{row['table']} {row['distribution']} {t} tokens top-{k} of {experts}, "
                            f"hidden {hidden}, inter {inter}",
                            "measured_s": seconds,
                            "split": "fitted" if fitted else "held out",
                            "error": estimated / seconds - 1,
                            "estimated_s": estimated,
                        }
                    )
    return results


# The measured attention variants: (attention dtype, cache dtype, windowed) -> the family's suffix
ATTENTION_VARIANTS = {
    ("bfloat16", "bfloat16", False): "",
    ("bfloat16", "fp8", False): ", fp8 KV cache",
    ("fp8", "fp8", False): ", fp8",
    ("bfloat16", "bfloat16", True): ", sliding window",
}


def score_attention(sample: int = 300) -> list[dict]:
    import random

    import torch

    import castcore

    session = castcore.Session()
    results = []
    fp8 = torch.float8_e4m3fn

    def layer(q, k, v, k_cache, v_cache, cos, sin, positions, window):
        q, k = torch.ops.castcore.rotary_embedding(q, k, cos, sin)
        if k.dtype != k_cache.dtype:  # written to the cache in its dtype, as vLLM's reshape_and_cache does
            k, v = k.to(k_cache.dtype), v.to(v_cache.dtype)
        k_cache.index_copy_(2, positions, k)
        v_cache.index_copy_(2, positions, v)
        if q.dtype != k_cache.dtype and k_cache.dtype == fp8 and fp8_queries:
            q = q.to(fp8)
        return torch.ops.castcore.attention(q, k_cache, v_cache, q.shape[-1] ** -0.5, True, window, 0.0)

    def meta(*shape, dtype=torch.bfloat16):
        return torch.empty(shape, dtype=dtype, device="meta")

    for system in ("h100_sxm", "h200_sxm", "a100_sxm", "b200_sxm"):
        for engine in ("vllm", "sglang"):
            for phase in ("context", "generation"):
                rows = table(system, "attention", engine, f"{phase}_attention_perf.parquet")
                random.Random(0).shuffle(rows)
                for (attn, cache, windowed), suffix in ATTENTION_VARIANTS.items():
                    fp8_queries = attn == "fp8"
                    mine = [
                        r
                        for r in rows
                        if (r["attn_dtype"], r["kv_cache_dtype"], r.get("window_size", 0) > 0)
                        == (attn, cache, windowed)
                    ][: sample if not suffix else sample // 2]
                    for row in mine:
                        b, s, heads, kv, dim = (
                            row[k]
                            for k in ("batch_size", "isl", "num_heads", "num_key_value_heads", "head_dim")
                        )
                        q_len, kv_len = (s, s) if phase == "context" else (1, s + row["step"])
                        new, kind = meta(b, kv, q_len, dim), fp8 if cache == "fp8" else torch.bfloat16
                        estimated = session.estimate(
                            layer,
                            meta(b, heads, q_len, dim),
                            new,
                            new,
                            meta(b, kv, kv_len, dim, dtype=kind),
                            meta(b, kv, kv_len, dim, dtype=kind),
                            meta(b, q_len, dim),
                            meta(b, q_len, dim),
                            meta(q_len, dtype=torch.long),
                            row.get("window_size", 0),
                            device=PROFILES[system],
                        ).time_s
                        seconds = row["latency"] * 1e-3
                        fitted = not suffix and (system, engine) in ATTENTION_FITTED
                        results.append(
                            {
                                "family": f"attention {phase}{suffix}",
                                "gpu": system,
                                "engine": engine,
                                "point": f"{row['table']} batch {b} len {s} heads {heads}/{kv} dim {dim}"
                                + (f" window {row['window_size']}" if windowed else ""),
                                "measured_s": seconds,
                                "split": "fitted" if fitted else "held out",
                                "error": estimated / seconds - 1,
                                "estimated_s": estimated,
                            }
                        )
    return results


def summary(results: list[dict], key: str = "error") -> dict:
    errors = [r[key] for r in results]
    absolute = [abs(e) for e in errors]
    return {
        "points": len(errors),
        "median": statistics.median(absolute),
        "p90": quantile(absolute, 0.9),
        "bias": statistics.median(errors),
        "within": sum(e <= WITHIN for e in absolute) / len(absolute),
    }


def markdown(results: list[dict]) -> str:
    out = [
        "# castcore against NVIDIA's measured vLLM and SGLang kernels",
        "",
        "Measured: aiconfigurator-core 0.12.0's vLLM and SGLang tables (how each family is read: "
        "bench/kernels/aic_tables.py). castcore: castpack-nvidia's profiles, castpack-collectives for the "
        "collectives. Error: castcore / measured - 1; bias: the median error. Fitted points set a profile constant; "
        "held-out points set none.",
        "",
        "| family | points | count | median \\|error\\| | p90 \\|error\\| | bias | within 20% |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for family in dict.fromkeys(r["family"] for r in results):
        for split in ("fitted", "held out"):
            mine = [r for r in results if (r["family"], r["split"]) == (family, split)]
            groups = {
                "**all**": mine,
                **{
                    f"{g} {e}": [r for r in mine if (r["gpu"], r["engine"]) == (g, e)]
                    for g in PROFILES
                    for e in ("vllm", "sglang")
                },
            }
            for label, group in groups.items():
                if group:
                    s = summary(group)
                    out.append(
                        f"| {family} | {split}: {label} | {s['points']} | {s['median']:.1%} | {s['p90']:.1%} "
                        f"| {s['bias']:+.1%} | {s['within']:.0%} |"
                    )
    library = [r for r in results if "library_error" in r]
    if library:
        s = summary(library, "library_error")
        out += [
            "",
            f"The engine all-reduce points priced with a collective library's algorithms alone, as castcore "
            f"priced them before: {s['median']:.0%} median |error|, {s['bias']:+.0%} bias.",
        ]
    for family in dict.fromkeys(r["family"] for r in results):
        worst = sorted(
            (r for r in results if r["family"] == family and r["split"] == "held out"),
            key=lambda r: -abs(r["error"]),
        )[:5]
        out += [
            "",
            f"{family}, the worst held-out points:",
            "",
            "| point | measured | castcore | error |",
            "|---|---:|---:|---:|",
        ]
        out += [
            f"| {r['point']} | {r['measured_s'] * 1e6:.2f} us | {r['estimated_s'] * 1e6:.2f} us | "
            f"{r['error']:+.1%} |"
            for r in worst
        ]
    return "\n".join(out) + "\n"


def band_table(per_gpu: dict[str, dict[str, float]]) -> str:
    """The held-out medians per GPU and band family: what castpack-nvidia's profiles carry as [error_bands]."""
    families = sorted({band for found in per_gpu.values() for band in found})
    out = [
        "",
        "Error bands (held-out median |error| per GPU, as castpack-nvidia's `[error_bands]` carry them):",
        "",
        "| GPU | " + " | ".join(families) + " |",
        "|---|" + "---:|" * len(families),
    ]
    for gpu, found in per_gpu.items():
        out.append(
            f"| {gpu} | " + " | ".join(f"{found[f]:.1%}" if f in found else "-" for f in families) + " |"
        )
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/results/aic_tables.md", help="the markdown report to write")
    parser.add_argument(
        "--medians",
        default="bench/results/aic_tables.json",
        help="the held-out medians: written beside the report, or checked against with --check",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 if a held-out median rose by more than 2 points against --medians",
    )
    args = parser.parse_args(argv)
    if args.check and not Path(args.medians).is_file():
        print(
            f"aic_tables: no committed medians at {args.medians}; run without --check to write them",
            file=sys.stderr,
        )
        return 2
    try:
        results = (
            score_allreduce()
            + score_low_latency()
            + score_gemm()
            + score_moe()
            + score_attention()
            + aic_mla.score_mla_module(table)
        )
    except ModuleNotFoundError as exc:
        print(
            f"aic_tables: {exc.name} is not installed; run nox -s kernels, which installs "
            "aiconfigurator-core and the packs",
            file=sys.stderr,
        )
        return 2
    if not results:
        print("aic_tables: no measured rows found in aiconfigurator-core", file=sys.stderr)
        return 2
    fresh = heldout.held_out_medians(results)
    if args.check:
        committed = heldout.read(args.medians)
        for family, now in fresh.items():
            before = committed.get(family, {}).get("median")
            print(
                f"{family}: held-out median {now['median']:.1%} over {now['points']} points"
                + (f" (committed {before:.1%})" if before is not None else " (new)")
            )
        problems = heldout.rises(committed, fresh)
        for line in problems:
            print(f"aic_tables: {line}", file=sys.stderr)
        return 1 if problems else 0
    per_gpu = heldout.bands(results)
    text = markdown(results) + band_table(per_gpu)
    Path(args.out).write_text(text, encoding="utf-8")
    heldout.write(args.medians, fresh, per_gpu)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
