"""castcore against two peer LLM performance simulators, GenZ (genz-llm 0.0.16) and llm-analysis (0.2.2), on the
same scenarios and the same machine.

    python bench/peers.py [--quick] [--out bench/results/peers.json]

Scenarios: Llama-3-8B, Llama-3-70B and Mixtral-8x7B; a prefill of 1x2048 and of 8x1024 tokens; one decode step
at batch 1, 8 and 32 over 2048 cached tokens; tensor parallelism 1, 2, 4 and 8; bf16 and int8 weights. Every tool
prices the H100 of GenZ's "H100_GPU" preset: castcore through bench/peers_h100_genz.toml (each number traced to
GenZ's source), llm-analysis through a GPUConfig holding the same numbers. castcore runs with its defaults
(deployed kernels, last-token logits) and castpack-collectives for the tensor-parallel collectives.

Per scenario: each tool's time (the prefill, or one decode step), castcore/GenZ and castcore/llm-analysis, and
where each tool puts the time, in buckets shared by the three (embedding, qkv, attention, ...). The Markdown
explains every gap over 10% from those buckets. A peer that cannot run a scenario says why in the table.
--quick runs four scenarios (a smoke test) and writes to the temp directory unless --out is given.
Needs genz-llm and llm-analysis beside castcore: ``nox -s peers`` installs them and runs this.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
import statistics
import sys
import tempfile
import time
import traceback
import warnings
from collections import defaultdict
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

import figures  # bench/figures.py: this script runs with bench/ on its path
import peers_text  # bench/peers_text.py: the Markdown and the reasons behind the gaps

HERE = Path(__file__).parent
DEVICE_FILE = HERE / "peers_h100_genz.toml"
DEVICE = "h100-genz"
PEERS = {"genz-llm": "0.0.16", "llm-analysis": "0.2.2"}  # the versions whose files and lines the sources cite
MODELS = ("llama-3-8b", "llama-3-70b", "mixtral-8x7b")
STEPS = (
    ("prefill", 1, 2048),
    ("prefill", 8, 1024),
    ("decode", 1, 2048),
    ("decode", 8, 2048),
    ("decode", 32, 2048),
)
TPS = (1, 2, 4, 8)
WEIGHTS = ("bf16", "int8")


@dataclass(frozen=True)
class Scenario:
    model: str
    phase: str
    batch: int
    seq: int  # prompt tokens for a prefill, cached tokens for a decode step
    tp: int
    weights: str

    @property
    def step(self) -> str:
        return (
            f"prefill {self.batch}x{self.seq}"
            if self.phase == "prefill"
            else f"decode b{self.batch} @{self.seq}"
        )

    @property
    def label(self) -> str:
        return f"{self.model} {self.step} TP{self.tp} {self.weights}"

    @property
    def dense(self) -> bool:
        return not self.model.startswith("mixtral")


def scenarios(quick: bool) -> list[Scenario]:
    if quick:
        return [
            Scenario("llama-3-8b", "prefill", 1, 2048, 1, "bf16"),
            Scenario("llama-3-8b", "decode", 8, 2048, 2, "bf16"),
            Scenario("mixtral-8x7b", "decode", 32, 2048, 4, "bf16"),
            Scenario("llama-3-8b", "decode", 1, 2048, 1, "int8"),
        ]
    return [
        Scenario(m, phase, batch, seq, tp, w)
        for m in MODELS
        for w in WEIGHTS
        for phase, batch, seq in STEPS
        for tp in TPS
    ]


# ---- castcore -------------------------------------------------------------------------------------------------


def castcore_bucket(op: str, module: str) -> str:
    """The shared bucket of one castcore record, by the module that made the call and the operator."""
    leaf = module.rsplit(".", 1)[-1]
    if op.startswith(("_c10d_functional::", "c10d::", "collectives::")):
        return (
            "all-gather"
            if "gather" in op
            else "all-to-all"
            if "to_all" in op or "alltoall" in op
            else "all-reduce"
        )
    if leaf == "embed_tokens":
        return "embedding"
    if leaf == "lm_head":
        return "lm head"
    if leaf in ("q_proj", "k_proj", "v_proj", "qkv_proj"):
        return "qkv"
    if leaf == "o_proj":
        return "out proj"
    if leaf in ("gate_proj", "up_proj", "gate_up_proj", "down_proj"):
        return "ffn"
    name = op.split("::")[-1]
    if "experts" in module.split("."):  # Mixtral's experts: the grouped GEMMs, and the dispatch around them
        return "ffn" if "mm" in name or "quantize" in name else "moe dispatch"
    if leaf == "gate" or "topk" in name:  # Mixtral's router, and the top-k choice
        return "router" if "mm" in name or "linear" in name else "moe dispatch"
    if "attention" in name or "scaled_dot_product" in name:
        return "attention"
    return "elementwise"


def run_castcore(session, s: Scenario, **quantized) -> dict:
    import castcore
    from castcore.errors import CastcoreError

    try:
        workload = castcore.build_workload(
            s.model,
            batch=s.batch,
            seq=s.seq,
            phase=s.phase,
            tp=s.tp,
            kv_len=s.seq if s.phase == "decode" else None,
            **quantized,
        )
        report = session.estimate(workload, device=DEVICE)
    except CastcoreError as exc:  # an option this castcore refuses, such as quantization before it exists
        return {"error": f"castcore: {exc}"}
    except Exception as exc:  # a castcore bug: recorded, shown in the table, and the run ends in failure
        traceback.print_exc()
        return {"error": f"castcore failed: {type(exc).__name__}: {exc}", "crash": True}
    buckets: dict[str, float] = defaultdict(float)
    for record in report.records:
        buckets[castcore_bucket(record.invoke.name, record.invoke.module or "")] += record.estimate.time_s
    result = {"time_s": report.time_s, "buckets": dict(buckets), "flops": report.flops}
    if report.memory is not None and not report.memory.fits(report.device):
        result["note"] = (
            f"castcore: needs {report.memory.peak_bytes / 2**30:.0f} GiB of "
            f"{report.device.memory_bytes / 2**30:.0f}"
        )
    return result


# ---- GenZ -----------------------------------------------------------------------------------------------------

GENZ_BUCKETS = {
    "embeddings": "embedding",
    "QKV": "qkv",
    "Out Proj": "out proj",
    "Gate": "router",
    "up+gate": "ffn",
    "down": "ffn",
    "classifier": "lm head",
    "classifier_AG": "all-gather",
    "Dispatch A2A": "all-to-all",
    "Collect A2A": "all-to-all",
}


def genz_bucket(layer: str) -> str:
    if layer.startswith(("Logit", "Attend")):
        return "attention"
    return "all-reduce" if layer.endswith("AR") else GENZ_BUCKETS[layer]


def genz_model(name: str):
    """GenZ's ModelConfig from castcore's own preset, so both price the same shapes."""
    from castcore.workload.spec import load_model_config
    from GenZ.Models.default_models import ModelConfig

    c = load_model_config(name)
    return ModelConfig(
        model=name,
        vocab_size=c["vocab_size"],
        max_model_len=c["max_position_embeddings"],
        hidden_size=c["hidden_size"],
        intermediate_size=c["intermediate_size"],
        num_ffi=2,  # gated MLP
        num_decoder_layers=c["num_hidden_layers"],
        num_attention_heads=c["num_attention_heads"],
        num_key_value_heads=c["num_key_value_heads"],
        hidden_act=c["hidden_act"],
        num_experts=c.get("num_local_experts", 1),
        expert_top_k=c.get("num_experts_per_tok", 1),
    )


def run_genz(s: Scenario) -> dict:
    from GenZ.analyse_model import simplify_df
    from GenZ.LLM_inference import decode_moddeling, prefill_moddeling

    # GenZ's only int8 is every tensor in int8 and int8 matmuls (GenZ/system.py lines 6-7).
    common = dict(
        model=genz_model(s.model),
        batch_size=s.batch,
        input_tokens=s.seq,
        system_name="H100_GPU",
        system_eff=1,
        bits="bf16" if s.weights == "bf16" else "int8",
        tensor_parallel=s.tp,
    )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if s.phase == "prefill":
                out = prefill_moddeling(**common)
            else:  # one step over seq cached tokens and the new one; Bb=1: no beams (the default is 4)
                out = decode_moddeling(output_tokens=1, Bb=1, **common)
    except ValueError as exc:
        if "would not fit" in str(exc):
            return {"error": "GenZ: does not fit in 80 GiB (refuses)"}
        raise
    buckets: dict[str, float] = defaultdict(float)
    layers = simplify_df(out["model_df"])  # one row per layer kind, times multiplied by the repeats
    for layer, ms in zip(layers["Layer Name"], layers["Latency (msec)"]):
        buckets[genz_bucket(layer)] += float(ms) / 1e3
    return {"time_s": float(out["Latency"]) / 1e3, "buckets": dict(buckets)}


@contextlib.contextmanager
def genz_files():
    """GenZ writes two CSV files per call into its DATA_PATH; remove the ones this run made."""
    from GenZ.Models.get_language_model import DATA_PATH

    folder = Path(DATA_PATH) / "model"
    before = set(os.listdir(folder)) if folder.is_dir() else set()
    try:
        yield
    finally:
        if folder.is_dir():
            for name in set(os.listdir(folder)) - before:
                (folder / name).unlink(missing_ok=True)


# ---- llm-analysis ---------------------------------------------------------------------------------------------

LLM_ANALYSIS_BUCKETS = {
    "latency_fwd_attn": "attention block",
    "latency_fwd_mlp": "mlp",
    "latency_fwd_layernorm": "norms and elementwise",
    "latency_fwd_tp_comm": "collectives",
    "latency_fwd_input_embedding": "embedding",
    "latency_fwd_output_embedding_loss": "lm head",
}


def llm_analysis_gpu(tp: int) -> dict:
    """GenZ's "H100_GPU" (Systems/system_configs.py line 6) in llm-analysis' units, which read GB as 10**9 bytes
    where GenZ reads 2**30 (GenZ/unit.py line 6); the sources are in bench/peers_h100_genz.toml. Its one collective
    latency, the time of an all-reduce too small to be limited by bandwidth, is GenZ's for ``tp`` devices: 5 us
    plus 2(tp - 1) link latencies of 1 us (GenZ/collective_times.py line 16)."""
    return dict(
        name="h100-genz",
        mem_per_GPU_in_GB=80,
        hbm_bandwidth_in_GB_per_sec=3400 * 2**30 / 1e9,
        intra_node_bandwidth_in_GB_per_sec=450 * 2**30 / 1e9,
        inter_node_bandwidth_in_GB_per_sec=450 * 2**30 / 1e9,
        intra_node_min_message_latency=5e-6 + 2 * (tp - 1) * 1e-6,
        peak_fp16_TFLOPS=989,
        peak_i8_TFLOPS=2 * 989,
        peak_i4_TFLOPS=4 * 989,
    )


def run_llm_analysis(s: Scenario) -> dict:
    from castcore.workload.spec import load_model_config
    from llm_analysis.analysis import LLMAnalysis
    from llm_analysis.config import DtypeConfig, GPUConfig, ModelConfig, ParallelismConfig

    c = load_model_config(s.model)
    h, ffn = c["hidden_size"], c["intermediate_size"]
    # Its MLP has two matrices; 1.5x the width gives it the weights of the gated MLP's three.
    model = ModelConfig(
        name=s.model,
        num_layers=c["num_hidden_layers"],
        n_head=c["num_attention_heads"],
        hidden_dim=h,
        vocab_size=c["vocab_size"],
        max_seq_len=c["max_position_embeddings"],
        num_key_value_heads=c["num_key_value_heads"],
        ffn_embed_dim=3 * ffn // 2,
        expansion_ratio=1.5 * ffn / h,
        moe_num_experts=c.get("num_local_experts", 1),
        moe_top_k=c.get("num_experts_per_tok", 1),
    )
    dtype = DtypeConfig() if s.weights == "bf16" else DtypeConfig("w8a16e16", weight_bits=8)
    analysis = LLMAnalysis(
        model,
        GPUConfig(**llm_analysis_gpu(s.tp)),
        dtype,
        ParallelismConfig(tp_size=s.tp),
        flops_efficiency=1.0,
        hbm_memory_efficiency=1.0,
    )
    try:  # seq cached tokens and one generated: the decode step attends over seq + 1, as in the others
        summary = analysis.inference(
            batch_size_per_gpu=s.batch, seq_len=s.seq, num_tokens_to_generate=1, layernorm_dtype_bytes=2
        )
    except AssertionError as exc:
        if "too large" in str(exc):
            return {"error": "llm-analysis: does not fit in 80 GiB (refuses)"}
        raise
    buckets: dict[str, float] = defaultdict(float)
    for key, bucket in LLM_ANALYSIS_BUCKETS.items():
        buckets[bucket] += summary[f"{s.phase}_{key}"]
    if s.phase == "decode":
        buckets["attention block"] += summary["kv_cache_latency"]
    return {"time_s": summary[f"{s.phase}_latency"], "buckets": dict(buckets)}


# ---- the run --------------------------------------------------------------------------------------------------


def ratio(a: dict, b: dict) -> float | None:
    return a["time_s"] / b["time_s"] if "time_s" in a and "time_s" in b else None


def summarize(ratios: list[float | None]) -> dict:
    """Median, range and farthest-from-1 of the ratios there are."""
    ratios = [x for x in ratios if x is not None]
    if not ratios:
        return {"count": 0}
    return {
        "count": len(ratios),
        "median": statistics.median(ratios),
        "min": min(ratios),
        "max": max(ratios),
        "farthest": max(ratios, key=lambda x: abs(math.log(x))),
        "within_10pct": sum(abs(math.log(x)) <= math.log(1.1) for x in ratios),
    }


def summaries(rows: list[dict], seconds: float) -> dict:
    dense = [r for r in rows if r["dense"]]
    moe = [r for r in rows if not r["dense"]]
    return {
        "dense_castcore_over_genz": summarize([r["castcore_over_genz"] for r in dense]),
        "dense_bf16_castcore_over_genz": summarize(
            [r["castcore_over_genz"] for r in dense if r["weights"] == "bf16"]
        ),
        # GenZ's int8 assumption (every tensor int8) met by castcore W8A8 with an int8 KV cache
        "dense_matched_castcore_over_genz": summarize(
            [
                r["castcore_over_genz"] if r["weights"] == "bf16" else r["castcore_w8a8_over_genz"]
                for r in dense
            ]
        ),
        "moe_castcore_over_genz": summarize([r["castcore_over_genz"] for r in moe]),
        "dense_castcore_over_llm_analysis": summarize([r["castcore_over_llm_analysis"] for r in dense]),
        "moe_castcore_over_llm_analysis": summarize([r["castcore_over_llm_analysis"] for r in moe]),
        "seconds": seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="four scenarios only (a smoke test)")
    parser.add_argument(
        "--out",
        help="where to write the JSON (and the .md beside it); default "
        "bench/results/peers.json, or the temp directory with --quick",
    )
    args = parser.parse_args()
    out = args.out or (
        Path(tempfile.gettempdir()) / "peers-quick.json" if args.quick else "bench/results/peers.json"
    )
    versions = figures.peer_versions(PEERS, "bench/peers.py", "peers")
    # llm-analysis logs every figure at INFO on that logger
    logging.getLogger("__name__").setLevel(logging.ERROR)

    import castcore

    versions["castcore"] = metadata.version("castcore")
    session = castcore.Session(device_files=[str(DEVICE_FILE)], load_packs=["collectives"])
    todo = scenarios(args.quick)
    rows, started = [], time.perf_counter()
    with genz_files():
        for i, s in enumerate(todo, 1):
            row = {
                **asdict(s),
                "label": s.label,
                "step": s.step,
                "dense": s.dense,
                "castcore": run_castcore(
                    session, s, **({} if s.weights == "bf16" else {"weights": s.weights})
                ),
                "genz": run_genz(s),
                "llm_analysis": run_llm_analysis(s),
            }
            if s.weights != "bf16":  # what GenZ's int8 assumes: int8 activations and KV cache too
                row["castcore_w8a8"] = run_castcore(
                    session, s, weights=s.weights, activations=s.weights, kv_cache=s.weights
                )
                row["castcore_w8a8_over_genz"] = ratio(row["castcore_w8a8"], row["genz"])
            row["castcore_over_genz"] = ratio(row["castcore"], row["genz"])
            row["castcore_over_llm_analysis"] = ratio(row["castcore"], row["llm_analysis"])
            rows.append(row)
            times = ", ".join(f"{name} {peers_text.ms(row[key])}" for key, name in peers_text.TOOLS)
            print(
                f"[{i}/{len(todo)}] {s.label}: {times} ({time.perf_counter() - started:.0f} s)",
                file=sys.stderr,
                flush=True,
            )
    result = {
        "versions": versions,
        "device_file": DEVICE_FILE.name,
        "device": DEVICE,
        "quick": args.quick,
        "targets": peers_text.TARGETS,
        "summary": summaries(rows, time.perf_counter() - started),
        "rows": rows,
    }
    figures.write(out, result, lambda machine: peers_text.markdown(result, machine))
    if any(row[key].get("crash") for row in rows for key in ("castcore", "castcore_w8a8") if key in row):
        sys.exit("bench/peers.py: castcore failed on some scenarios (tracebacks above)")


if __name__ == "__main__":
    main()
