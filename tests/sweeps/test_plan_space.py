"""castcore plan's whole search space: the candidates that cannot run skipped before anything runs and counted by
reason, the engine's token budget as an axis, disaggregated pools of their own tensor parallel size, and attention
data parallel named as such: real plans of tiny models on the H100 test profile, checked against castcore simulate."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import castcore
from castcore.devices.profile_files import load_device_file
from castcore.sweeps.plan import PlanRequest
from castcore.sweeps.plan_space import Skipped, layouts
from castcore.workload.spec import load_model_config

ROOT = Path(__file__).parents[2]
DATA = ROOT / "tests" / "data"
LLAMA = str(DATA / "tiny-llama.json")
MIXTRAL = str(DATA / "tiny-mixtral.json")  # 4 heads, 4 experts, 2 layers
DEVICE = ["--device-file", str(DATA / "h100-sxm.toml"), "--no-packs", "--workers", "1"]
# the search space itself: the search's own rows, unconfirmed (tests/sweeps/test_plan_validation.py confirms)
TRAFFIC = ["--input", "64", "--output", "8", "--rate", "2000", "--requests", "30", "--validate", "0"]


def _plan(tmp_path, *argv: str, model: str = LLAMA) -> tuple[dict, str]:
    """The plan's --json and its text."""
    found = []
    for more in (["--json"], []):
        done = subprocess.run(
            [sys.executable, "-m", "castcore", "plan", "--model", model, *argv, *DEVICE, *more],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env={**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")},
        )
        assert done.returncode == 0, done.stderr
        found.append(done.stdout)
    return json.loads(found[0]), found[1]


def _simulated(**options):
    session = castcore.Session(load_packs=[], device_files=[DATA / "h100-sxm.toml"])
    return session.simulate(LLAMA, device="h100-sxm", **options).summary


def test_impossible_dtype_pairs_and_layouts_over_the_devices_are_skipped_and_counted(tmp_path):
    found, text = _plan(
        tmp_path,
        *TRAFFIC,
        *("--tp", "1", "2", "--pp", "1", "--max-devices", "1"),
        *("--weights", "bf16", "fp8", "--activations", "bf16", "fp8"),
    )
    # bf16, fp8 weight-only and W8A8 fp8 ran; bf16 weights with fp8 activations did not
    assert found["layouts"] == 3 and found["points"] == 3
    ran = {(r["weights"], r["activations"]) for r in found["best"]}
    assert ran == {("bf16", None), ("fp8", None), ("fp8", "fp8")}
    by_reason = {s["reason"]: s for s in found["skipped"]}
    pair = next(s for reason, s in by_reason.items() if "multiplies fp8 activations" in reason)
    assert pair["count"] == 1 and pair["example"] == "h100-sxm 1 device, bf16 weights, fp8 activations"
    # tp 2 needs two devices: its 2 weights x 2 activations, skipped before the dtypes are paired
    wide = by_reason["more devices than a replica may have (--max-devices 1)"]
    assert (wide["count"], wide["example"]) == (4, "h100-sxm tp 2")
    assert (
        sum(s["count"] for s in found["skipped"]) + found["layouts"] == 2 * 2 * 2
    )  # the whole cross product
    assert (
        "skipped 4 candidates: more devices than a replica may have (--max-devices 1) (such as h100-sxm tp 2)"
        in (text.splitlines())
    )
    assert "skipped 1 candidate: --activations fp8 multiplies fp8 activations by fp8 weights" in text
    assert "refused" not in text  # nothing ran to be refused
    w8a8 = next(r for r in found["best"] if r["activations"] == "fp8")
    at = dict(input_lengths="64", output_lengths="8", requests=30, rate=2000.0)
    assert w8a8["p99_ttft_ms"] == pytest.approx(
        _simulated(**at, weights="fp8", activations="fp8")["p99_ttft_ms"]
    )


def test_layouts_count_what_the_model_or_the_devices_refuse():
    h100 = load_device_file(DATA / "h100-sxm.toml")
    skipped = Skipped()
    request = PlanRequest(model=MIXTRAL, tp=[1, 3], pp=[1, 2], max_devices=4)
    found = layouts(load_model_config(MIXTRAL), h100, request, skipped, each=2)
    # tp 1: ep 1, and the experts over 2 or 4 groups (attention data parallel) without stages
    assert found == [{"tp": 1, "pp": 1, "ep": ep} for ep in (1, 2, 4)] + [{"tp": 1, "pp": 2, "ep": 1}]
    counts = {s["reason"]: (s["count"], s["example"]) for s in skipped.listed()}
    # each layout counts twice (each=2); from Python the options are named as keywords
    assert counts == {
        "attention data parallel (ep above tp) is not searched with pipeline stages": (
            2,
            "h100-sxm attention dp 2 x pp 2, ep 2",
        ),
        # attention dp 4 x pp 2, tp 3 x pp 2 and tp 3 x pp 2 x ep 3
        "more devices than a replica may have (max_devices=4)": (6, "h100-sxm attention dp 4 x pp 2, ep 4"),
        f"tp=3: {MIXTRAL}'s num_attention_heads = 4 does not divide by 3; tensor parallelism splits the heads "
        "evenly (use a tp that divides 4)": (2, "h100-sxm tp 3"),
        f"ep=3: {MIXTRAL}'s 4 experts do not divide by 3; use an ep that divides 4": (
            2,
            "h100-sxm tp 3 x ep 3",
        ),
    }


def test_a_plan_over_two_token_budgets_runs_both_and_reports_them(tmp_path):
    found, text = _plan(
        tmp_path, *TRAFFIC, "--tp", "1", "--pp", "1", "--weights", "bf16", "--max-batched-tokens", "16", "128"
    )
    assert found["max_batched_tokens"] == [16, 128] and found["max_running_requests"] == [None]
    rows = sorted(found["best"], key=lambda r: r["max_batched_tokens"])
    assert [r["max_batched_tokens"] for r in rows] == [16, 128]
    at = dict(input_lengths="64", output_lengths="8", requests=30, rate=2000.0)
    for row in rows:
        simulated = _simulated(**at, max_batched_tokens=row["max_batched_tokens"])
        assert row["p99_ttft_ms"] == pytest.approx(simulated["p99_ttft_ms"])
    # the budget reached the simulation: 16 tokens an iteration chunks each 64-token prompt
    assert rows[0]["p99_ttft_ms"] > rows[1]["p99_ttft_ms"]
    assert (
        "1 device, bf16 weights, 16 batched tokens" in text
        and "1 device, bf16 weights, 128 batched tokens" in text
    )


def test_a_disaggregated_plan_runs_pools_of_their_own_tp_and_says_so(tmp_path):
    found, text = _plan(
        tmp_path,
        *("--input", "32", "--output", "8", "--rate", "40", "--requests", "40", "--validate", "0"),
        *(
            "--tp",
            "1",
            "2",
            "--pp",
            "1",
            "--weights",
            "bf16",
            "--disaggregated",
            "--max-devices",
            "3",
            "--top",
            "20",
        ),
    )
    # tp 1 and tp 2; tp 1 prefill as 1+1, 1+2, 2+1 and 1 + 1 decode of tp 2; tp 2 prefill + 1 decode of tp 1
    assert found["layouts"] == 2 + 3 + 1 + 1
    mixed = next(r for r in found["best"] if r["tp"] == 1 and r["decode_deployment"] == "tp=2")
    assert (mixed["prefill_instances"], mixed["decode_instances"], mixed["devices"]) == (1, 1, 3)
    simulated = _simulated(
        input_lengths="32",
        output_lengths="8",
        rate=40.0,
        requests=40,
        prefill_instances=1,
        decode_instances=1,
        decode_deployment="tp=2",
    )
    assert mixed["output_throughput"] == pytest.approx(simulated["output_throughput"])
    assert mixed["p99_tpot_ms"] == pytest.approx(simulated["p99_tpot_ms"])
    assert "1 prefill (tp 1) + 1 decode (tp 2) instances, bf16 weights" in text
    assert "1 prefill (tp 2) + 1 decode (tp 1) instances, bf16 weights" in text


def test_attention_data_parallel_is_named_as_such(tmp_path):
    argv = ("--input", "32", "--output", "8", "--rate", "2000", "--requests", "30", "--tp", "1", "--pp", "1")
    found, text = _plan(tmp_path, *argv, "--weights", "bf16", "--max-devices", "4", model=MIXTRAL)
    # tp 1 with the experts over 1, 2 and 4 devices: attention data parallel over 2 and 4 groups of one device
    assert sorted((r["tp"], r["ep"], r["devices"]) for r in found["best"]) == [
        (1, 1, 1),
        (1, 2, 2),
        (1, 4, 4),
    ]
    assert "attention dp 4, ep 4, bf16 weights" in text and "attention dp 2, ep 2, bf16 weights" in text
    assert "  ep 4, bf16" not in text


def test_the_launch_files_carry_the_token_budget_the_best_ran_with(capsys):
    from castcore.cli.main import main

    argv = ["plan", "--model", LLAMA, *TRAFFIC, "--tp", "1", "--pp", "1", "--weights", "bf16"]
    assert main([*argv, "--max-batched-tokens", "64", *DEVICE, "--emit", "vllm"]) == 0
    out = capsys.readouterr().out
    assert "--max-num-batched-tokens 64 " in out and "--max-batched-tokens 64 " in out
