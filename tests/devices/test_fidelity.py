"""The fidelity report (bench/fidelity/): the fitted/held-out rule, how each kind of published point is expressed
and converted to its source's metric, the summary, and the local calibrate-then-measure run.

No assertion here depends on how fast this machine is.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import pytest
import torch

import castcore

ROOT = Path(__file__).parents[2]
sys.path.insert(0, str(ROOT / "bench"))  # the fidelity code is benchmark code, not castcore's
from fidelity import local, report  # noqa: E402
from fidelity.collectives import plan_collective, without_switch_reduction  # noqa: E402
from fidelity.ops import NotExpressible, OpPlan, attention_work, plan_memory  # noqa: E402
from fidelity.published import (
    OP_LEVEL,
    estimate_point,
    load_points,
    make_session,
    percentage_error,  # noqa: E402
    plan,
)
from fidelity.serving import MODEL_FILES, MODELS, plan_serve  # noqa: E402
from fidelity.split import document_ids, split_point, used_for_fitting  # noqa: E402

H100_FILE = ROOT / "tests" / "data" / "h100-sxm.toml"
A100_FILE = ROOT / "tests" / "data" / "a100-sxm-80gb.toml"


def point(point_id: str) -> dict:
    (found,) = [p for p in load_points() if p["id"] == point_id]
    return found


# ---------------------------------------------------------------------------------------------
# Fitted or held out


def test_document_ids_are_arxiv_papers_issues_and_file_paths():
    text = (
        "github.com/zzc0721/torch-performance-test-data/issues/79 ('H100'), Shah et al., arXiv:2407.08608, "
        "Fig. 5; stas00/ml-engineering compute/accelerator/README.md MAMF table; see vllm-project/vllm#23280 and "
        "github.com/NVIDIA/cutlass/pull/12"
    )
    assert document_ids(text) == {
        "zzc0721/torch-performance-test-data#79",
        "arXiv:2407.08608",
        "compute/accelerator/README.md",
        "vllm-project/vllm#23280",
        "NVIDIA/cutlass#12",
    }


def test_a_point_is_fitted_when_a_profile_constant_cites_its_document():
    issue = {
        "source": {"document": "github.com/zzc0721/torch-performance-test-data/issues/79, BF16 8192: 797.51"}
    }
    # The repository's table of every issue stands for each of them.
    table = {
        "compute_efficiency": "797.51/989.4 (github.com/zzc0721/torch-performance-test-data database.md)",
        "memory_bandwidth": "datasheet",
    }
    assert split_point(issue, table) == (
        "fitted",
        {"zzc0721/torch-performance-test-data#79": ["compute_efficiency"]},
    )
    assert (
        split_point(issue, {"compute_efficiency": "zzc0721/torch-performance-test-data#80"})[0] == "held-out"
    )
    # A repository's file is not its pull request.
    pr = {"source": {"document": "github.com/vllm-project/vllm/pull/23280, torch-bf16 column"}}
    assert split_point(pr, {"mma_tile": "vllm-project/vllm docs/contributing/profiling.md"})[0] == "held-out"
    rows = [
        {"device": "d", "fitted_by": {"a#1": ["x", "y"]}},
        {"device": "d", "fitted_by": {"a#1": ["y", "z"]}},
        {"device": "d", "fitted_by": {}},
    ]
    assert used_for_fitting(rows) == {"d": {"a#1": ["x", "y", "z"]}}


def test_split_of_real_points_on_the_test_profile():
    h100 = castcore.load_device_file(H100_FILE)  # its compute_efficiency cites issue 79 of the GEMM data
    assert split_point(point("h100-gemm-bf16-8192"), h100.sources)[0] == "fitted"
    assert split_point(point("h100-gemm-bf16-m1-n2112-k7168"), h100.sources)[0] == "held-out"
    assert split_point(point("h100-rmsnorm-liger-bf16-4096x8192"), h100.sources)[0] == "held-out"


# ---------------------------------------------------------------------------------------------
# Every point: planned, or not expressible with a reason


def test_every_point_has_a_plan_or_says_why_not():
    points = load_points()
    assert len({p["id"] for p in points}) == len(points)
    plans = {p["id"]: plan(p) for p in points}
    refused = {i: p.reason for i, p in plans.items() if isinstance(p, NotExpressible)}
    assert all(reason for reason in refused.values())
    op_level = [p for p in points if p["category"] in OP_LEVEL and p["id"] not in refused]
    serve = [p for p in points if p["category"] == "serve" and p["id"] not in refused]
    assert len(op_level) >= 40 and len(serve) >= 12
    assert {p["device"] for p in serve} == {"a100-sxm4-80gb", "h100-sxm5-80gb", "h200-sxm"}
    # Scheduler-run measurements are simulated (castcore.simulate), each once: none is also a static serve point.
    mlperf = [p for p in points if "mlcommons" in p["id"]]
    assert len(mlperf) >= 12 and all(p["category"] == "simulate" for p in mlperf)
    # Kept with their reason: the GB200 v5.1 rows (their deployment is not in the documents read), and the B300
    # and GB300 rows whose dataset lengths were not read (DeepSeek-R1, Llama-3.1-405B, gpt-oss-120b).
    unread = {p["id"] for p in mlperf if any(m in p["id"] for m in ("dsr1", "405b", "gpt-oss"))}
    assert {p["id"] for p in mlperf if p["id"] in refused} == unread | {
        "cb-gb200x4-mlcommons-inf51-llama2-70b-offline",
        "cb-gb200x4-mlcommons-inf51-llama2-70b-server",
    }
    assert all("lengths" in refused[i] for i in unread)
    assert {p["device"] for p in mlperf if p["id"] not in refused} >= {"b300", "gb300-nvl72", "mi355x"}
    assert not [p for p in serve if p["workload"].get("batch") is None]
    assert "h100-gemm-tf32-4096" not in refused and "h100-gemm-fp32-4096" not in refused
    for p in points:
        assert p["source"]["document"] and "date" in p and p["framework"]


def test_model_configs_name_their_source_and_load():
    from castcore.workload.spec import load_model_config

    for name in set(MODEL_FILES.values()):
        config = load_model_config(str(MODELS / name))
        # The source names the Hugging Face repository of a model that maps to this file.
        named = [model for model, file in MODEL_FILES.items() if file == name]
        assert any(f"huggingface.co/{model}" in config["_source"] for model in named), (
            name,
            config["_source"],
        )
        assert config["torch_dtype"] in ("float16", "bfloat16")


def test_serve_points_become_serve_calls_with_the_stated_deployment():
    fp8 = plan_serve(point("h100-trtllm061-llama-2-70b-bs64-2048-2048-tp2"))
    assert (fp8["batch"], fp8["input_tokens"], fp8["output_tokens"], fp8["metric"]) == (
        64,
        2048,
        2048,
        "output_tokens_per_s",
    )
    # TensorRT-LLM 0.6.1: masked MHA
    assert fp8["deployment"] == {
        "dtype": "fp16",
        "tp": 2,
        "pp": 1,
        "weights": "fp8",
        "activations": "fp8",
        "kv_cache": "fp8",
        "kv_reads": "head",
    }
    assert any("masked MHA kernel" in n for n in fp8["notes"])
    assert "kv_reads" not in plan_serve(point("h200-trtllm07a-llama-2-70b-bs960-128-128"))["deployment"]
    nim = plan_serve(point("h100x2-nim18-llama-3.3-70b-tpot-5000-500"))
    assert nim["deployment"]["dtype"] == "bf16" and "kv_cache" not in nim["deployment"]
    assert any("KV cache dtype not stated" in n for n in nim["notes"])


def test_continuous_batching_points_are_simulated_as_they_ran():
    from fidelity.simulated import plan_simulate

    trtllm = plan_simulate(point("cb-h100-trtllm10-llama-3.1-8b-tp1-1000-1000"))
    options = trtllm["options"]
    assert (options["engine"], options["weights"], options["activations"]) == ("trtllm", "fp8", "fp8")
    assert (options["input_lengths"], options["output_lengths"]) == ("1000", "1000")
    assert "rate" not in options and "concurrency" not in options  # offline: every request at once
    mlperf = plan_simulate(point("cb-h100x8-mlcommons-inf40-llama2-70b-server"))
    assert mlperf["options"]["input_lengths"].startswith("normal:") and mlperf["options"]["rate"] > 0
    fp4 = plan_simulate(point("cb-b200-trtllm10-llama-3.3-70b-fp4-tp1-1000-1000"))
    assert fp4["options"]["weights"] == "nvfp4" and "activations" not in fp4["options"]  # ModelOpt FP4: W4A4
    mx = plan_simulate(point("cb-mi355x8-mlcommons-inf51-open-llama2-70b-offline"))["options"]
    assert (mx["weights"], mx["activations"], mx["kv_cache"], mx["dp"]) == (
        "mxfp4",
        "mxfp4",
        "fp8",
        8,
    )  # Quark


def test_deepseek_points_pass_attention_dp_ep_and_block_fp8_and_count_every_device():
    from types import SimpleNamespace

    from fidelity.simulated import _gpus, plan_simulate

    h200 = plan_simulate(point("cb-h200x8-trtllm-dsr1-fp8-adp8-ep8-1024-2048"))
    options = h200["options"]
    assert (options["weights"], options["tp"], options["attention_dp"]) == ("fp8-block", 1, 8)
    assert "activations" not in options  # block fp8 quantizes its activations per 1x128 group itself
    assert options["model"].endswith("deepseek-v3.json") and options["concurrency"] == 1024
    assert options["requests"] == 5120  # the cap counts every attention data-parallel group as a replica
    assert _gpus(options) == 8
    ep = plan_simulate(point("cb-h200x8-trtllm-dsr1-c64-3200-800-out"))["options"]
    assert (ep["tp"], ep["ep"], ep.get("attention_dp")) == (8, 4, None)
    b200 = plan_simulate(point("cb-b200x8-trtllm-dsr1-0528-fp4-fp8kv-adp8-ep8-1024-2048"))["options"]
    assert (b200["weights"], b200["kv_cache"], b200["requests"]) == ("nvfp4", "fp8", 12000)
    disaggregated = SimpleNamespace(summary={"devices": 96})  # a disaggregated report counts both pools
    assert _gpus({"tp": 1, "attention_dp": 8}, disaggregated) == 96
    mtp = plan(point("cb-h200x8-trtllm-dsr1-fp8-minlat-mtp3"))  # its reader recorded why not
    assert isinstance(mtp, NotExpressible) and "acceptance" in mtp.reason


# ---------------------------------------------------------------------------------------------
# Estimates in the source's metric


def test_gemm_point_reproduces_the_hand_computed_roofline():
    h100 = castcore.load_device_file(H100_FILE)  # no tiles: the plain roofline
    row = estimate_point(point("h100-gemm-bf16-4096"), make_session(packs=()), h100)
    n = 4096
    seconds = 2 * n**3 / (h100.mma_flops["bfloat16"] * h100.compute_efficiency) + h100.mma_op_cost_s
    assert row["how"]["calls"] == ["aten::mm"] and row["how"]["bound"] == "compute"
    assert row["estimated"] == pytest.approx(2 * n**3 / seconds / 1e12)  # TFLOPS by the source's 2*m*n*k
    assert row["error_pct"] == pytest.approx(percentage_error(row["estimated"], 788.72))
    assert row["split"] == "fitted" and "zzc0721/torch-performance-test-data#79" in row["fitted_by"]


def test_attention_runs_the_deployed_kernel_and_counts_work_as_flashattention():
    w = point("h100-fa3-fwd-hd128-causal-16k")["workload"]
    assert attention_work(w) == 4 * 1 * 16 * 16384 * 16384 * 128 / 2
    assert attention_work({**w, "causal": False}) == 4 * 1 * 16 * 16384 * 16384 * 128
    decode = plan(point("h100-fa3-decode-b16-kv2000"))
    captured = castcore.capture(decode.fn, *decode.inputs)
    (call,) = captured.invokes
    assert call.name == "castcore::attention"
    assert [tuple(t.shape) for t in call.inputs()] == [
        (16, 32, 1, 128),
        (16, 32, 2000, 128),
        (16, 32, 2000, 128),
    ]
    assert any("paged" in n for n in decode.notes)


def test_memory_points_run_fused_or_eager_ops_as_the_source_did():
    def calls(workload):
        planned = plan_memory(workload)
        assert isinstance(planned, OpPlan)
        return [i.name for i in castcore.capture(planned.fn, *planned.inputs).invokes]

    base = {"kind": "memory", "op": "rms_norm", "shape": [64, 128], "dtype": "bfloat16"}
    assert calls({**base, "fused": True}) == ["castcore::rms_norm"]
    eager = calls({**base, "fused": False})  # transformers' LlamaRMSNorm: upcast, pow, mean, rsqrt, downcast
    assert {"aten::pow.Tensor_Scalar", "aten::mean.dim", "aten::rsqrt", "aten::_to_copy"} <= set(eager)
    assert calls({**base, "op": "silu_and_mul", "fused": True}) == ["castcore::silu_and_mul"]
    assert "aten::silu" in calls({**base, "op": "silu_and_mul", "fused": False})


def test_a_tf32_point_is_captured_with_tf32_allowed_and_priced_at_the_tf32_rate():
    row = estimate_point(
        point("h100-gemm-tf32-4096"), make_session(packs=()), castcore.load_device_file(H100_FILE)
    )
    assert row["how"]["rates"] == {"mma:tf32": "tf32"}
    assert torch.get_float32_matmul_precision() == "highest"


def test_a_source_that_turned_nvls_off_is_estimated_without_the_switchs_reduction():
    assert plan_collective(point("h200x8-allreduce-ring-16gib"))["no_switch_reduction"]
    assert plan_collective(point("h100x8-allreduce-ring-2to4gib"))["no_switch_reduction"]
    assert not plan_collective(point("h200x8-allreduce-16gib"))["no_switch_reduction"]  # NCCL's default
    nvidia = castcore.load_device_file(
        ROOT / "packs" / "castpack-nvidia" / "castpack_nvidia" / "profiles" / "h100-sxm5-80gb.toml"
    )
    assert nvidia.interconnect[0].name == "nvlink" and nvidia.interconnect[0].reduction_efficiency > 0
    off = without_switch_reduction(nvidia)
    assert all(level.reduction_efficiency == 0 for level in off.interconnect)
    assert [level.bandwidth for level in off.interconnect] == [
        level.bandwidth for level in nvidia.interconnect
    ]


def test_ttft_point_is_the_prefill_estimate_in_ms():
    session = make_session(packs=())
    a100 = castcore.load_device_file(A100_FILE)
    row = estimate_point(point("a100-trtllm05-llama-2-7b-ttft-128-tp1"), session, a100)
    prefill = session.estimate(
        castcore.build_workload(str(MODELS / "llama-2-7b.json"), seq=128, dtype="fp16"), device=a100
    )
    assert row["estimated"] == pytest.approx(prefill.time_s * 1e3)
    assert row["unit"] == "ms" and row["metric"] == "ttft_s"


def test_a_request_castcore_refuses_is_not_expressible_with_its_reason():
    row = estimate_point(
        point("h200-trtllm07a-llama-2-70b-bs96-128-4096"),
        make_session(packs=()),
        castcore.load_device_file(H100_FILE),
    )
    assert "context of 4096" in row["not_expressible"] and "error_pct" not in row


# ---------------------------------------------------------------------------------------------
# Summary and Markdown


def _row(i, category, split, error):
    return {
        "id": i,
        "category": category,
        "device": "d",
        "split": split,
        "error_pct": error,
        "measured": 1.0,
        "estimated": 1 + error / 100,
        "unit": "ms",
        "workload": f"w{i}",
        "notes": [],
    }


def test_summary_gives_median_and_worst_per_category_and_split():
    rows = [
        _row("g1", "gemm", "held-out", 10.0),
        _row("g2", "gemm", "held-out", -30.0),
        _row("g3", "gemm", "fitted", 2.0),
        _row("m1", "memory", "held-out", 5.0),
        _row("s1", "serve", "held-out", 70.0),
        _row("s2", "serve", "held-out", -10.0),
        {"id": "x", "category": "serve", "device": "d", "split": "held-out", "not_expressible": "why"},
    ]
    summary = report.summarize(rows)
    gemm = summary["by_split"]["held-out"]["GEMM"]
    assert (gemm["points"], gemm["median_abs_error_pct"], gemm["worst_abs_error_pct"], gemm["worst_id"]) == (
        2,
        20.0,
        30.0,
        "g2",
    )
    assert summary["by_split"]["held-out"]["op-level"]["median_abs_error_pct"] == statistics.median(
        [10, 30, 5]
    )
    assert summary["by_split"]["fitted"]["GEMM"]["points"] == 1
    assert summary["held_out"] == {
        "op_level_median_pct": 10.0,
        "end_to_end_median_pct": 40.0,
        "worst_pct": 70.0,
    }
    assert summary["targets_met"] == {
        "op_level_median_pct": True,
        "end_to_end_median_pct": False,
        "worst_pct": False,
    }
    assert summary["counts"]["not_expressible"] == 1 and summary["worst_held_out_id"] == "s1"

    text = report.markdown(
        {
            "summary": summary,
            "rows": rows,
            "fitting_documents": {"d": {"a#1": ["x"]}},
            "local": None,
            "wall_s": 1.0,
            "published_wall_s": 1.0,
        },
        {"date": "today", "machine": "m", "cpus": 2, "python": "3"},
    )
    assert "| GEMM | held-out | 2 | 20.0% | 30.0% | g2 |" in text
    assert "x (d): not expressible: why" in text and "**not met**" in text and "`a#1` (x)" in text
    assert all(f"| {r['id']} |" in text for r in rows if "error_pct" in r)


# ---------------------------------------------------------------------------------------------
# This machine


def test_calibration_shapes_are_not_the_scored_shapes():
    suite = local.operator_suite()
    calibrated = {s for shapes in local.CALIBRATION.values() for s in shapes}
    assert not calibrated & local.scored_shapes(suite)
    assert {op.family for op in suite} == set(local.FAMILIES)
    assert [op.name for op in suite if op.unscored] == [
        "sdpa 1x8x1024x128 bf16",
        "sdpa causal 1x8x1024x128 bf16",
    ]


def test_local_run_estimates_and_times_each_op_and_leaves_unscored_ones_out():
    ops = [
        local.SuiteOp("mm 40x48x56 fp32", "matmul", torch.mm, ((40, 48), (48, 56))),
        local.SuiteOp("add 1000 fp32", "pointwise", torch.add, ((1000,), (1000,))),
        local.SuiteOp("sdpa 1x2x32x16 fp32", "attention", local._sdpa, ((1, 2, 32, 16),) * 3),
        local.SuiteOp(
            "sdpa 1x2x32x16 bf16",
            "attention",
            local._sdpa,
            ((1, 2, 32, 16),) * 3,
            torch.bfloat16,
            "shown only",
        ),
    ]
    result = local.run_local(budget_s=0.0, ops=ops)
    assert [r["name"] for r in result["rows"]] == [op.name for op in ops]
    for row in result["rows"]:
        assert row["measured_s"] > 0 and row["median_s"] >= row["measured_s"] and row["estimated_s"] > 0
        assert row["error_pct"] == percentage_error(row["estimated_s"], row["measured_s"])
    assert result["rows"][0]["aten"] == ["aten::mm"] and result["rows"][0]["flops"] == 2 * 40 * 48 * 56
    assert (
        result["summary"]["overall"]["ops"] == 3 and result["summary"]["by_family"]["attention"]["ops"] == 1
    )
    assert (
        result["calibration"]["shapes"] == local.CALIBRATION
        and "compute_efficiency = 1.0" in result["profile_toml"]
    )
    assert result["bf16_sdpa"]["sdpa_bf16_gflops"] > 0
    text = "\n".join(local.local_markdown(result))
    assert "(not scored)" in text and "mm 40x48x56 fp32" in text and "bf16 SDPA is shown, not scored" in text


def test_run_writes_json_and_markdown(tmp_path, monkeypatch, capsys):
    import fidelity.run as run

    # not expressible
    out, only = (
        tmp_path / "fidelity.json",
        "cb-a100-vllm060-llama-3.1-8b-sharegpt-rps4-itl",
    )
    monkeypatch.setattr(sys, "argv", ["run.py", "--no-local", "--only", only, "--out", str(out)])
    run.main()
    data = json.loads(out.read_text())
    (row,) = data["rows"]
    assert row["id"] == only and ("not_expressible" in row or "skipped" in row)
    assert only in out.with_suffix(".md").read_text()
    assert "# castcore fidelity" in capsys.readouterr().out


def test_the_amd_pack_is_among_the_packs_and_a_missing_pack_is_left_out(monkeypatch):
    from fidelity import published

    assert "amd" in published.PACKS
    # a pack that is not installed is skipped, not fatal: its points are reported as skipped (the core's tests run
    # with no pack installed, so the session holds the device file alone)
    h100 = Path(__file__).parents[1] / "data" / "h100-sxm.toml"
    session = make_session(packs=("no-such-pack",), device_files=[h100])
    assert set(session.devices) == {"h100-sxm"}


def test_report_counts_points_per_installed_profile_and_names_those_with_none():
    class Profile:
        def __init__(self, bands=None):
            self.error_bands = bands or {}

    rows = [
        {"id": "a", "device": "mi300x", "split": "held-out", "error_pct": 10.0},
        {"id": "b", "device": "mi300x", "split": "held-out", "error_pct": -30.0},
        {"id": "c", "device": "h100-sxm5-80gb", "split": "fitted", "error_pct": 5.0},
        {"id": "d", "device": "gb200-nvl72", "split": "held-out", "not_expressible": "why"},
    ]
    profiles = {"mi300x": Profile(), "h100-sxm5-80gb": Profile({"gemm_bf16": 0.1}), "h20": Profile()}
    coverage = {c["device"]: c for c in report.device_coverage(rows, profiles)}
    assert set(coverage) == {"mi300x", "h100-sxm5-80gb", "h20"}  # every installed profile, no other
    assert coverage["mi300x"]["held_out"] == 2 and coverage["mi300x"]["fitted"] == 0
    assert coverage["mi300x"]["held_out_median_abs_error_pct"] == pytest.approx(20.0)
    assert coverage["h100-sxm5-80gb"]["fitted"] == 1 and coverage["h100-sxm5-80gb"]["error_bands"] == [
        "gemm_bf16"
    ]
    assert coverage["h20"] == {
        "device": "h20",
        "held_out": 0,
        "fitted": 0,
        "not_expressible": 0,
        "held_out_median_abs_error_pct": None,
        "error_bands": [],
    }
    text = "\n".join(report.device_lines({"devices": list(coverage.values())}))
    assert "| mi300x | 2 | 0 | 0 | 20.0% | none |" in text
    assert "No held-out point: h100-sxm5-80gb, h20." in text and "carry no error band" in text
    assert "[error_bands] table but no held-out point in this report: h100-sxm5-80gb" in text


def test_run_filters_published_points_by_device(tmp_path, monkeypatch):
    import fidelity.run as run

    out = tmp_path / "fidelity.json"
    captured = {}

    def fake_run(points, session, progress):
        captured["devices"] = {p["device"] for p in points}
        return []

    monkeypatch.setattr(run, "run_published", fake_run)
    monkeypatch.setattr(sys, "argv", ["run.py", "--no-local", "--device", "mi300x", "--out", str(out)])
    run.main()
    assert captured["devices"] == {"mi300x"}


def test_a_block_scaled_fp8_gemm_point_runs_with_its_group_and_block_scales():
    planned = plan(point("h800-deepgemm-fp8-m4096-n7168-k16384"))
    a, b, scale_a, scale_b = planned.inputs
    assert (tuple(a.shape), tuple(b.shape)) == ((4096, 16384), (16384, 7168))
    assert (tuple(scale_a.shape), tuple(scale_b.shape)) == (
        (4096, 128),
        (128, 56),
    )  # 1x128 groups, 128x128 blocks
    assert planned.describe.endswith("block-scaled")
    per_tensor = plan(point("h100-gemm-fp8-mamf"))
    assert [s.dim() for s in per_tensor.inputs[2:]] == [0, 0]


def test_a_reason_recorded_with_any_point_makes_it_not_expressible():
    # a serve point whose reader said why castcore cannot run it as measured (MTP, patched kernels)
    refused = plan(point("h20x16-sglang052-dsr1-decode-adp16-ep16-mtp-bs48"))
    assert isinstance(refused, NotExpressible) and "speculation" in refused.reason
