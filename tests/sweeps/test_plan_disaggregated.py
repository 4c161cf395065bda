"""castcore plan --disaggregated: disaggregated prefill/decode layouts searched beside the aggregated ones, each ratio
of prefill to decode instances within --max-devices, and which kind wins and why."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import castcore
from castcore.cli.main import main
from castcore.options.option import Objective
from castcore.sweeps import capacity, plan_disaggregated
from castcore.sweeps.plan import PlanRequest, PlanResult
from castcore.sweeps.run import SweepResult
from castcore.sweeps.sweep import commands

ROOT = Path(__file__).parents[2]
DATA = ROOT / "tests" / "data"
LLAMA = str(DATA / "tiny-llama.json")
LAYOUT = {
    "model": LLAMA,
    "input": "32",
    "output": "8",
    "dtype": "bf16",
    "device": "h100-sxm",
    "weights": None,
    "requests": 50,
    "engine": "vllm",
    "pp": 1,
    "ep": 1,
}


def test_every_ratio_of_instances_and_pool_tps_within_the_devices_is_a_candidate():
    found = plan_disaggregated.candidates([{**LAYOUT, "tp": 1}, {**LAYOUT, "tp": 2}], max_devices=4)
    # (prefill tp, X, Y, decode tp) by devices, the pools' own TP after the same one: X x tp + Y x decode tp <= 4
    assert [
        (c["tp"], c["prefill_instances"], c["decode_instances"], plan_disaggregated.decode_tp(c))
        for c in found
    ] == [
        (1, 1, 1, 1),
        (1, 1, 2, 1),
        (1, 2, 1, 1),
        (1, 1, 1, 2),
        (1, 1, 3, 1),
        (1, 2, 2, 1),
        (1, 3, 1, 1),
        (1, 2, 1, 2),
        (2, 1, 1, 1),
        (2, 1, 1, 2),
        (2, 1, 2, 1),
    ]
    assert len(plan_disaggregated.candidates([{**LAYOUT, "tp": 1}], max_devices=8)) == 16  # at most 4 of each
    # With tp 1, 2, 4 and 8 in 8 devices, tp 1's prefill pool has 16 + 10 + 4 ratios: the bound keeps 24
    skipped: list = []
    wide = [{**LAYOUT, "tp": tp} for tp in (1, 2, 4, 8)]
    found = plan_disaggregated.candidates(wide, 8, lambda *skip: skipped.append(skip))
    mine = [c for c in found if c["tp"] == 1]
    assert (
        max(c["prefill_instances"] + c["decode_instances"] * plan_disaggregated.decode_tp(c) for c in mine)
        <= 8
    )
    assert len(mine) == plan_disaggregated.MOST_POOLED
    assert skipped == [
        (
            "beyond the 24 disaggregated candidates a layout tries (the fewest devices first)",
            "h100-sxm 3 prefill (tp 1) + 1 decode (tp 4) instances",
            30 - 24,
        )
    ]


def _fake_simulations(calls: list):
    """A made-up device at 5 requests/s: an aggregated replica's p99 TPOT is 30 ms whatever its replicas (prompt
    chunks share its iterations); a disaggregated layout's is 10 ms while each decode instance gets at most 3
    requests/s, else 1 s. Every request finishes."""

    def run(points):
        calls.append(
            [(p.params["dp"], p.params["prefill_instances"], p.params["decode_instances"]) for p in points]
        )
        rows = []
        for p in points:
            params = p.params
            x, y = params["prefill_instances"], params["decode_instances"]
            devices = (x + y) if x else params["dp"]
            tpot = 30.0 if not x else (10.0 if params["rate"] / y <= 3 else 1000.0)
            rows.append(
                {
                    **params,
                    "error": None,
                    "never_fit": 0,
                    "devices": devices,
                    "p99_tpot_ms": tpot,
                    "p99_ttft_ms": 10.0,
                    "median_e2el_s": 0.1,
                    "request_throughput": params["rate"],
                    "mean_kv_transfer_ms": 0.5 if x else None,
                    "output_tokens_per_s_per_device": params["rate"] * 8 / devices,
                }
            )
        return SweepResult(rows=rows, columns=list(rows[0]))

    return run


def test_a_disaggregated_layout_scales_by_its_ratio_and_wins_when_only_it_meets_the_objectives():
    calls: list = []
    request = PlanRequest(
        model=LLAMA,
        input_tokens=32,
        output_tokens=8,
        devices=["h100-sxm"],
        weights=[None],
        tpot=Objective("p99", 0.02),
        rate=5.0,
        max_devices=4,
        disaggregated=True,
        validate=0,  # the search alone
    )
    chosen = [{**LAYOUT, "tp": 1}]
    chosen += plan_disaggregated.candidates(chosen, request.max_devices)
    result = PlanResult(
        request, **capacity.search(request, commands()["simulate"], chosen, _fake_simulations(calls))
    )
    # Only the aggregated layout gets more replicas; the six ratios run once, the fewest devices first.
    assert calls == [
        [(1, None, None), (1, 1, 1), (1, 1, 2), (1, 2, 1), (1, 1, 3), (1, 2, 2), (1, 3, 1)],
        [(2, None, None)],
        [(4, None, None)],
    ]
    # Two or more decode instances keep TPOT at 10 ms; 1 + 2 serves the rate on the fewest devices.
    assert [(r["prefill_instances"], r["decode_instances"]) for r in result.best] == [(1, 2), (1, 3), (2, 2)]
    # the served layout's misses
    assert [(r["dp"], r["missed"]) for r in result.missed] == [(4, "p99 TPOT 30.0 ms over 20.0 ms")]
    assert result.verdict["winner"] == "disaggregated" and result.verdict["aggregated"] is None
    assert result.verdict["why"] == "only disaggregated layouts meet the objectives at this traffic"


def test_the_verdict_compares_the_best_of_each_kind_and_says_why():
    request = PlanRequest(model=LLAMA, tpot=Objective("p90", 0.05), disaggregated=True)
    pooled = {
        "tp": 1,
        "pp": 1,
        "ep": 1,
        "dp": 1,
        "prefill_instances": 1,
        "decode_instances": 2,
        "devices": 3,
        "output_tokens_per_s_per_device": 300.0,
        "p90_tpot_ms": 12.0,
        "p99_ttft_ms": 90.0,
        "mean_kv_transfer_ms": 0.25,
    }
    aggregated = {
        "tp": 2,
        "pp": 1,
        "ep": 1,
        "dp": 2,
        "devices": 4,
        "output_tokens_per_s_per_device": 200.0,
        "p90_tpot_ms": 40.0,
        "p99_ttft_ms": 60.0,
    }
    found = plan_disaggregated.verdict(
        request, [pooled, aggregated], "output_tokens_per_s_per_device", "output tokens/s per device"
    )
    assert found["winner"] == "disaggregated"
    assert found["why"].startswith(
        "1 prefill + 2 decode instances of 1 device (3 devices) gives 300 output tokens/s "
        "per device against 200 for the best aggregated layout, tp 2 x 2 replicas (4 "
        "devices); p90 TPOT 12.0 ms against 40.0 ms, p99 TTFT 90.0 ms against 60.0 ms."
    )
    assert "0.250 ms" in found["why"]
    reverse = plan_disaggregated.verdict(
        request, [aggregated, pooled], "output_tokens_per_s_per_device", "tok/s"
    )
    assert reverse["winner"] == "aggregated" and "Every device serves both phases" in reverse["why"]
    # not searched
    assert plan_disaggregated.verdict(PlanRequest(model=LLAMA), [aggregated], "x", "y") is None


def test_plan_searches_disaggregated_layouts_as_castcore_simulate_runs_them(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "castcore",
            "plan",
            "--model",
            LLAMA,
            "--input",
            "32",
            "--output",
            "8",
            "--tp",
            "1",
            "--pp",
            "1",
            "--weights",
            "bf16",
            "--rate",
            "40",
            "--requests",
            "40",
            "--disaggregated",
            "--validate",
            "0",
            "--max-devices",
            "3",
            "--top",
            "10",
            "--device-file",
            str(DATA / "h100-sxm.toml"),
            "--no-packs",
            "--workers",
            "1",
            "--json",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")},
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["layouts"] == 1 + 3  # tp 1, and it as 1+1, 1+2 and 2+1 instances
    pooled = [r for r in found["best"] if r["prefill_instances"]]
    assert sorted((r["prefill_instances"], r["decode_instances"], r["devices"]) for r in pooled) == [
        (1, 1, 2),
        (1, 2, 3),
        (2, 1, 3),
    ]
    assert found["verdict"]["winner"] in ("aggregated", "disaggregated") and found["verdict"]["why"]
    # The tiny model keeps up with the rate on one device: fewer devices, more tokens/s per device.
    assert found["verdict"]["winner"] == "aggregated" and found["best"][0]["devices"] == 1
    one = next(r for r in pooled if (r["prefill_instances"], r["decode_instances"]) == (2, 1))
    simulated = castcore.Session(load_packs=[], device_files=[DATA / "h100-sxm.toml"]).simulate(
        LLAMA,
        input_lengths="32",
        output_lengths="8",
        rate=40.0,
        requests=40,
        device="h100-sxm",
        prefill_instances=2,
        decode_instances=1,
    )
    assert one["output_throughput"] == pytest.approx(simulated.summary["output_throughput"])
    assert one["mean_kv_transfer_ms"] == pytest.approx(simulated.summary["mean_kv_transfer_ms"])


@pytest.mark.parametrize("argv", [[], ["--concurrency", "4"]])
def test_disaggregated_plans_need_a_rate(capsys, argv):
    assert (
        main(
            [
                "plan",
                "--model",
                LLAMA,
                "--input",
                "32",
                "--output",
                "8",
                "--device-file",
                str(DATA / "h100-sxm.toml"),
                "--no-packs",
                "--disaggregated",
                *argv,
            ]
        )
        == 2
    )
    captured = capsys.readouterr()
    errors = [line for line in captured.err.splitlines() if line.startswith("castcore: error:")]
    assert captured.out == "" and len(errors) == 1
    assert "--disaggregated simulates two pools under traffic: give --rate or --max-rate" in errors[0]


def test_launch_files_are_the_best_aggregated_deployments(capsys):
    from castcore.cli.plan import _launched
    from castcore.errors import ModelError

    pooled = {"tp": 1, "prefill_instances": 1, "decode_instances": 2}
    aggregated = {"tp": 2, "prefill_instances": None, "decode_instances": None}
    assert _launched(PlanResult(PlanRequest(model=LLAMA), [], [pooled, aggregated], [])) is aggregated
    with pytest.raises(ModelError, match="only disaggregated layouts meet the objectives"):
        _launched(PlanResult(PlanRequest(model=LLAMA), [], [pooled], []))


@pytest.mark.parametrize(
    "argv, unwritten",
    [
        (["--prefill-instances", "1", "--decode-instances", "1"], "--prefill-instances"),
        (["--spec-tokens", "2", "--acceptance", "0.8", "--draft-model", "eagle"], "--spec-tokens"),
        (["--prefix-len", "16"], "--prefix-len"),
    ],
)
def test_simulate_writes_no_launch_files_it_cannot_write_whole(capsys, argv, unwritten):
    assert (
        main(
            [
                "simulate",
                "--model",
                LLAMA,
                "--input",
                "32",
                "--output",
                "8",
                "--requests",
                "4",
                "--rate",
                "4",
                "--device-file",
                str(DATA / "h100-sxm.toml"),
                "--no-packs",
                "--emit",
                "vllm",
                *argv,
            ]
        )
        == 2
    )
    captured = capsys.readouterr()
    errors = [line for line in captured.err.splitlines() if line.startswith("castcore: error:")]
    assert captured.out == "" and len(errors) == 1
    assert f"without {unwritten} yet: drop {unwritten} to write them" in errors[0]
