"""Score castcore's DeepSeek latent-attention module against vLLM's measured one: the MLA generation-module tables
in the aiconfigurator-core wheel (``mla/vllm/*/mla_generation_module_perf.parquet``, H100 and H200).

Each row times one DeepSeek-V3 attention module (the latent projections and their norms, rotary, the cache write,
the absorbed key and value products, the decode attention, the output projection) at a batch, a cached length and
a per-rank head count, its products in bf16 or fp8 with 128 x 128 block scales, replayed from a CUDA graph. castcore
prices the same module as it deploys it: a one-layer DeepSeek-V3 with that many heads, decoding that batch over
that cache, summed over the module's calls.

Every row is held out: no constant was fitted to these tables. Why not: the collector runs the module outside
vLLM's compiled graph, and vLLM's custom ops (RMSNorm, rotary, the fp8 quantize) fall back to their PyTorch-native
forms when compilation turns them off (docs.vllm.ai design/custom_op), which a served model's compiled graph fuses.
Its fixed cost, 67-96 us a module at batch 1 (1-16 heads, up to 4,096 cached tokens) on H200 against castcore's
47-56, may hold kernels a served step does not run.
"""

from __future__ import annotations

import json
import random
import tempfile
from pathlib import Path

CONFIG = Path(__file__).resolve().parents[1] / "fidelity" / "models" / "deepseek-v3.json"
SYSTEMS = {"h100_sxm": "h100-sxm5-80gb", "h200_sxm": "h200-sxm"}
FAMILY = "MLA generation module"


def _config(folder: Path, heads: int, gemm: str) -> str:
    """A one-layer DeepSeek-V3 with ``heads`` attention heads: fp8 with block scales as it ships, or bf16."""
    config = json.loads(CONFIG.read_text(encoding="utf-8"))
    config.update(
        num_hidden_layers=1, first_k_dense_replace=1, num_attention_heads=heads, num_key_value_heads=heads
    )
    if gemm == "bfloat16":
        config.pop("quantization_config")
    path = folder / f"deepseek-v3-{heads}-heads-{gemm}.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    return str(path)


def module_seconds(session, device: str, config: str, batch: int, step: int, kv_cache: str) -> float:
    """castcore's time for layer 0's attention module decoding ``batch`` sequences whose ``step``-th token is
    the new one (``step - 1`` cached, as the collector fills the cache)."""
    from castcore.workload.spec import build_workload

    options = {"kv_cache": "fp8"} if kv_cache == "fp8" else {}
    report = session.estimate(
        build_workload(config, phase="decode", batch=batch, kv_len=step - 1, **options), device=device
    )
    return sum(r.estimate.time_s for r in report.records if ".layers.0.self_attn" in r.invoke.module)


def score_mla_module(table, sample: int = 300, session=None, systems=SYSTEMS) -> list[dict]:
    """``table``: aic_tables.table, which reads one measured table's rows; ``systems``: the profile each GPU's
    rows are priced on (castpack-nvidia's in ``session``, by default a Session with the installed packs)."""
    import castcore

    session = session or castcore.Session()
    results = []
    with tempfile.TemporaryDirectory() as folder:
        configs: dict[tuple[int, str], str] = {}
        for system, device in systems.items():
            rows = table(system, "mla", "vllm", "mla_generation_module_perf.parquet")
            random.Random(0).shuffle(rows)
            for row in rows[:sample]:
                heads, gemm, cache = row["num_heads"], row["gemm_type"], row["kv_cache_dtype"]
                key = (heads, gemm)
                if key not in configs:
                    configs[key] = _config(Path(folder), heads, gemm)
                batch, step = row["batch_size"], row["step"]
                estimated = module_seconds(session, device, configs[key], batch, step, cache)
                seconds = float(row["latency"]) * 1e-3
                results.append(
                    {
                        "family": FAMILY,
                        "gpu": system,
                        "engine": "vllm",
                        "point": f"{row['table']} {gemm} products, {cache} cache, {heads} heads, batch {batch}, "
                        f"{step} tokens",
                        "measured_s": seconds,
                        "split": "held out",
                        "error": estimated / seconds - 1,
                        "estimated_s": estimated,
                    }
                )
    return results
