"""Score castcore's kernel estimates against the kernel latencies NVIDIA measured in vLLM and SGLang, shipped in
the aiconfigurator-core wheel (Apache-2.0, ``systems/data/<gpu>/...``). Only the vLLM and SGLang tables are read.

- engine all-reduce: ``comm/{vllm,sglang}/*/custom_allreduce_perf.parquet``, CUDA-graph rows up to the profile's
  ``engine_allreduce_max_bytes``, against castpack-collectives' one_shot / two_shot. Fitted: the vLLM tables of
  H100 SXM, A100 SXM and B200. Held out: every SGLang table, and H200's vLLM tables (H200 takes the H100 fit). Each
  point is also priced with a collective library's algorithms alone (castcore before the engine kernels).
- DeepEP low-latency dispatch and combine: ``comm/sglang/*/wideep_deepep_ll_perf.parquet`` (FP8 dispatch with a
  scale per 128 columns, BF16 combine), against ``--ep-kernels low-latency``. Fitted: H100's one-node rows. Held
  out: H100's 2- to 8-node rows and every H200 row (H200 takes the H100 fit).
- attention: ``attention/{vllm,sglang}/*/{context,generation}_attention_perf.parquet``, bf16 with a bf16 cache and
  no window, a seeded sample of 300 a table, against one ``castcore::attention`` call. Fitted: H100's vLLM
  tables. Held out: H100's SGLang tables and H200's.

``nox -s kernels`` runs this with the wheel installed; ``python bench/kernels/aic_tables.py --out FILE.md`` where
it is installed already. Writes the markdown report and prints it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from importlib import resources
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # score.py sits beside this file
from score import WITHIN, quantile  # noqa: E402

PROFILES = {"h100_sxm": "h100-sxm5-80gb", "h200_sxm": "h200-sxm", "a100_sxm": "a100-sxm4-80gb", "b200_sxm": "b200",
            "l40s": "l40s"}
FITTED = {("h100_sxm", "vllm"), ("a100_sxm", "vllm"), ("b200_sxm", "vllm"), ("l40s", "vllm")}  # where the profile constants came from


def table(system: str, family: str, engine: str, name: str) -> list[dict]:
    """Every version's rows of one measured table."""
    import pyarrow.parquet as pq

    root = resources.files("aiconfigurator_core") / "systems" / "data" / system / family / engine
    rows = []
    for version in sorted(p.name for p in root.iterdir()) if root.is_dir() else []:
        if (root / version / name).is_file():
            rows += [{**r, "table": f"{system}/{family}/{engine}/{version}"}
                     for r in pq.read_table(str(root / version / name)).to_pylist()]
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
            for row in (r for r in rows if "graph" in str(r.get("backend", r.get("kernel_source", ""))).lower()):
                size, n, seconds = float(row["message_size"]), int(row["num_gpus"]), row["latency"] * 1e-3
                if size > level.engine_allreduce_max_bytes or n > level.devices:
                    continue
                priced = {kind: collective_cost("all_reduce", size, n, profile.interconnect, profile.comm_op_cost_s,
                                                algorithms).time_s for kind, algorithms in (("engine", ENGINE),
                                                                                          ("library", NCCL))}
                results.append({"family": "engine all-reduce", "gpu": system, "engine": engine,
                                "point": f"{row['table']} {n} GPUs {int(size)} B", "measured_s": seconds,
                                "split": "fitted" if (system, engine) in FITTED else "held out",
                                "error": priced["engine"] / seconds - 1, "library_error": priced["library"] / seconds - 1,
                                "estimated_s": priced["engine"]})
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
                cost = collective_cost("all_to_all", rows * row_bytes, ranks, profile.interconnect,
                                       profile.low_latency_a2a_cost_s, ("low_latency",))
                results.append({"family": "DeepEP low-latency", "gpu": system, "engine": "sglang",
                                "point": f"{row['table']} {kind} {ranks} ranks {row['num_token']} tokens x top-"
                                         f"{row['num_topk']}, hidden {hidden}", "measured_s": seconds,
                                "split": "fitted" if (system, row["node_num"]) == ("h100_sxm", 1) else "held out",
                                "error": cost.time_s / seconds - 1, "estimated_s": cost.time_s})
    return results


def score_attention(sample: int = 300) -> list[dict]:
    import random

    import torch

    import castcore

    session = castcore.Session()
    results = []

    def call(q, k, v):
        return torch.ops.castcore.attention(q, k, v, q.shape[-1] ** -0.5, True, 0, 0.0)

    for system in ("h100_sxm", "h200_sxm"):
        for engine in ("vllm", "sglang"):
            for phase in ("context", "generation"):
                rows = [r for r in table(system, "attention", engine, f"{phase}_attention_perf.parquet")
                        if (r["attn_dtype"], r["kv_cache_dtype"], r["window_size"]) == ("bfloat16", "bfloat16", 0)]
                random.Random(0).shuffle(rows)
                for row in rows[:sample]:
                    b, s, heads, kv, dim = (row[k] for k in ("batch_size", "isl", "num_heads", "num_key_value_heads",
                                                             "head_dim"))
                    q_len, kv_len = (s, s) if phase == "context" else (1, s + row["step"])
                    q = torch.empty(b, heads, q_len, dim, dtype=torch.bfloat16, device="meta")
                    k = torch.empty(b, kv, kv_len, dim, dtype=torch.bfloat16, device="meta")
                    estimated = session.estimate(call, q, k, k, device=PROFILES[system]).time_s
                    seconds = row["latency"] * 1e-3
                    results.append({"family": f"attention {phase}", "gpu": system, "engine": engine,
                                    "point": f"{row['table']} batch {b} len {s} heads {heads}/{kv} dim {dim}",
                                    "measured_s": seconds,
                                    "split": "fitted" if (system, engine) == ("h100_sxm", "vllm") else "held out",
                                    "error": estimated / seconds - 1, "estimated_s": estimated})
    return results


def summary(results: list[dict], key: str = "error") -> dict:
    errors = [r[key] for r in results]
    absolute = [abs(e) for e in errors]
    return {"points": len(errors), "median": statistics.median(absolute), "p90": quantile(absolute, 0.9),
            "bias": statistics.median(errors), "within": sum(e <= WITHIN for e in absolute) / len(absolute)}


def markdown(results: list[dict]) -> str:
    out = ["# castcore against NVIDIA's measured vLLM and SGLang kernels", "",
           "Measured: aiconfigurator-core 0.12.0's vLLM and SGLang tables (how each family is read: "
           "bench/kernels/aic_tables.py). castcore: castpack-nvidia's profiles, castpack-collectives for the "
           "collectives. Error: castcore / measured - 1; bias: the median error. Fitted points set a profile constant; "
           "held-out points set none.", "",
           "| family | points | count | median \\|error\\| | p90 \\|error\\| | bias | within 20% |",
           "|---|---|---:|---:|---:|---:|---:|"]
    for family in dict.fromkeys(r["family"] for r in results):
        for split in ("fitted", "held out"):
            mine = [r for r in results if (r["family"], r["split"]) == (family, split)]
            groups = {"**all**": mine, **{f"{g} {e}": [r for r in mine if (r["gpu"], r["engine"]) == (g, e)]
                                         for g in PROFILES for e in ("vllm", "sglang")}}
            for label, group in groups.items():
                if group:
                    s = summary(group)
                    out.append(f"| {family} | {split}: {label} | {s['points']} | {s['median']:.1%} | {s['p90']:.1%} "
                               f"| {s['bias']:+.1%} | {s['within']:.0%} |")
    library = [r for r in results if "library_error" in r]
    if library:
        s = summary(library, "library_error")
        out += ["", f"The engine all-reduce points priced with a collective library's algorithms alone, as castcore "
                f"priced them before: {s['median']:.0%} median |error|, {s['bias']:+.0%} bias."]
    for family in dict.fromkeys(r["family"] for r in results):
        worst = sorted((r for r in results if r["family"] == family and r["split"] == "held out"),
                       key=lambda r: -abs(r["error"]))[:5]
        out += ["", f"{family}, the worst held-out points:", "", "| point | measured | castcore | error |",
                "|---|---:|---:|---:|"]
        out += [f"| {r['point']} | {r['measured_s'] * 1e6:.2f} us | {r['estimated_s'] * 1e6:.2f} us | "
                f"{r['error']:+.1%} |" for r in worst]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/results/aic_tables.md", help="the markdown report to write")
    args = parser.parse_args(argv)
    try:
        results = score_allreduce() + score_low_latency() + score_attention()
    except ModuleNotFoundError as exc:
        print(f"aic_tables: {exc.name} is not installed; run nox -s kernels, which installs "
              "aiconfigurator-core and the packs", file=sys.stderr)
        return 2
    if not results:
        print("aic_tables: no measured rows found in aiconfigurator-core", file=sys.stderr)
        return 2
    text = markdown(results)
    Path(args.out).write_text(text, encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
