"""One pipeline: the command line and the embedded API give the same report for the same workload."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import castcore
from castcore.cli.main import main
from castcore.workload.spec import preset_names

SEQ, KV = 64, 96


def cli_json(capsys, *argv: str) -> dict:
    assert main(["estimate", "--json", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def same_numbers(cli: dict, api: castcore.Report) -> None:
    data = json.loads(api.to_json())  # what the CLI prints, from the API's report
    for key in (
        "description",
        "device",
        "workload",
        "notes",
        "totals",
        "ops",
        "modules",
        "memory",
        "coverage",
    ):
        assert cli[key] == data[key], key


# each preset in both phases and on one and two devices, in two runs rather than all four (the suite's time)
@pytest.mark.parametrize("phase, tp", [("prefill", 1), ("decode", 2)])
@pytest.mark.parametrize("preset", preset_names())
def test_cli_and_api_agree_on_every_preset(preset, phase, tp, session, h100_file, capsys):
    options = dict(batch=2, seq=SEQ, phase=phase, kv_len=KV if phase == "decode" else None, tp=tp)
    argv = [
        "--model",
        preset,
        "--batch",
        "2",
        "--seq",
        str(SEQ),
        "--phase",
        phase,
        "--tp",
        str(tp),
        "--no-packs",
        "--device-file",
        str(h100_file),
    ] + (["--kv-len", str(KV)] if phase == "decode" else [])
    try:
        api = session.estimate(castcore.build_workload(preset, **options))
    except castcore.CastcoreError as exc:  # a combination not supported yet fails the same way on both faces
        assert main(["estimate", *argv]) == 2
        assert capsys.readouterr().err.strip().endswith(f"castcore: error: {exc}")
        return
    same_numbers(cli_json(capsys, *argv), api)
    shipped = castcore.build_workload(
        preset
    ).weights  # a preset whose checkpoint ships quantized is priced so
    assert api.workload == {
        "model": preset,
        "dtype": "bf16",
        "train": False,
        "all_logits": False,
        "fuse": True,
        "weights": shipped,
        "activations": None,
        "kv_cache": None,
        "kv_reads": "group",
        "sp": False,
        "ep": 1,
        "attention_dp": 1,
        "ep_kernels": "normal",
        "expert_skew": None,
        "pp": 1,
        "micro_batches": 1,
        "lora_rank": None,
        "adapters": None,
        "adapter_skew": None,
        "dp": 1,
        "reuse": True,
        **options,
    }


def test_the_installed_command_prints_what_the_api_returns(session, h100_file, tiny_llama):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "castcore",
            "estimate",
            "--json",
            "--model",
            str(tiny_llama),
            "--seq",
            "16",
            "--train",
            "--no-packs",
            "--device-file",
            str(h100_file),
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    same_numbers(
        json.loads(done.stdout),
        session.estimate(castcore.build_workload(str(tiny_llama), seq=16, train=True)),
    )


def test_a_module_with_inputs_is_a_workload_too(session):
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8))
    x = torch.empty(32, 64, device="meta")
    direct = session.estimate(model, x)
    via_workload = session.estimate(castcore.build_workload(model, x))
    assert direct.totals() == via_workload.totals()
    # matmuls, biases, relu
    assert direct.flops == 2 * 32 * (64 * 128 + 128 * 8) + 32 * 128 + 32 * 128 + 32 * 8
    assert direct.workload["model"] == "Sequential"


@pytest.mark.parametrize(
    "options, culprit",
    [
        (dict(batch=0), "batch=0"),
        (dict(tp=0), "tp=0"),
        (dict(seq=-1), "seq=-1"),
        (dict(kv_len=0), "kv_len=0"),
        (dict(phase="serve"), "phase"),
        (dict(dtype="int3"), "dtype"),
        (dict(phase="decode", train=True), "train=True"),
    ],
)
def test_bad_options_fail_before_anything_is_built(options, culprit):
    with pytest.raises(castcore.ModelError, match=culprit):
        castcore.build_workload("llama-3-8b", **options)


def test_a_named_model_takes_no_inputs():
    with pytest.raises(castcore.ModelError, match="pass no inputs"):
        castcore.build_workload("llama-3-8b", 1, 2)
