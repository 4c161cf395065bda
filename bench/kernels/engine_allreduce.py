"""Score castcore's engine all-reduce (castpack-collectives' one_shot / two_shot on castpack-nvidia's profiles)
against the custom all-reduce latencies NVIDIA measured in vLLM and SGLang, shipped in the aiconfigurator-core
wheel (Apache-2.0): ``systems/data/<gpu>/comm/{vllm,sglang}/<version>/custom_allreduce_perf.parquet``, CUDA-graph
rows, buffers up to the profile's ``engine_allreduce_max_bytes``.

Fitted: the vLLM tables of the GPUs whose profile constants were fitted to them (H100 SXM, A100 SXM, B200).
Held out: every SGLang table, and H200's vLLM tables (the H200 profile takes the H100 fit). The same points are also
priced as a collective library alone would run them (NCCL's algorithms, castcore before the engine kernels).

``nox -s kernels`` runs this with the wheel installed; ``python bench/kernels/engine_allreduce.py --out FILE.md``
where it is installed already. Writes the markdown report and prints its summary.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from importlib import resources
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # score.py sits beside this file
from score import WITHIN, quantile  # noqa: E402

PROFILES = {"h100_sxm": "h100-sxm5-80gb", "h200_sxm": "h200-sxm", "a100_sxm": "a100-sxm4-80gb", "b200_sxm": "b200"}
FITTED = {("h100_sxm", "vllm"), ("a100_sxm", "vllm"), ("b200_sxm", "vllm")}  # where the profile constants came from


def measured(system: str, engine: str) -> list[dict]:
    """The wheel's CUDA-graph custom all-reduce rows for one GPU and engine, all versions."""
    import pyarrow.parquet as pq

    root = resources.files("aiconfigurator_core") / "systems" / "data" / system / "comm" / engine
    rows = []
    for version in sorted(p.name for p in root.iterdir()) if root.is_dir() else []:
        table = root / version / "custom_allreduce_perf.parquet"
        if table.is_file():
            rows += [{**r, "table": f"{system}/comm/{engine}/{version}"} for r in pq.read_table(str(table)).to_pylist()
                     if "graph" in str(r.get("backend", r.get("kernel_source", ""))).lower()]
    return rows


def score() -> list[dict]:
    import castcore
    from castpack_collectives.alphabeta import ENGINE, NCCL, collective_cost

    session = castcore.Session()
    results = []
    for system, name in PROFILES.items():
        profile = session.device(name)
        level = profile.interconnect[0]
        for engine in ("vllm", "sglang"):
            for row in measured(system, engine):
                size, n, seconds = float(row["message_size"]), int(row["num_gpus"]), row["latency"] * 1e-3
                if size > level.engine_allreduce_max_bytes or n > level.devices:
                    continue
                priced = {kind: collective_cost("all_reduce", size, n, profile.interconnect, profile.comm_op_cost_s,
                                                algorithms).time_s for kind, algorithms in (("engine", ENGINE),
                                                                                          ("library", NCCL))}
                results.append({"gpu": system, "profile": name, "engine": engine, "table": row["table"], "n": n,
                                "bytes": size, "measured_s": seconds,
                                "split": "fitted" if (system, engine) in FITTED else "held out",
                                **{f"{kind}_error": t / seconds - 1 for kind, t in priced.items()},
                                "engine_s": priced["engine"]})
    return results


def summary(results: list[dict], key: str = "engine_error") -> dict:
    errors = [r[key] for r in results]
    absolute = [abs(e) for e in errors]
    return {"points": len(errors), "median": statistics.median(absolute), "p90": quantile(absolute, 0.9),
            "bias": statistics.median(errors), "within": sum(e <= WITHIN for e in absolute) / len(absolute)}


def _row(label: str, s: dict, library: dict) -> str:
    return (f"| {label} | {s['points']} | {s['median']:.1%} | {s['p90']:.1%} | {s['bias']:+.1%} | {s['within']:.0%} "
            f"| {library['median']:.1%} ({library['bias']:+.1%}) |")


def markdown(results: list[dict]) -> str:
    out = ["# Engine all-reduce against vLLM's and SGLang's measured custom all-reduce", "",
           "Measured: aiconfigurator-core 0.12.0, `systems/data/<gpu>/comm/{vllm,sglang}/*/custom_allreduce_perf"
           ".parquet`, CUDA-graph rows, bf16, 2 to 8 GPUs on one NVLink board, buffers up to the profile's "
           "`engine_allreduce_max_bytes`. castcore: castpack-collectives' fastest of one_shot, two_shot and the "
           "library algorithms on castpack-nvidia's profile. Error: castcore / measured - 1; bias: the median "
           "error. *Library only*: the same points priced without the engine kernels (median |error| and bias).",
           "", "| points | count | median \\|error\\| | p90 \\|error\\| | bias | within 20% | library only |",
           "|---|---:|---:|---:|---:|---:|---:|"]
    for split in ("fitted", "held out"):
        mine = [r for r in results if r["split"] == split]
        if mine:
            out.append(_row(f"**all {split}**", summary(mine), summary(mine, "library_error")))
        for gpu in PROFILES:
            for engine in ("vllm", "sglang"):
                group = [r for r in mine if (r["gpu"], r["engine"]) == (gpu, engine)]
                if group:
                    out.append(_row(f"{split}: {gpu} {engine}", summary(group), summary(group, "library_error")))
    worst = sorted((r for r in results if r["split"] == "held out"), key=lambda r: -abs(r["engine_error"]))[:8]
    out += ["", "The worst held-out points:", "", "| table | GPUs | bytes | measured | castcore | error |",
            "|---|---:|---:|---:|---:|---:|"]
    out += [f"| {r['table']} | {r['n']} | {int(r['bytes'])} | {r['measured_s'] * 1e6:.2f} us | "
            f"{r['engine_s'] * 1e6:.2f} us | {r['engine_error']:+.1%} |" for r in worst]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/results/engine_allreduce.md", help="the markdown report to write")
    args = parser.parse_args(argv)
    try:
        results = score()
    except ModuleNotFoundError as exc:
        print(f"engine_allreduce: {exc.name} is not installed; run nox -s kernels, which installs "
              "aiconfigurator-core and the packs", file=sys.stderr)
        return 2
    if not results:
        print("engine_allreduce: no custom all-reduce rows found in aiconfigurator-core", file=sys.stderr)
        return 2
    text = markdown(results)
    Path(args.out).write_text(text, encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
