"""castcore plan: the layouts searched, the rounds that step a batch down until the objectives are met, and a real
search over a tiny model on a device of a few MiB."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import castcore
from castcore.devices.profile_files import load_device_file
from castcore.options.plan import PLAN
from castcore.options.option import Objective
from castcore.sweeps import capacity
from castcore.sweeps.plan import PlanRequest, PlanResult, search
from castcore.sweeps.plan_space import layouts
from castcore.sweeps.run import SweepResult
from castcore.sweeps.sweep import commands
from castcore.workload.spec import ModelError, load_model_config

ROOT = Path(__file__).parents[2]
DATA = ROOT / "tests" / "data"
LLAMA = str(DATA / "tiny-llama.json")


@pytest.fixture
def h100():
    return load_device_file(DATA / "h100-sxm.toml")  # nvlink 8 devices, infiniband 1024


def test_layouts_put_tensor_parallelism_in_a_node_and_stages_beyond_it(h100):
    llama = load_model_config("llama-3-8b")  # 32 heads, 32 layers
    found = layouts(llama, h100, PlanRequest(model="llama-3-8b"))
    assert found == [{"tp": t, "pp": 1, "ep": 1} for t in (1, 2, 4, 8)]
    wider = layouts(llama, h100, PlanRequest(model="llama-3-8b", max_devices=32))
    assert [(x["tp"], x["pp"]) for x in wider if x["pp"] > 1] == [(8, 2), (8, 4)]  # stages for the largest tp
    asked = layouts(llama, h100, PlanRequest(model="llama-3-8b", tp=[2, 16], pp=[1, 2]))
    assert asked == [{"tp": 2, "pp": 1, "ep": 1}, {"tp": 2, "pp": 2, "ep": 1}]  # tp 16 is over max_devices 8
    moe = layouts(
        load_model_config("mixtral-8x7b"), h100, PlanRequest(model="mixtral-8x7b", tp=[1, 2], pp=[1])
    )
    # Expert parallel equal to tp, and wider: attention data parallel over 2, 4 or 8 groups within 8 devices.
    assert moe == [{"tp": 1, "pp": 1, "ep": ep} for ep in (1, 2, 4, 8)] + [
        {"tp": 2, "pp": 1, "ep": ep} for ep in (1, 2, 4, 8)
    ]


def test_durations():
    ttft, tpot = PLAN["ttft"], PLAN["tpot"]
    assert ttft.check("1s") == Objective("p99", 1.0) and tpot.check("50ms").seconds == pytest.approx(0.05)
    assert tpot.check("200us").seconds == pytest.approx(2e-4) and ttft.check(0.5) == Objective("p99", 0.5)
    assert ttft.check("p90:500ms") == Objective("p90", 0.5) and ttft.check("P50:1s") == Objective(
        "median", 1.0
    )
    assert tpot.check("mean:20ms").field("tpot") == "mean_tpot_ms"
    with pytest.raises(ModelError, match=re.escape("ttft='p75:1s': give TIME or STATISTIC:TIME")):
        ttft.check("p75:1s")
    for bad in ("soon", "1e999", "0ms", float("inf"), -1):
        with pytest.raises(ModelError, match=re.escape(f"ttft={bad!r}: give a time above zero")):
            ttft.check(bad)


@pytest.mark.parametrize(
    "argv, status, said",
    [
        (
            ["--model", "nosuchmodule_xyz:make"],
            2,
            "castcore: error: cannot load model factory 'nosuchmodule_xyz:make'",
        ),
        (
            ["--model", LLAMA, "--input", "32", "--output", "8", "--ttft", "1e999"],
            2,
            "castcore: error: --ttft 1e999: give a time above zero",
        ),
        (
            [
                "--model",
                LLAMA,
                "--input",
                "32",
                "--output",
                "8",
                "--tp",
                "1",
                "--weights",
                "bf16",
                "--ttft",
                "1us",
            ],
            3,
            "no layout fits and meets the objectives",
        ),
    ],
)
def test_plan_exit_status_says_what_happened(tmp_path, argv, status, said):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "castcore",
            "plan",
            *argv,
            "--device-file",
            str(DATA / "h100-sxm.toml"),
            "--no-packs",
            "--workers",
            "1",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")},
    )
    assert done.returncode == status, done.stderr
    assert said in done.stdout + done.stderr
    assert "Traceback" not in done.stderr


def _fake_run(calls: list):
    """Rows as run_points gives them, from a made-up device: each sequence adds 1 ms to TTFT and 0.1 ms to TPOT
    (divided by tp); the largest batch that fits is 100 / devices... times tp (memory splits)."""

    def run(points):
        calls.append([(p.params["tp"], p.params["max_batch"], p.params["batch"]) for p in points])
        rows = []
        for p in points:
            params, tp = p.params, p.params["tp"]
            batch = 100 * tp if params["max_batch"] else params["batch"]
            ttft, tpot = batch * 1e-3 / tp, 1e-3 + batch * 1e-4 / tp
            latency = ttft + 8 * tpot
            rows.append(
                {
                    **params,
                    "served_batch": batch,
                    "fits": True,
                    "ttft_s": ttft,
                    "tpot_s": tpot,
                    "latency_s": latency,
                    "devices": tp,
                    "error": None,
                    "output_tokens_per_s_per_device": batch * 8 / latency / tp,
                }
            )
        return SweepResult(rows=rows, columns=list(rows[0]))

    return run


def test_a_layout_missing_an_objective_steps_down_in_powers_of_two(h100):
    calls: list = []
    request = PlanRequest(
        model=LLAMA,
        input_tokens=32,
        output_tokens=8,
        devices=["h100-sxm"],
        tp=[1, 2],
        pp=[1],
        weights=[None],
        ttft=Objective("p99", 0.02),
    )
    result = search(request, commands()["serve"], {"h100-sxm": h100}, _fake_run(calls))
    # Round 1 at the largest batches (100 and 200: TTFT 100 ms); then 64, 128; 32, 64; 16, 32 meet 20 ms.
    assert calls == [
        [(1, True, 1), (2, True, 1)],
        [(1, False, 64), (2, False, 128)],
        [(1, False, 32), (2, False, 64)],
        [(1, False, 16), (2, False, 32)],
    ]
    assert [(r["tp"], r["served_batch"]) for r in result.best] == [(1, 16), (2, 32)]
    assert all(r["ttft_s"] <= 0.02 for r in result.best)
    assert [(r["devices"], r["served_batch"]) for r in result.fewest] == [(1, 100)]
    assert result.layouts == 2 and len(result.rows) == 8


def test_plan_finds_the_best_deployment_of_a_tiny_model(tmp_path):
    device = tmp_path / "small.toml"  # an H100 of 4 MiB: the tiny model's largest batch is about 90
    text = (DATA / "h100-sxm.toml").read_text().replace('name = "h100-sxm"', 'name = "h100-small"')
    device.write_text(text.replace("memory_bytes = 85899345920", "memory_bytes = 4194304"))
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
            "2",
            "--ttft",
            "1ms",
            "--device-file",
            str(device),
            "--no-packs",
            "--workers",
            "2",
            "--json",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")},
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    # tp 1, tp 2, tp 2 x pp 2; bf16 and int8
    assert found["devices"] == ["h100-small"] and found["layouts"] == 6
    best = found["best"]
    assert best and all(r["ttft_s"] <= 1e-3 and r["peak_bytes"] <= 4194304 for r in best)
    speeds = [r["output_tokens_per_s_per_device"] for r in best]
    assert speeds == sorted(speeds, reverse=True)
    top = best[0]
    assert (top["devices"], top["tp"], top["weights"]) == (1, 1, "int8")
    # Its batch is the largest that fits, as castcore serve --max-batch finds it, and its figures are serve's.
    served = castcore.Session(load_packs=[], device_files=[device]).serve(
        LLAMA, input_tokens=32, output_tokens=8, batch="max", weights="int8", device="h100-small"
    )
    assert top["served_batch"] == served.batch
    assert top["output_tokens_per_s_per_device"] == served.to_dict()["output_tokens_per_s_per_device"]
    assert found["fewest"][0]["devices"] == 1


def _fake_simulations(calls: list, capacity: dict[int, float]):
    """Simulate rows from a made-up device: a replica of tp t serves ``capacity[t]`` requests/s; below that its p99
    TTFT is 10 ms, above it 1 s (the queue grows); offline (no rate) it serves exactly its capacity."""

    def run(points):
        calls.append([(p.params["tp"], p.params["dp"], p.params["rate"]) for p in points])
        rows = []
        for p in points:
            params = p.params
            tp, dp, rate = params["tp"], params["dp"], params["rate"]
            served = capacity[tp] * dp if rate is None else min(rate, capacity[tp] * dp)
            p99 = 10.0 if rate is None or rate / dp <= capacity[tp] else 1000.0
            rows.append(
                {
                    **params,
                    "error": None,
                    "never_fit": 0,
                    "devices": tp * dp,
                    "p99_ttft_ms": p99,
                    "median_e2el_s": 0.1,
                    "request_throughput": served,
                    "output_tokens_per_s_per_device": served * 8 / (tp * dp),
                }
            )
        return SweepResult(rows=rows, columns=list(rows[0]))

    return run


def test_under_traffic_a_layout_missing_an_objective_gets_more_replicas():
    calls: list = []
    request = PlanRequest(
        model=LLAMA,
        input_tokens=32,
        output_tokens=8,
        devices=["h100-sxm"],
        weights=[None],
        ttft=Objective("p99", 0.1),
        rate=5.0,
        max_devices=4,
        validate=0,  # the search alone
    )
    chosen = [
        {
            "model": LLAMA,
            "input": "32",
            "output": "8",
            "dtype": "bf16",
            "device": "h100-sxm",
            "weights": None,
            "requests": 50,
            "engine": "vllm",
            "tp": tp,
            "pp": 1,
            "ep": 1,
        }
        for tp in (1, 2)
    ]
    result = PlanResult(
        request,
        **capacity.search(
            request, commands()["simulate"], chosen, _fake_simulations(calls, {1: 2.0, 2: 3.0})
        ),
    )
    # tp 1 needs 3 replicas (5 / 2 per replica): 1, 2, then 4 meets and 3, between 2 and 4, meets too; tp 2
    # needs 2, and 2 x 2 is the most devices.
    assert calls == [[(1, 1, 5.0), (2, 1, 5.0)], [(1, 2, 5.0), (2, 2, 5.0)], [(1, 4, 5.0)], [(1, 3, 5.0)]]
    # 3 replicas of tp 1 serve 13.3 tok/s per device, 2 of tp 2 10
    assert [(r["tp"], r["dp"]) for r in result.best] == [(1, 3), (2, 2)]
    assert [(r["devices"]) for r in result.fewest] == [3]
    assert result.missed == [] and result.layouts == 2


def test_max_rate_bisects_to_the_highest_rate_within_the_objectives():
    calls: list = []
    request = PlanRequest(
        model=LLAMA, devices=["h100-sxm"], weights=[None], ttft=Objective("p99", 0.1), max_rate=True
    )
    chosen = [
        {
            "model": LLAMA,
            "input": "32",
            "output": "8",
            "dtype": "bf16",
            "device": "h100-sxm",
            "weights": None,
            "requests": 50,
            "engine": "vllm",
            "tp": tp,
            "pp": 1,
            "ep": 1,
        }
        for tp in (1, 2)
    ]
    result = PlanResult(
        request,
        **capacity.search(
            request, commands()["simulate"], chosen, _fake_simulations(calls, {1: 7.3, 2: 9.0})
        ),
    )
    assert calls[0] == [(1, 1, None), (2, 1, None)]  # offline first: each one's bound
    assert len(calls) <= 1 + 8
    found = {r["tp"]: r["max_rate"] for r in result.best}
    assert 7.3 * 0.95 <= found[1] <= 7.3 and 9.0 * 0.95 <= found[2] <= 9.0
    assert [r["tp"] for r in result.best] == [1, 2]  # 7.3 per device beats 4.5


@pytest.mark.parametrize(
    "argv, said",
    [
        (
            ["--max-rate"],
            "--max-rate finds the highest rate that meets the objectives: give --ttft or --tpot",
        ),
        (["--rate", "0"], "--rate 0.0: must be a number above zero"),
        (["--rate", "2", "--ttft", "p75:1s"], "--ttft p75:1s: give TIME or STATISTIC:TIME"),
    ],
)
def test_a_traffic_plan_refuses_bad_input_in_one_line(capsys, argv, said):
    from castcore.cli.main import main

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
                *argv,
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("castcore: error: ") and said in err[-1], err


def test_plan_under_traffic_simulates_each_layout_as_castcore_simulate_does(tmp_path):
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
            "2",
            "--weights",
            "bf16",
            "--rate",
            "40",
            "--requests",
            "40",
            "--ttft",
            "p90:50ms",
            "--validate",
            "0",
            "--device-file",
            str(DATA / "h100-sxm.toml"),
            "--no-packs",
            "--workers",
            "2",
            "--json",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")},
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["objectives"]["ttft"] == {"statistic": "p90", "s": 0.05} and found["rate"] == 40
    best = found["best"]
    # tp 1, tp 2 and tp 2 x pp 2 all keep up with the rate: the fewer devices, the more tokens/s per device.
    assert [(r["tp"], r["pp"], r["dp"]) for r in best] == [(1, 1, 1), (2, 1, 1), (2, 2, 1)]
    assert all(r["p90_ttft_ms"] <= 50 and r["completed"] == 40 for r in best)
    assert {r["weights"] for r in [*best, *found["fewest"]]} == {"bf16"}  # the model's dtype, named
    simulated = castcore.Session(load_packs=[], device_files=[DATA / "h100-sxm.toml"]).simulate(
        LLAMA, input_lengths="32", output_lengths="8", rate=40.0, requests=40, device="h100-sxm"
    )
    assert best[0]["output_throughput"] == pytest.approx(simulated.summary["output_throughput"])
    assert best[0]["p90_ttft_ms"] == pytest.approx(simulated.summary["p90_ttft_ms"])


def test_a_skip_reason_is_printed_whole(tmp_path):
    """A tp that does not divide the heads is skipped before anything runs, and counted with why; a long model path
    makes the reason long: it is printed to its end, the fix included, never cut."""
    model = tmp_path / ("a-model-folder-with-a-long-name-" * 4) / "config.json"
    model.parent.mkdir()
    model.write_text(Path(LLAMA).read_text())
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "castcore",
            "plan",
            "--model",
            str(model),
            "--input",
            "32",
            "--output",
            "8",
            "--tp",
            "1",
            "3",
            "--weights",
            "bf16",
            "--device-file",
            str(DATA / "h100-sxm.toml"),
            "--no-packs",
            "--workers",
            "1",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")},
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[1].startswith("searched 1 layouts on h100-sxm (1 serve points, 0 layouts refused")
    assert (
        # tp 3 and tp 3 x pp 2 (the stages go to the widest tp asked)
        f"skipped 2 candidates: --tp 3: {model}'s num_attention_heads = 4 does not divide by 3; tensor "
        "parallelism splits the heads evenly (use a --tp that divides 4) (such as h100-sxm tp 3)"
    ) in lines
