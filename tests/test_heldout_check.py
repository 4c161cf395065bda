"""The CI check on kernel-table fidelity (bench/kernels/heldout.py): a held-out median that rises by more than two
points against the committed results, or a family that loses its held-out points, fails it."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench" / "kernels"))  # benchmark code, not castcore's

import heldout  # noqa: E402

from castcore.devices.profile import BAND_FAMILIES  # noqa: E402


def point(family: str, error: float, split: str = "held out") -> dict:
    return {"family": family, "split": split, "error": error}


def test_held_out_medians_ignore_fitted_points_and_take_absolute_errors():
    results = [
        point("gemm", -0.1),
        point("gemm", 0.3),
        point("gemm", -0.2),
        point("gemm", 5.0, "fitted"),
        point("fitted only", 0.1, "fitted"),
    ]
    assert heldout.held_out_medians(results) == {"gemm": {"points": 3, "median": 0.2}}


def test_a_rise_of_more_than_two_points_fails_and_names_the_family():
    committed = {"gemm": {"points": 300, "median": 0.15}, "attention": {"points": 900, "median": 0.2}}
    fresh = {"gemm": {"points": 300, "median": 0.1701}, "attention": {"points": 900, "median": 0.219}}
    assert heldout.rises(committed, fresh) == [
        "gemm: held-out median 17.0%, was 15.0% (more than 2 points worse)"
    ]


def test_improvements_and_new_families_pass_and_a_vanished_family_fails():
    committed = {"gemm": {"points": 300, "median": 0.15}, "moe": {"points": 10, "median": 0.3}}
    fresh = {"gemm": {"points": 300, "median": 0.05}, "new": {"points": 5, "median": 0.9}}
    assert heldout.rises(committed, fresh) == ["moe: no held-out points now (was 30.0% over 10)"]


def test_bands_are_per_gpu_held_out_medians_under_the_profiles_family_names():
    results = [
        {"family": "attention generation", "gpu": "h100_sxm", "split": "held out", "error": e}
        for e in (-0.1, 0.3, 0.2)
    ]
    results += [
        {"family": "attention generation", "gpu": "h100_sxm", "split": "fitted", "error": 0.9},
        {"family": "attention generation, fp8 KV cache", "gpu": "h100_sxm", "split": "held out", "error": 1},
        {"family": "fused MoE bf16, balanced routing", "gpu": "b200_sxm", "split": "held out", "error": -0.1},
        {"family": "fused MoE bf16, power law routing", "gpu": "b200_sxm", "split": "held out", "error": 0.3},
    ]
    assert heldout.bands(results) == {"b200_sxm": {"moe": 0.2}, "h100_sxm": {"attention_decode": 0.2}}
    assert set(heldout.BAND_OF.values()) <= set(BAND_FAMILIES)


def test_written_medians_read_back(tmp_path):
    medians = {"gemm": {"points": 3, "median": 0.2}}
    heldout.write(tmp_path / "m.json", medians)
    assert heldout.read(tmp_path / "m.json") == medians


def test_the_committed_medians_cover_every_family_the_report_shows():
    committed = heldout.read(ROOT / "bench" / "results" / "aic_tables.json")
    report = (ROOT / "bench" / "results" / "aic_tables.md").read_text(encoding="utf-8")
    shown = {
        line.split(" | ")[0].lstrip("| ") for line in report.splitlines() if "| held out: **all** |" in line
    }
    assert shown and shown == set(committed)


def test_the_mla_module_family_prices_one_deployed_attention_module_per_measured_row():
    import aic_mla

    import castcore

    def row(heads, gemm, cache, batch, step):
        return {
            "num_heads": heads,
            "gemm_type": gemm,
            "kv_cache_dtype": cache,
            "batch_size": batch,
            "step": step,
            "latency": 0.1,  # ms
            "table": "h200_sxm/mla/vllm/0.24.0",
        }

    rows = [
        row(16, "fp8_block", "bfloat16", 64, 8192),
        row(16, "fp8_block", "fp8", 64, 8192),
        row(128, "fp8_block", "bfloat16", 64, 8192),
    ]

    def table(system, family, engine, name):
        wanted = ("h200_sxm", "mla", "vllm", "mla_generation_module_perf.parquet")
        return list(rows) if (system, family, engine, name) == wanted else []

    # the test profile stands for H200's: the packs are not installed here
    session = castcore.Session(load_packs=[], device_files=[str(ROOT / "tests" / "data" / "h100-sxm.toml")])
    scored = aic_mla.score_mla_module(table, session=session, systems={"h200_sxm": "h100-sxm"})
    results = {r["point"]: r for r in scored}

    def priced(gemm, cache, heads):
        return results[
            f"h200_sxm/mla/vllm/0.24.0 {gemm} products, {cache} cache, {heads} heads, batch 64, 8192 tokens"
        ]

    assert [r["split"] for r in results.values()] == ["held out"] * 3
    block = priced("fp8_block", "bfloat16", 16)
    assert block["error"] == block["estimated_s"] / 1e-4 - 1
    # an fp8 cache halves the bytes the decode attention reads over 8,192 tokens of 64 sequences
    assert priced("fp8_block", "fp8", 16)["estimated_s"] < block["estimated_s"]
    # eight times the heads: eight times the attention's query work, larger up and output projections
    assert priced("fp8_block", "bfloat16", 128)["estimated_s"] > 1.2 * block["estimated_s"]
