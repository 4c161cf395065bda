"""KV capacity as each engine computes it (castcore.serving.engine_memory): SGLang's mem_fraction_static from the
device and TP, vLLM's and TensorRT-LLM's rules on known numbers, the line and JSON simulate prints, and
Llama-3.1-70B fp8 on one H100 against a hand computation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import castcore
from castcore.cli.main import main
from castcore.errors import ModelError
from castcore.serving.engine_memory import GiB, budget, sglang_fraction
from castcore.serving.kv_capacity import kv_capacity, step_times
from castcore.serving.simulation_plan import check
from castcore.simulation.presets import limits

DATA = Path(__file__).parents[1] / "data"
LLAMA, H100 = str(DATA / "tiny-llama.json"), str(DATA / "h100-sxm.toml")
ASCEND_910B2 = str(
    Path(__file__).parents[2] / "packs/castpack-ascend/castpack_ascend/profiles/atlas-800t-a2-910b2.toml"
)


@pytest.fixture(scope="module")
def session():
    return castcore.Session(load_packs=[], device_files=[H100])


def test_sglang_fraction_is_its_formula_for_each_device_and_tp():
    # H100 80GB as nvidia-smi reports it (81,559 MiB), TP 1: chunked prefill 8192, graphs up to 256, reserved
    # 512 + 12,288 + 512 + 128 = 13,440 MiB: the 0.835 SGLang logs.
    assert sglang_fraction(81559) == 0.835
    # TP 8: graphs up to 512 and 1 GiB for the parallel size, reserved 512 + 12,288 + 1,024 + 1,024.
    assert sglang_fraction(81559, tp=8) == round((81559 - 14848) / 81559, 3) == 0.818
    # H200 (143,771 MiB) has the H100's reserve over more memory; a 64 GiB Ascend 910B the same over less.
    assert sglang_fraction(143771) == 0.907 and sglang_fraction(64 * 1024) == 0.795
    # Below 60 GiB no 10 GiB floor: a 24 GiB card keeps 512 + 3,072 + 48 + 128 MiB.
    assert sglang_fraction(24 * 1024) == round((24576 - 3760) / 24576, 3)
    # Attention data parallelism pads its graphs: 3 MiB more per graph batch and group.
    assert sglang_fraction(81559, tp=2, attention_dp=2) < sglang_fraction(81559, tp=2)


def test_each_engine_subtracts_what_its_own_rule_does(session):
    profile = session.pipeline.host.device("h100-sxm")
    base = castcore.build_workload(LLAMA)
    weights, activations, per_token = 60 * GiB, 2 * GiB, 2**18
    memory = 80 * GiB
    rules = {
        name: budget(name, limits(name), profile, base, weights, activations, per_token)
        for name in ("vllm", "sglang", "trtllm")
    }
    # vLLM: 0.9 of the device less weights, the profile run's activations and its CUDA graphs (the activations of
    # its largest graph, 512 of the 8,192 tokens).
    assert rules["vllm"].kv_bytes == pytest.approx(0.9 * memory - weights - activations * (1 + 512 / 8192))
    # SGLang: its own fraction of the device (80 GiB is 81,920 MiB) holds the weights and the pool; the reserve
    # covers the activations.
    assert rules["sglang"].fraction == round((81920 - 13440) / 81920, 3)
    assert rules["sglang"].kv_bytes == pytest.approx(rules["sglang"].fraction * memory - weights)
    # TensorRT-LLM: 0.9 of what the weights and activations leave free.
    assert rules["trtllm"].kv_bytes == pytest.approx(0.9 * (memory - weights - activations))
    assert rules["trtllm"].blocks == int(0.9 * (memory - weights - activations) // (32 * per_token))
    # A fraction given is SGLang's --mem-fraction-static as is.
    given = budget("sglang", limits("sglang", kv_memory_fraction=0.9), profile, base, weights, activations, 1)
    assert given.fraction_given and given.kv_bytes == pytest.approx(0.9 * memory - weights)


def test_simulate_says_the_kv_cache_its_engine_gives_and_the_requests_it_holds(capsys, tmp_path):
    argv = ["simulate", "--model", LLAMA, "--device-file", H100, "--no-packs", "--device", "h100-sxm"]
    argv += ["--requests", "20", "--input", "100", "--output", "28"]
    assert main([*argv, "--json"]) == 0
    kv = json.loads(capsys.readouterr().out)["kv_capacity"]
    assert kv["rule"] == "vLLM gpu_memory_utilization" and kv["fraction"] == 0.9 and not kv["fraction_given"]
    assert kv["tokens"] == kv["blocks"] * 16 and kv["mean_request_tokens"] == 128
    assert kv["concurrent_requests"] == min(kv["tokens"] // 128, 1024)
    taken = kv["taken_bytes"]
    assert kv["kv_cache_bytes"] == pytest.approx(0.9 * 80 * GiB - sum(taken.values()))
    assert list(taken) == ["weights", "activations", "CUDA graphs"]
    assert main([*argv, "--html", str(tmp_path / "run.html")]) == 0
    page = (tmp_path / "run.html").read_text(encoding="utf-8")
    assert (
        f"by vLLM gpu_memory_utilization, {kv['concurrent_requests']:,} requests at once at the mean 128"
        in page
    )
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("KV cache"))
    assert "= 0.9 x 80.00 GiB - weights " in line and "(vLLM gpu_memory_utilization" in line
    assert f"{kv['tokens']:,} tokens in {kv['blocks']:,} blocks" in line
    assert f"{kv['concurrent_requests']:,} requests at once at the mean 128 tokens" in line
    assert main([*argv, "--engine", "sglang", "--json"]) == 0
    sglang = json.loads(capsys.readouterr().out)["kv_capacity"]
    assert sglang["fraction"] == round((81920 - 13440) / 81920, 3) and list(sglang["taken_bytes"]) == [
        "weights"
    ]


def test_llama_70b_fp8_on_one_h100_against_a_hand_computation():
    nvidia = Path(__file__).parents[2] / "packs/castpack-nvidia/castpack_nvidia/profiles/h100-sxm5-80gb.toml"
    session = castcore.Session(load_packs=[], device_files=[nvidia])  # the core's tests run with no pack
    plan = check(
        "llama-3.1-70b", weights="fp8", activations="fp8", requests=4, input_lengths=128, output_lengths=2048
    )
    steps = step_times(session.pipeline, plan.base, "h100-sxm5-80gb", plan.limits)
    found = kv_capacity(session.pipeline, steps, "vllm", plan.limits)
    # 80 layers of q, k, v, o (8,192 x 18,432) and gate, up, down (3 x 8,192 x 28,672) in fp8 with an fp32 scale
    # per output channel (83,968 a layer); the embedding and LM head (2 x 128,256 x 8,192) and 161 norms in bf16.
    weights = 80 * (8192 * 18432 + 3 * 8192 * 28672 + 83968 * 4) + 2 * 128256 * 8192 * 2 + 161 * 8192 * 2
    # At 8,192 tokens the peak is layer 0's SwiGLU: gate-up out (57,344 wide) and its product (28,672), the
    # residual (8,192) in bf16, and rotary's cos and sin (2 MiB each).
    activations = 8192 * (57344 + 28672 + 8192) * 2 + 2 * 2**21
    per_token = 80 * 8 * 128 * 2 * 2  # keys and values of 8 heads of 128 in 80 layers, bf16
    assert dict(found.taken)["weights"] == pytest.approx(weights, rel=1e-6)
    assert dict(found.taken)["activations"] == pytest.approx(activations, rel=1e-3)
    assert found.per_token == pytest.approx(per_token, rel=1e-4)
    hand = 0.9 * 80 * GiB - weights - activations * (1 + 512 / 8192)
    assert abs(found.blocks - hand // (16 * per_token)) <= 1
    # About 2.8 GiB: some 9,000 tokens, four requests of 128 + 2,048 at once.
    assert (
        2.7 * GiB < found.kv_bytes < 2.9 * GiB and found.for_requests(plan.requests).concurrent_requests == 4
    )
    # TensorRT-LLM's 0.9 of what is left free holds 3.5 times as much.
    trtllm = kv_capacity(session.pipeline, steps, "trtllm", limits("trtllm"))
    assert trtllm.kv_bytes == pytest.approx(0.9 * (80 * GiB - weights - activations), rel=1e-5)
    # SGLang's 0.836 of an 80 GiB device does not hold the weights: one line says so and what to change.
    with pytest.raises(
        ModelError, match=r"0\.836 x 80\.00 GiB - weights 67\.69 GiB .* larger kv_memory_fraction"
    ):
        kv_capacity(session.pipeline, steps, "sglang", limits("sglang"))


@pytest.mark.parametrize(
    "profile, device, given, expected",
    [
        (H100, "h100-sxm", [], (1024, 8192, 16)),  # 80 GB, not an A100: the preset as it stands
        (str(DATA / "a100-sxm-80gb.toml"), "a100-sxm-80gb", [], (256, 2048, 16)),  # vLLM names the A100
        (ASCEND_910B2, "ascend-910b2", [], (256, 2048, 128)),  # 64 GB, and vllm-ascend's block size
        (
            ASCEND_910B2,
            "ascend-910b2",
            ["--max-batched-tokens", "4096", "--block-size", "64"],
            (256, 4096, 64),
        ),
    ],
)
def test_vllms_limits_are_what_it_derives_from_the_device_unless_given(
    capsys, profile, device, given, expected
):
    argv = ["simulate", "--model", LLAMA, "--device-file", profile, "--no-packs", "--device", device]
    assert main([*argv, "--requests", "4", "--input", "64", "--output", "4", *given, "--json"]) == 0
    limits_used = json.loads(capsys.readouterr().out)["engine_limits"]
    assert (
        limits_used["max_running_requests"],
        limits_used["max_batched_tokens"],
        limits_used["block_size"],
    ) == expected
