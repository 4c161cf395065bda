"""Disaggregated prefill and decode (castcore simulate --prefill-instances X --decode-instances Y): prompts on one
pool, their KV moved over the interconnect, tokens on the other; and the refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import castcore
from castcore.cli.main import main
from castcore.workload.disaggregated import transfer_seconds

DATA = Path(__file__).parent / "data"
LLAMA, H100 = str(DATA / "tiny-llama.json"), str(DATA / "h100-sxm.toml")
BASE = ["simulate", "--model", LLAMA, "--device-file", H100, "--no-packs", "--input", "200", "--output", "16",
        "--requests", "40", "--rate", "40"]


def test_a_prompts_kv_moves_over_the_level_spanning_both_instances():
    h100 = castcore.load_device_file(H100)
    nbytes = 200 * 256  # 200 tokens of the tiny model's keys and values on one device
    inside, level = transfer_seconds(h100, 2, True, nbytes)
    assert level == "nvlink" and inside == pytest.approx(2e-6 + nbytes / (4.5e11 * 0.82))
    across, level = transfer_seconds(h100, 16, True, nbytes)  # two 8-device instances: not one node
    assert level == "infiniband" and across == pytest.approx(5e-6 + nbytes / (5e10 * 0.9))
    assert transfer_seconds(h100, 2, False, nbytes)[1] == "infiniband"  # another device type: another node


def test_the_first_token_comes_from_prefill_and_the_rest_after_the_transfer(capsys):
    assert main([*BASE, "--prefill-instances", "2", "--decode-instances", "1", "--decode-deployment", "tp=2",
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["completed"], report["prefill_instances"], report["decode_instances"]) == (40, 2, 1)
    assert report["devices"] == 2 * 1 + 1 * 2
    assert report["deployment"]["decode"]["tp"] == 2 and report["deployment"]["prefill"]["tp"] == 1
    assert report["mean_kv_transfer_ms"] > 0
    # Every request's second token waits for its KV to reach the decode pool.
    session = castcore.Session(load_packs=[], device_files=[H100])
    result = session.simulate(LLAMA, device="h100-sxm", input_lengths="200", output_lengths="16", requests=40, rate=40,
                              prefill_instances=2, decode_instances=1)
    gap = report["mean_kv_transfer_ms"] / 1e3
    assert all(f.token_times[1] - f.token_times[0] >= gap * 0.5 for f in result.finished)
    assert all(len(f.token_times) == 16 for f in result.finished)


def test_more_prefill_instances_lower_time_to_first_token_under_load(capsys):
    figures = []
    for x in ("1", "4"):
        assert main([*BASE, "--rate", "400", "--prefill-instances", x, "--decode-instances", "1", "--json"]) == 0
        figures.append(json.loads(capsys.readouterr().out))
    assert figures[1]["mean_ttft_ms"] < figures[0]["mean_ttft_ms"]


@pytest.mark.parametrize("argv, said", [
    (["--prefill-instances", "1"], "needs both --prefill-instances and --decode-instances"),
    (["--prefill-deployment", "tp=2"], "--prefill-deployment needs --prefill-instances"),
    (["--prefill-instances", "1", "--decode-instances", "1", "--decode-deployment", "speed=fast"],
     "'speed=fast' is not OPTION=VALUE of a deployment option"),
    (["--prefill-instances", "1", "--decode-instances", "1", "--engine", "trtllm", "--kv-memory-fraction", "5e-7"],
     "cannot hold request"),
])
def test_bad_pools_are_one_line_and_exit_2(capsys, argv, said):
    assert main([*BASE, *argv]) == 2
    captured = capsys.readouterr()
    errors = [line for line in captured.err.splitlines() if line.startswith("castcore: error:")]
    assert captured.out == "" and len(errors) == 1 and said in errors[0]  # after any progress line
