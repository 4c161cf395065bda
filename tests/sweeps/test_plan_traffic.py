"""castcore plan takes the traffic castcore simulate takes (length distributions, --dataset, --burstiness, --seed,
prefix caching, speculative decoding) and simulates each layout under it: real plans of a tiny model on the H100
test profile, each checked against castcore simulate of the layout it recommends."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import castcore
from castcore.cli.main import main

ROOT = Path(__file__).parents[2]
DATA = ROOT / "tests" / "data"
LLAMA = str(DATA / "tiny-llama.json")
DEVICE = ["--device-file", str(DATA / "h100-sxm.toml"), "--no-packs"]
LAYOUT = ["--tp", "1", "--pp", "1", "--weights", "bf16"]


def _run(tmp_path, *argv: str, layout: list[str] = LAYOUT) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, "-m", "castcore", "plan", "--model", LLAMA, *layout, *argv, *DEVICE],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")},
    )
    assert done.returncode == 0, done.stderr
    return done


def _plan(tmp_path, *argv: str, layout: list[str] = LAYOUT) -> dict:
    return json.loads(_run(tmp_path, *argv, "--json", layout=layout).stdout)


def _simulated(**options):
    session = castcore.Session(load_packs=[], device_files=[DATA / "h100-sxm.toml"])
    return session.simulate(LLAMA, device="h100-sxm", **options).summary


def test_a_plan_under_lognormal_bursty_traffic_with_a_shared_prefix_is_what_simulate_gives(tmp_path):
    found = _plan(
        tmp_path,
        *("--input", "lognormal:64:0.4", "--output", "uniform:4:12", "--rate", "30", "--burstiness", "0.5"),
        *("--seed", "3", "--prefix-len", "8", "--prefix-hit-rate", "0.5", "--requests", "60"),
        *("--validate", "1", "--validate-requests", "400"),
        *("--ttft", "p95:1s", "--workers", "1"),
    )
    assert found["input_tokens"] == "lognormal:64:0.4" and found["output_tokens"] == "uniform:4:12"
    assert found["burstiness"] == 0.5 and found["seed"] == 3 and found["prefix_len"] == 8
    best = found["best"][0]
    # the best as its confirming simulation of 400 requests served them
    assert (best["tp"], best["pp"], best["dp"], best["completed"]) == (1, 1, 1, 400)
    traffic = dict(input_lengths="lognormal:64:0.4", output_lengths="uniform:4:12", requests=400, seed=3)
    simulated = _simulated(**traffic, rate=30.0, burstiness=0.5, prefix_len=8, prefix_hit_rate=0.5)
    assert best["output_throughput"] == pytest.approx(simulated["output_throughput"])
    assert best["p95_ttft_ms"] == pytest.approx(simulated["p95_ttft_ms"])
    # the traffic reached the simulation: fixed lengths of the distribution's median give other figures
    fixed = _simulated(
        input_lengths="64", output_lengths="8", requests=400, seed=3, rate=30.0, burstiness=0.5
    )
    assert best["output_throughput"] != pytest.approx(fixed["output_throughput"])


def test_a_plan_of_a_dataset_in_a_closed_loop_with_speculative_decoding_is_what_simulate_gives(tmp_path):
    dataset = tmp_path / "requests.jsonl"
    dataset.write_text(
        "".join(json.dumps({"prompt_len": 20 + 7 * i, "output_len": 3 + i % 5}) + "\n" for i in range(24))
    )
    speculation = ("--spec-tokens", "2", "--draft-model", LLAMA, "--acceptance", "0.6")
    page = tmp_path / "plan.html"
    found = _plan(
        tmp_path,
        "--dataset",
        str(dataset),
        "--concurrency",
        "4",
        *speculation,
        "--workers",
        "1",
        "--html",
        str(page),
    )
    best = found["best"][0]
    assert best["completed"] == 24 and found["dataset"] == str(dataset) and found["spec_tokens"] == 2
    # the page names the dataset, not --input's default
    assert f"requests of {dataset}, no latency objective" in page.read_text()
    simulated = _simulated(
        dataset=str(dataset), concurrency=4, spec_tokens=2, draft_model=LLAMA, acceptance="0.6"
    )
    assert best["output_throughput"] == pytest.approx(simulated["output_throughput"])
    assert best["p99_tpot_ms"] == pytest.approx(simulated["p99_tpot_ms"])


def test_max_rate_bisects_under_the_bursty_traffic(tmp_path):
    found = _plan(
        tmp_path,
        *("--input", "normal:40:10", "--output", "6", "--max-rate", "--burstiness", "0.3"),
        *("--requests", "30", "--ttft", "p90:7.5ms", "--workers", "1", "--validate", "0"),
    )
    best = found["best"][0]
    assert best["max_rate"] > 0 and best["rate"] == best["max_rate"]
    simulated = _simulated(
        input_lengths="normal:40:10", output_lengths="6", requests=30, rate=best["rate"], burstiness=0.3
    )
    assert best["p90_ttft_ms"] == pytest.approx(simulated["p90_ttft_ms"]) and best["p90_ttft_ms"] <= 7.5


@pytest.mark.parametrize(
    "argv, said",
    [
        (
            ["--input", "lognormal:1000:1"],
            "--input lognormal:1000:1 describes traffic, and a static plan prices one batch of fixed --input and "
            "--output lengths: give --rate QPS, --concurrency C or --max-rate to simulate it",
        ),
        (["--prefix-len", "8"], "--prefix-len 8 describes traffic"),
        (
            ["--max-batched-tokens", "64", "128"],
            "--max-batched-tokens 64 128 is a limit of the engine serving traffic, and a static plan prices one batch "
            "of fixed --input and --output lengths: give --rate QPS, --concurrency C or --max-rate to simulate it",
        ),
        (
            ["--max-running-requests", "8"],
            "--max-running-requests 8 is a limit of the engine serving traffic",
        ),
        (
            ["--rate", "4", "--activations", "fp16"],
            "--activations fp16: the model runs in --dtype bf16; give bf16 for unquantized activations",
        ),
        (
            ["--input", "lognormal:32:0", "--rate", "4"],
            "--input lognormal:32:0: Token lengths 'lognormal:32:0': SIGMA must be greater than 0",
        ),
        (
            ["--output", "uniform:9:3", "--rate", "4"],
            "--output uniform:9:3: Token lengths 'uniform:9:3': LOW",
        ),
        (["--rate", "4", "--dataset", "DATASET"], "line 1: input 30, output None; give one JSON object"),
        (
            ["--max-rate", "--ttft", "1s", "--dataset", "TIMED"],
            "gives each request its arrival time, so --max-rate",
        ),
        (["--concurrency", "4", "--burstiness", "0.5"], "--burstiness 0.5 shapes the gaps between arrivals"),
        (["--rate", "4", "--prefix-hit-rate", "0.5"], "--prefix-hit-rate 0.5 needs --prefix-len"),
        (["--rate", "4", "--spec-tokens", "2"], "--spec-tokens 2 needs --draft-model"),
        (["--rate", "4", "--ttft", "p75:1s"], "--ttft p75:1s: give TIME or STATISTIC:TIME"),
        (["--rate", "4", "--max-model-len", "100000"], "--max-model-len 100000: above"),
        (["--rate", "4", "--max-model-len", "16"], "all 500 requests are rejected"),
        (
            ["--rate", "4", "--input", "uniform:8:16", "--emit", "vllm"],
            "--emit vllm prints a benchmark of random prompts of fixed lengths, which --input cannot be",
        ),
    ],
)
def test_bad_traffic_is_one_line_and_exit_2(capsys, tmp_path, argv, said):
    dataset = tmp_path / "no-outputs.jsonl"
    dataset.write_text('{"input_tokens": 30}\n')
    timed = tmp_path / "timed.jsonl"
    timed.write_text('{"input_tokens": 30, "output_tokens": 4, "arrival_s": 0.5}\n')
    argv = [{"DATASET": str(dataset), "TIMED": str(timed)}.get(a, a) for a in argv]
    assert main(["plan", "--model", LLAMA, *LAYOUT, "--input", "32", "--output", "8", *argv, *DEVICE]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) <= 2 and err[-1].startswith("castcore: error: ") and said in err[-1], err


def test_python_plan_names_its_traffic_keywords(capsys):
    with pytest.raises(castcore.ModelError, match="input_tokens='normal:0:1'"):
        castcore.plan(LLAMA, input_tokens="normal:0:1", rate=2.0)
    with pytest.raises(TypeError, match="'burstyness'"):
        castcore.plan(LLAMA, rate=2.0, burstyness=0.5)


def test_plan_help_documents_its_traffic_and_exit_3(capsys):
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "3 when none does" in text
    for flag in (
        "--dataset",
        "--burstiness",
        "--prefix-len",
        "--spec-tokens",
        "--draft-model",
        "--acceptance",
        "--max-model-len",
        "--max-batched-tokens",
        "--max-running-requests",
    ):
        assert flag in text


def test_a_plan_whose_objective_needs_three_replicas_finds_three_not_four(tmp_path):
    traffic = ("--input", "200", "--output", "40", "--rate", "200000", "--requests", "200")
    found = _plan(
        tmp_path, *traffic, "--ttft", "p99:10.3ms", "--max-devices", "4", "--workers", "1", "--validate", "0"
    )
    best = found["best"][0]
    assert (best["tp"], best["dp"], best["devices"]) == (1, 3, 3)
    # one replica, two (missed), four (met), then three between them: four simulations, not one a count
    assert found["points"] == 4
    # simulate agrees: two replicas miss the objective, three meet it
    at = dict(input_lengths="200", output_lengths="40", requests=200, rate=200000.0)
    assert _simulated(**at, dp=2)["p99_ttft_ms"] > 10.3 >= _simulated(**at, dp=3)["p99_ttft_ms"]
    assert best["p99_ttft_ms"] == pytest.approx(_simulated(**at, dp=3)["p99_ttft_ms"])


def test_a_plan_over_fp8_activations_and_kv_caches_simulates_each_and_says_so(tmp_path):
    fp8 = [*LAYOUT[:-1], "fp8"]  # fp8 weights: W8A8 with --activations fp8
    traffic = ("--input", "64", "--output", "8", "--rate", "2000", "--requests", "60", "--workers", "1")
    traffic += ("--validate", "0")  # the search's own rows
    found = _plan(tmp_path, *traffic, "--activations", "fp8", "--kv-cache", "fp8", "bf16", layout=fp8)
    rows = sorted(found["best"], key=lambda r: r["kv_cache"])
    assert [(r["weights"], r["activations"], r["kv_cache"]) for r in rows] == [
        ("fp8", "fp8", "bf16"),
        ("fp8", "fp8", "fp8"),
    ]
    at = dict(input_lengths="64", output_lengths="8", requests=60, rate=2000.0, weights="fp8")
    for row in rows:
        simulated = _simulated(**at, activations="fp8", kv_cache=row["kv_cache"])
        assert row["p99_ttft_ms"] == pytest.approx(simulated["p99_ttft_ms"])
    # the activations reached the simulation: weight-only fp8 gives another TTFT
    assert rows[0]["p99_ttft_ms"] != pytest.approx(_simulated(**at, kv_cache="bf16")["p99_ttft_ms"])
    text = _run(tmp_path, *traffic, "--activations", "fp8", "--kv-cache", "fp8", layout=fp8).stdout
    assert "1 device, fp8 weights, fp8 activations, fp8 KV cache" in text
