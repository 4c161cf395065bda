"""Launch files (castcore.sweeps.launch, castcore plan --emit): each engine's launch, benchmark and castcore simulate
commands for a deployment and its traffic, checked by hand on small cases, and the plan's --emit end to end."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from castcore.cli.main import build_parser
from castcore.simulation.presets import limits
from castcore.sweeps.launch import HUB_IDS, hub_id, launch_files
from castcore.sweeps.launch_bench import Traffic
from castcore.sweeps.launch_server import Deployment
from castcore.workload.spec import load_model_config, preset_names

ROOT = Path(__file__).parents[2]
DATA = ROOT / "tests" / "data"
LLAMA = str(DATA / "tiny-llama.json")
PLAN = [
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
    "--device-file",
    str(DATA / "h100-sxm.toml"),
    "--no-packs",
    "--workers",
    "2",
]


def test_vllm_tp_8_fp8():
    files = launch_files(
        "vllm",
        Deployment("llama-3-70b", device="h100-sxm", tp=8, weights="fp8", activations="fp8", kv_cache="fp8"),
        Traffic(1024, 256, 500, rate=4.0, seed=3),
    )
    assert shlex.join(files.launch) == (
        "vllm serve meta-llama/Meta-Llama-3-70B --tensor-parallel-size 8 --pipeline-parallel-size 1 --dtype bfloat16 "
        "--quantization fp8 --kv-cache-dtype fp8 --max-num-batched-tokens 8192 --max-num-seqs 1024 --block-size 16 "
        "--gpu-memory-utilization 0.9 --enable-chunked-prefill"
    )
    assert shlex.join(files.bench) == (
        "vllm bench serve --backend vllm --model meta-llama/Meta-Llama-3-70B --dataset-name random "
        "--random-input-len 1024 --random-output-len 256 --random-range-ratio 0 --ignore-eos --num-prompts 500 "
        "--request-rate 4 --seed 3 --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,90,95,99 "
        "--save-result --result-filename vllm-bench.json"
    )
    assert shlex.join(files.simulate) == (
        "castcore simulate --model llama-3-70b --device h100-sxm --input 1024 --output 256 --requests 500 --rate 4 "
        "--seed 3 --engine vllm --tp 8 --weights fp8 --activations fp8 --kv-cache fp8 --json"
    )
    assert files.notes == [] and files.options_yaml is None
    assert files.lines()[-1] == shlex.join(files.simulate) + " > castcore-simulate.json"


def test_the_simulate_command_parses_as_castcore_simulate():
    files = launch_files(
        "sglang",
        Deployment("mixtral-8x7b", device="h100-sxm", tp=2, ep=2, dp=2),
        Traffic(512, 64, 100, concurrency=16),
        castcore_options=["--no-packs"],
    )
    args = build_parser().parse_args(files.simulate[1:])
    assert (
        args.command,
        args.model,
        args.tp,
        args.ep,
        args.dp,
        args.concurrency,
        args.engine,
        args.json,
    ) == ("simulate", "mixtral-8x7b", 2, 2, 2, 16, "sglang", True)


def test_sglang_attention_dp_and_ep():
    deployment = Deployment("deepseek-v3", device="h200", tp=2, attention_dp=4, ep=8, kv_cache="fp8")
    files = launch_files("sglang", deployment, Traffic(2048, 512, 256, concurrency=64))
    assert shlex.join(files.launch) == (
        "python -m sglang.launch_server --model-path deepseek-ai/DeepSeek-V3 --tp-size 8 --pp-size 1 --dp-size 4 "
        "--enable-dp-attention --ep-size 8 --dtype bfloat16 --kv-cache-dtype fp8_e4m3 --chunked-prefill-size 8192 "
        "--max-running-requests 4096 --page-size 1"
    )
    # SGLang's own default fraction for the device and TP is left to it; one castcore was given is passed on.
    given = launch_files(
        "sglang", deployment, Traffic(2048, 512, 256), limits("sglang", kv_memory_fraction=0.8)
    ).launch
    assert given[-2:] == ["--mem-fraction-static", "0.8"]
    # decodes batched with the prompt chunks, as castcore simulated them: SGLang's flag, and simulate's option
    mixed = launch_files("sglang", deployment, Traffic(2048, 512, 256), limits("sglang", mixed_chunk=True))
    assert "--enable-mixed-chunk" in mixed.launch and "--enable-mixed-chunk" not in files.launch
    assert mixed.simulate[mixed.simulate.index("--mixed-chunk") + 1] == "on"
    assert "--mixed-chunk" not in files.simulate
    # a limit given as a word passes on as given
    reserved = launch_files(
        "sglang", deployment, Traffic(2048, 512, 256), limits("sglang", kv_policy="reserve")
    )
    assert reserved.simulate[reserved.simulate.index("--kv-policy") + 1] == "reserve"
    assert shlex.join(files.bench) == (
        "python -m sglang.bench_serving --backend sglang --model deepseek-ai/DeepSeek-V3 --dataset-name random "
        "--random-input-len 2048 --random-output-len 512 --random-range-ratio 1 --num-prompts 256 --request-rate inf "
        "--max-concurrency 64 --seed 0 --output-file sglang-bench.jsonl"
    )
    assert any("refuses attention data parallelism" in n for n in files.notes)
    # The checkpoint ships fp8 blocks: weights=None prices it so, and no quantization flag is needed.
    assert not any("quantization" in flag or "torchao" in flag for flag in files.launch)
    # --ep above --tp says the same layout.
    same = launch_files(
        "sglang",
        Deployment("deepseek-v3", device="h200", tp=2, ep=8, kv_cache="fp8"),
        Traffic(2048, 512, 256, concurrency=64),
    )
    assert same.launch == files.launch


def test_trtllm_with_pipeline_stages_and_its_yaml():
    deployment = Deployment("llama-3-70b", device="h100-sxm", tp=4, pp=2, kv_cache="fp8")
    engine = limits("trtllm", chunked_prefill=True, max_batched_tokens=4096)
    files = launch_files(
        "trtllm",
        deployment,
        Traffic(1024, 128, 300, rate=2.5, burstiness=0.5),
        engine,
        castcore_options=["--device-file", "my h100.toml"],
    )
    assert shlex.join(files.launch) == (
        "trtllm-serve meta-llama/Meta-Llama-3-70B --tp_size 4 --pp_size 2 --max_batch_size 2048 --max_num_tokens 4096 "
        "--kv_cache_free_gpu_memory_fraction 0.9 --enable_chunked_prefill --extra_llm_api_options trtllm-options.yml"
    )
    assert files.options_yaml == (
        "kv_cache_config:\n  tokens_per_block: 32\n  dtype: fp8\nscheduler_config:\n"
        "  capacity_scheduler_policy: GUARANTEED_NO_EVICT"
    )
    assert shlex.join(files.bench) == (
        "python -m tensorrt_llm.serve.scripts.benchmark_serving --backend openai --model meta-llama/Meta-Llama-3-70B "
        "--dataset-name random --random-ids --random-input-len 1024 --random-output-len 128 --random-range-ratio 0 "
        "--ignore-eos --num-prompts 300 --request-rate 2.5 --burstiness 0.5 --seed 0 --percentile-metrics "
        "ttft,tpot,itl,e2el --metric-percentiles 50,90,95,99 --save-result --result-filename trtllm-bench.json"
    )
    assert shlex.join(files.simulate) == (
        "castcore simulate --model llama-3-70b --device h100-sxm --input 1024 --output 128 --requests 300 --rate 2.5 "
        "--burstiness 0.5 --seed 0 --engine trtllm --max-batched-tokens 4096 --chunked-prefill on --tp 4 --pp 2 "
        "--kv-cache fp8 --device-file 'my h100.toml' --json"
    )
    lines = files.lines()
    assert (
        lines[lines.index("cat > trtllm-options.yml <<'EOF'") + 1 : lines.index("EOF")]
        == files.options_yaml.splitlines()
    )


@pytest.mark.parametrize(
    "engine, launched, options_yaml",
    [
        ("vllm", ["--enforce-eager"], None),
        ("sglang", ["--disable-cuda-graph"], None),
        ("trtllm", [], "cuda_graph_config: null"),
    ],
)
def test_eager_mode_and_the_capture_size_reach_each_engines_launch(engine, launched, options_yaml):
    deployment, traffic = Deployment("llama-3-8b", device="h100-sxm"), Traffic(512, 64, 100, rate=2.0)
    eager = launch_files(engine, deployment, traffic, limits(engine, enforce_eager=True))
    assert [f for f in eager.launch if f in launched] == launched
    assert options_yaml is None or options_yaml in eager.options_yaml.splitlines()
    assert "--enforce-eager" in eager.simulate and "--max-capture-size" not in eager.simulate
    sized = launch_files(engine, deployment, traffic, limits(engine, max_capture_size=64))
    assert sized.simulate[sized.simulate.index("--max-capture-size") + 1] == "64"
    said = {
        "vllm": '--compilation-config {"max_cudagraph_capture_size": 64}',
        "sglang": "--cuda-graph-max-bs 64",
        "trtllm": "",
    }[engine]
    assert said in " ".join(sized.launch)
    if engine == "trtllm":
        assert "cuda_graph_config:\n  max_batch_size: 64" in sized.options_yaml


def test_what_an_engine_lacks_is_a_note_never_a_flag():
    int8 = Deployment("llama-3-8b", weights="int8")
    vllm = launch_files("vllm", int8, Traffic(128, 16))
    assert not any(f.startswith("--quantization") for f in vllm.launch)
    assert any("int8 weight-only checkpoint" in n for n in vllm.notes)
    sglang = launch_files("sglang", int8, Traffic(128, 16)).launch
    assert sglang[sglang.index("--torchao-config") + 1] == "int8wo"
    kv = launch_files("vllm", Deployment("llama-3-8b", kv_cache="int8"), Traffic(128, 16))
    assert "--kv-cache-dtype" not in kv.launch and any("no int8 KV cache" in n for n in kv.notes)
    # Replicas trtllm-serve cannot start as one server: one replica's commands at its share of the traffic.
    split = launch_files("trtllm", Deployment("llama-3-8b", dp=4), Traffic(128, 16, 400, rate=8.0))
    assert any("start 4 of these servers" in n for n in split.notes)
    assert split.bench[split.bench.index("--request-rate") + 1] == "2" and "--dp" not in split.simulate
    assert split.simulate[split.simulate.index("--requests") + 1] == "100"
    whole = launch_files("vllm", Deployment("llama-3-8b", dp=4), Traffic(128, 16, 400, rate=8.0))
    assert whole.launch[whole.launch.index("--data-parallel-size") + 1] == "4" and whole.notes == []


def test_every_preset_has_the_hub_id_its_source_names():
    assert sorted(HUB_IDS) == preset_names()
    for name, repo in HUB_IDS.items():
        source = load_model_config(name)["_source"]
        assert repo in source or repo.replace("Llama-3.1", "Meta-Llama-3.1") in source, name
    folder, why = hub_id(LLAMA)
    assert folder == str(DATA) and "config.json" in why


def _plan(tmp_path, *more):
    return subprocess.run(
        [sys.executable, "-m", "castcore", *PLAN, *more],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")},
    )


def test_plan_emit_prints_the_best_deployments_commands(tmp_path):
    done = _plan(
        tmp_path,
        "--weights",
        "bf16",
        "--rate",
        "40",
        "--requests",
        "40",
        "--ttft",
        "p90:50ms",
        "--validate-requests",
        "400",
        "--emit",
        "vllm",
        "--json",
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    top, emit = found["best"][0], found["emit"]
    assert (top["tp"], top["pp"], top["dp"]) == (1, 1, 1)
    assert emit["launch"].startswith(
        f"vllm serve {DATA} --tensor-parallel-size 1 --pipeline-parallel-size 1 "
    )
    assert emit["simulate"] == (
        f"castcore simulate --model {LLAMA} --device h100-sxm --input 32 --output 8 --requests 400 --rate 40 --seed 0 "
        f"--engine vllm --device-file {DATA / 'h100-sxm.toml'} --no-packs --json"
    )
    # The simulate command gives the plan's own figures for that row: its confirming run of 400 requests.
    simulated = subprocess.run(
        [sys.executable, "-m", *shlex.split(emit["simulate"])],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")},
    )
    assert simulated.returncode == 0, simulated.stderr
    figures = json.loads(simulated.stdout)
    assert figures["p90_ttft_ms"] == pytest.approx(top["p90_ttft_ms"])
    assert figures["output_throughput"] == pytest.approx(top["output_throughput"])
    assert "--request-rate 40 " in emit["bench"] and "--num-prompts 400 " in emit["bench"]


def test_plan_emit_as_text_follows_the_plan(tmp_path):
    done = _plan(tmp_path, "--weights", "bf16", "--ttft", "1s", "--emit", "sglang")
    assert done.returncode == 0, done.stderr
    plan, emitted = done.stdout.split("\nlaunch files for #1 (h100-sxm, 1 device, bf16 weights) on sglang\n")
    assert plan.startswith(f"{LLAMA}: requests of 32 input + 8 output tokens")
    lines = emitted.splitlines()
    server = lines[lines.index("# start the server") + 1]
    assert server.startswith(f"python -m sglang.launch_server --model-path {DATA}")
    assert lines[-1].startswith(f"castcore simulate --model {LLAMA} --device h100-sxm --input 32 --output 8 ")


@pytest.mark.parametrize(
    "more, said",
    [
        (
            [
                "--weights",
                "bf16",
                "--max-devices",
                "1",
                "--rate",
                "40",
                "--requests",
                "8",
                "--ttft",
                "p99:1us",
                "--emit",
                "vllm",
            ],
            "--emit vllm: no deployment meets the objectives",
        ),
        (
            ["--rate", "4", "--emit", "sglang"],
            "--emit sglang with --engine vllm: the plan simulates vllm's scheduler",
        ),
    ],
)
def test_plan_emit_refuses_in_one_line_and_prints_nothing(tmp_path, more, said):
    done = _plan(tmp_path, *more)
    assert done.returncode == 2 and done.stdout == ""
    errors = [line for line in done.stderr.splitlines() if line.startswith("castcore: error: ")]
    assert len(errors) == 1 and said in errors[0], done.stderr


def test_an_unknown_engine_is_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit) as stopped:
        build_parser().parse_args(PLAN[:3] + ["--emit", "tgi"])
    assert stopped.value.code == 2
    assert "invalid choice: 'tgi'" in capsys.readouterr().err


def test_simulate_emit_prints_the_same_runs_commands(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "castcore",
            "simulate",
            "--model",
            LLAMA,
            "--input",
            "32",
            "--output",
            "8",
            "--requests",
            "20",
            "--concurrency",
            "4",
            "--engine",
            "trtllm",
            "--block-size",
            "64",
            "--tp",
            "2",
            "--device-file",
            str(DATA / "h100-sxm.toml"),
            "--no-packs",
            "--emit",
            "trtllm",
            "--json",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")},
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    emit = found["emit"]
    assert emit["launch"].startswith(f"trtllm-serve {DATA} --tp_size 2 --pp_size 1 --max_batch_size 2048 ")
    assert "  tokens_per_block: 64" in emit["options_yaml"].splitlines()
    assert emit["simulate"] == (
        f"castcore simulate --model {LLAMA} --input 32 --output 8 --requests 20 --concurrency 4 --seed 0 "
        f"--engine trtllm --block-size 64 --tp 2 --device-file {DATA / 'h100-sxm.toml'} --no-packs --json"
    )
    assert "--max-concurrency 4 " in emit["bench"] and found["completed"] == 20


@pytest.mark.parametrize(
    "more, said",
    [
        (
            ["--engine", "vllm", "--emit", "sglang"],
            "--emit sglang with --engine vllm: the simulation runs vllm's",
        ),
        (
            ["--input", "uniform:8:32", "--emit", "vllm"],
            "--emit vllm prints a benchmark of random prompts of fixed lengths",
        ),
    ],
)
def test_simulate_emit_refuses_in_one_line(capsys, more, said):
    from castcore.cli.main import main

    argv = [
        "simulate",
        "--model",
        LLAMA,
        "--input",
        "32",
        "--output",
        "8",
        "--device-file",
        str(DATA / "h100-sxm.toml"),
        "--no-packs",
    ]
    assert main(argv + more) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert (
        captured.out == ""
        and len(lines) == 1
        and lines[0].startswith("castcore: error: ")
        and said in lines[0]
    )
