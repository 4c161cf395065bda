"""The castcore command as a user runs it: help, estimates, devices, custom-op files, one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

USER_MM = """
import torch
import castcore

@castcore.register_op_estimator(torch.ops.aten.mm.default)
def mm(invoke, device):
    return 0.5
"""


def castcore_cli(*args, env_extra=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("CASTCORE_")}
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "castcore", *args], capture_output=True, text=True, env=env)


def test_estimate_help_lists_the_options():
    done = castcore_cli("estimate", "--help")
    assert done.returncode == 0
    for option in (
        "--model",
        "--batch",
        "--seq",
        "--dtype",
        "--device",
        "--device-file",
        "--custom-op-dir",
        "--json",
    ):
        assert option in done.stdout


def test_estimate_prints_a_table_and_totals(tiny_llama, h100_file):
    done = castcore_cli(
        "estimate", "--model", str(tiny_llama), "--seq", "32", "--device-file", str(h100_file), "--no-packs"
    )
    assert done.returncode == 0, done.stderr
    assert "on h100-sxm" in done.stdout
    assert "aten::mm" in done.stdout
    for total in ("total time", "total FLOPs", "bytes moved"):
        assert total in done.stdout


def test_estimate_says_when_a_model_runs_its_own_attention(h100_file):
    falcon = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "tiny-falcon.json")
    done = castcore_cli(
        "estimate", "--model", falcon, "--seq", "8", "--device-file", str(h100_file), "--no-packs"
    )
    assert done.returncode == 0, done.stderr
    assert "castcore: note: FalconForCausalLM cannot take castcore's attention path" in done.stderr


def test_custom_op_file_wins_in_the_json_report(tiny_llama, h100_file, tmp_path):
    (tmp_path / "mm.py").write_text(USER_MM)
    done = castcore_cli(
        "estimate",
        "--model",
        str(tiny_llama),
        "--seq",
        "16",
        "--device-file",
        str(h100_file),
        "--no-packs",
        "--custom-op-dir",
        str(tmp_path),
        "--json",
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    mm = next(row for row in report["ops"] if row["op"] == "aten::mm")
    assert mm["source"] == f"file:{tmp_path / 'mm.py'} (estimator)"
    assert mm["time_s"] == pytest.approx(0.5 * mm["calls"])
    assert report["totals"]["time_s"] >= mm["time_s"]


def test_devices_json_lists_the_device_file(h100_file):
    done = castcore_cli("devices", "--json", "--no-packs", "--device-file", str(h100_file))
    assert done.returncode == 0, done.stderr
    assert [d["name"] for d in json.loads(done.stdout)] == ["h100-sxm"]


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--model", "gpt-9"],
            "unknown model 'gpt-9'; use a preset (deepseek-v3, deepseek-v3.1, deepseek-v3.2, glm-4.5-air, glm-4.6",
        ),
        (["--model", "llama3-8b"], "unknown model 'llama3-8b' (did you mean 'llama-3-8b' or "),
        (["--device", "tpu-v9"], "unknown device 'tpu-v9'; installed: h100-sxm"),
        (["--device", "h100"], "unknown device 'h100' (did you mean 'h100-sxm'?); installed: h100-sxm"),
        (["--custom-op-dir", "/no/such/dir"], "custom-op directory /no/such/dir does not exist"),
    ],
)
def test_bad_input_is_one_line_naming_the_culprit(h100_file, args, message):
    done = castcore_cli("estimate", "--no-packs", "--device-file", str(h100_file), *args)
    assert done.returncode == 2
    assert message in done.stderr
    assert "Traceback" not in done.stderr and "capturing" not in done.stderr
    assert len(done.stderr.strip().splitlines()) <= 2


@pytest.mark.parametrize(
    "command",
    [
        ["serve", "--input", "16", "--output", "4"],
        ["simulate", "--requests", "2", "--input", "16", "--output", "4"],
    ],
)
def test_an_unknown_device_fails_before_any_capture(tiny_llama, h100_file, command):
    done = castcore_cli(
        *command,
        "--model",
        str(tiny_llama),
        "--no-packs",
        "--device-file",
        str(h100_file),
        "--device",
        "h100",
    )
    assert done.returncode == 2 and "capturing" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "castcore: error: unknown device 'h100' (did you mean 'h100-sxm'?); "
        "installed: h100-sxm (castcore devices lists them)"
    )


@pytest.mark.parametrize(
    "args, said",
    [
        (
            ["simulate", "--engine", "vlm"],
            "argument --engine: invalid choice: 'vlm' (did you mean 'vllm'?) (choose from "
            "vllm, sglang, trtllm)",
        ),
        (["estimate", "--dtype", "bf61"], "argument --dtype: invalid choice: 'bf61' (did you mean 'bf16'?)"),
        (["estmate"], "invalid choice: 'estmate' (did you mean 'estimate'"),
    ],
)
def test_a_mistyped_choice_names_the_nearest(args, said):
    done = castcore_cli(*args)
    assert done.returncode == 2 and said in done.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize(
    "command",
    [
        ["serve", "--input", "16", "--output", "4", "--json"],
        ["estimate", "--seq", "8", "--json"],
        ["devices"],
    ],
)
@pytest.mark.parametrize("output", ["closed", "full"])
def test_output_that_cannot_be_written_is_an_error_not_a_lost_result(tiny_llama, h100_file, command, output):
    argv = [sys.executable, "-m", "castcore", *command, "--no-packs", "--device-file", str(h100_file)]
    if command[0] != "devices":
        argv += ["--model", str(tiny_llama)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CASTCORE_")}
    if output == "closed":  # as `castcore ... >&-` starts it
        done = subprocess.run(
            ["bash", "-c", 'exec "$@" >&-', "bash", *argv], stderr=subprocess.PIPE, text=True, env=env
        )
        said = "castcore: error: standard output is closed"
    else:
        if not os.path.exists("/dev/full"):
            pytest.skip("no /dev/full on this system")
        with open("/dev/full", "w") as full:
            done = subprocess.run(argv, stdout=full, stderr=subprocess.PIPE, text=True, env=env)
        said = "castcore: error: cannot write standard output: No space left on device"
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith(said)
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr
