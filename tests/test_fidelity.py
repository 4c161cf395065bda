"""The fidelity report: its arithmetic on fixed numbers, its structure, and the published figures.

No assertion here depends on how fast this machine is.
"""

from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path

import pytest

import castcore

sys.path.insert(0, str(Path(__file__).parent.parent / "bench"))  # the fidelity code is benchmark code, not castcore's
from fidelity_report import (FAMILIES, LOCAL_NOTE, estimate_published, format_markdown, median_ape,
                               fidelity_report, operator_suite, percentage_error, published_figures,
                               published_seconds, run_local, run_published, source_work_flops, summarize,
                               write_report)

ROOT = Path(__file__).parent.parent


def _kind(name: str) -> str:
    """'sdpa causal 1x8x64x64 fp32' -> 'sdpa causal'; 'mm 16x512x512 fp32' -> 'mm'."""
    return " ".join(w for w in name.split() if not w[0].isdigit() and w not in ("fp32", "bf16"))


# ---------------------------------------------------------------------------------------------
# Arithmetic on given numbers

def test_percentage_error_is_signed_against_the_measurement():
    assert percentage_error(150.0, 100.0) == 50.0
    assert percentage_error(50.0, 100.0) == -50.0
    assert percentage_error(3e-3, 4e-3) == pytest.approx(-25.0)
    with pytest.raises(ValueError):
        percentage_error(1.0, 0.0)


def test_median_ape_takes_the_median_of_absolute_errors():
    # errors: +10%, -20%, +50% -> |.| = 10, 20, 50 -> median 20
    assert median_ape([(110.0, 100.0), (80.0, 100.0), (300.0, 200.0)]) == pytest.approx(20.0)
    # an even count averages the middle two: |.| = 10, 20, 30, 90 -> 25
    assert median_ape([(1.1, 1.0), (0.8, 1.0), (1.3, 1.0), (0.1, 1.0)]) == pytest.approx(25.0)
    assert median_ape([]) is None


def test_summary_overall_and_per_family_from_fixed_rows():
    rows = [
        {"family": "matmul", "estimated_s": 1.1, "measured_s": 1.0},     # +10
        {"family": "matmul", "estimated_s": 0.7, "measured_s": 1.0},     # -30
        {"family": "matmul", "estimated_s": 2.0, "measured_s": 1.0},     # +100
        {"family": "pointwise", "estimated_s": 0.5, "measured_s": 1.0},  # -50
        {"family": "pointwise", "estimated_s": 1.0, "measured_s": None},  # not measured: left out
    ]
    summary = summarize(rows)
    assert summary["by_family"]["matmul"] == {"ops": 3, "median_ape_pct": pytest.approx(30.0),
                                              "median_error_pct": pytest.approx(10.0)}
    assert summary["by_family"]["pointwise"]["ops"] == 1
    assert summary["by_family"]["pointwise"]["median_ape_pct"] == pytest.approx(50.0)
    assert list(summary["by_family"]) == ["matmul", "pointwise"]  # FAMILIES order
    # overall over 10, 30, 100, 50 -> (30 + 50) / 2
    assert summary["overall"]["ops"] == 4
    assert summary["overall"]["median_ape_pct"] == pytest.approx(40.0)


# ---------------------------------------------------------------------------------------------
# The local suite and report: structure only

def test_suite_covers_every_family_and_operator_and_quick_keeps_them():
    full, quick = operator_suite(), operator_suite(quick=True)
    assert {op.family for op in full} == set(FAMILIES)
    kinds = {_kind(op.name) for op in full}
    assert {"mm", "bmm", "add", "mul", "silu", "gelu", "exp", "layer_norm", "rms_norm", "softmax", "sdpa",
            "sdpa causal"} <= kinds
    assert [(_kind(o.name), o.family, o.dtype) for o in quick] == [(_kind(o.name), o.family, o.dtype) for o in full]
    assert len({op.name for op in full}) == len(full)


def test_local_report_has_every_suite_op(tmp_path):
    local = run_local(quick=True, warmup=0, min_repeat=1, max_repeat=2, budget_s=0.0)
    suite = operator_suite(quick=True)
    assert [r["name"] for r in local["rows"]] == [op.name for op in suite]
    for row in local["rows"]:
        assert row["measured_s"] > 0 and row["min_s"] > 0 and row["estimated_s"] > 0
        assert row["error_pct"] == percentage_error(row["estimated_s"], row["measured_s"])
        assert row["aten"] and row["repeat"] >= 1
    assert set(local["summary"]["by_family"]) == set(FAMILIES)
    assert local["summary"]["overall"]["ops"] == len(suite)
    assert local["note"] == LOCAL_NOTE and "not the accelerator numbers" in LOCAL_NOTE
    assert local["profile"]["compute_efficiency"] == 1.0 and "castcore calibrate" in local["profile_toml"]
    attention = [r for r in local["rows"] if r["family"] == "attention"]
    assert all(any("scaled_dot_product" in a for a in r["aten"]) for r in attention)

    report = fidelity_report(local, None)
    out_json, out_md = write_report(report, tmp_path / "fidelity.json")
    data = json.loads(out_json.read_text())
    assert [r["name"] for r in data["local"]["rows"]] == [op.name for op in suite]
    text = out_md.read_text()
    assert LOCAL_NOTE in text and "MdAPE" in text
    assert all(f"| {op.name} |" in text for op in suite)


# ---------------------------------------------------------------------------------------------
# Published figures

def test_published_figures_are_sourced_and_well_formed():
    figures = published_figures()
    assert 3 <= len(figures) <= 5
    assert len({f["id"] for f in figures}) == len(figures)
    for f in figures:
        assert f["source"]["document"] and datetime.date.fromisoformat(f["source"]["read"])
        assert f["figure"]["unit"] in ("ms", "TFLOPS") and f["figure"]["value"] > 0 and f["figure"]["work"]
        assert "device_file" in f["device"] or "pack" in f["device"]
        if "device_file" in f["device"]:
            profile = castcore.load_device_file(ROOT / f["device"]["device_file"])
            assert profile.name == f["device"]["name"]
        assert published_seconds(f) > 0


def test_source_work_counts_follow_each_source():
    assert source_work_flops({"kind": "mm", "m": 2, "k": 3, "n": 5}) == 60
    attention = {"kind": "attention", "batch": 2, "heads": 3, "seq": 4, "head_dim": 5, "causal": False}
    assert source_work_flops(attention) == 4 * 2 * 3 * 16 * 5
    assert source_work_flops({**attention, "causal": True}) == 2 * 2 * 3 * 16 * 5


def test_published_h100_gemm_reproduces_the_hand_computed_estimate():
    (entry,) = [f for f in published_figures() if f["id"] == "h100-gemm-bf16-4096"]
    h100 = castcore.load_device_file(ROOT / "tests" / "data" / "h100-sxm.toml")
    n = 4096
    compute = 2 * n ** 3 / (h100.mma_flops["bfloat16"] * h100.compute_efficiency)
    memory = 3 * n * n * 2 / (h100.memory_bandwidth * h100.memory_efficiency)
    assert compute > memory  # compute-bound, so the roofline adds the matrix-op fixed cost to compute
    expected = compute + h100.mma_op_cost_s

    row = estimate_published(entry, ROOT)
    assert row["estimated_s"] == expected
    assert row["published_s"] == 2 * n ** 3 / (788.72 * 1e12)
    assert row["error_pct"] == percentage_error(expected, row["published_s"])
    assert row["calls"] == 1 and row["castcore_flops"] == row["source_work_flops"] == 2 * n ** 3


def test_every_published_figure_is_estimated_or_says_why_not():
    published = run_published(ROOT)
    assert published["estimated"] + published["skipped"] == len(published_figures())
    for row in published["rows"]:
        if "skipped" in row:
            assert row["skipped"] and row["device"].startswith("ascend")  # only the pack-backed device may be absent
        else:
            assert row["estimated_s"] > 0 and row["calls"] >= 1 and row["answered_by"]
    text = format_markdown(fidelity_report(None, published))
    assert all(row["source"]["document"] in text for row in published["rows"])


def test_a_missing_device_is_skipped_with_the_reason():
    entry = dict(published_figures()[0])
    entry["device"] = {"name": "ascend-910b2", "pack": "no-such-pack"}
    assert "no-such-pack" in estimate_published(entry, ROOT)["skipped"]
    entry["device"] = {"name": "h100-sxm", "device_file": "tests/data/no-such-file.toml"}
    assert "no-such-file.toml" in estimate_published(entry, ROOT)["skipped"]
