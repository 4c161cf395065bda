"""Disaggregated prefill and decode (castcore simulate --prefill-instances X --decode-instances Y): prompts on one
pool, their KV moved over the interconnect, tokens on the other; and the refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import castcore
from castcore.cli.main import main
from castcore.serving.disaggregated import transfer_seconds

DATA = Path(__file__).parents[1] / "data"
LLAMA, H100 = str(DATA / "tiny-llama.json"), str(DATA / "h100-sxm.toml")
BASE = [
    "simulate",
    "--model",
    LLAMA,
    "--device-file",
    H100,
    "--no-packs",
    "--input",
    "200",
    "--output",
    "16",
    "--requests",
    "40",
    "--rate",
    "40",
]


def test_a_prompts_kv_moves_over_the_level_spanning_both_instances():
    h100 = castcore.load_device_file(H100)
    nbytes = 200 * 256  # 200 tokens of the tiny model's keys and values on one device
    inside, level = transfer_seconds(h100, 2, True, nbytes)
    # A point-to-point send as a pipeline stage's: the level's latency, the bytes at its bandwidth, the call's cost.
    assert level == "nvlink" and inside == pytest.approx(
        2e-6 + nbytes / (4.5e11 * 0.82) + h100.comm_op_cost_s
    )
    across, level = transfer_seconds(h100, 16, True, nbytes)  # two 8-device instances: not one node
    assert level == "infiniband" and across == pytest.approx(
        5e-6 + nbytes / (5e10 * 0.9) + h100.comm_op_cost_s
    )
    assert transfer_seconds(h100, 2, False, nbytes)[1] == "infiniband"  # another device type: another node


def test_the_first_token_comes_from_prefill_and_the_rest_after_the_transfer(capsys):
    assert (
        main(
            [
                *BASE,
                "--prefill-instances",
                "2",
                "--decode-instances",
                "1",
                "--decode-deployment",
                "tp=2",
                "--json",
            ]
        )
        == 0
    )
    report = json.loads(capsys.readouterr().out)
    assert (report["completed"], report["prefill_instances"], report["decode_instances"]) == (40, 2, 1)
    assert report["devices"] == 2 * 1 + 1 * 2
    assert report["deployment"]["decode"]["tp"] == 2 and report["deployment"]["prefill"]["tp"] == 1
    assert report["mean_kv_transfer_ms"] > 0
    # Every request's second token waits for its KV to reach the decode pool.
    session = castcore.Session(load_packs=[], device_files=[H100])
    result = session.simulate(
        LLAMA,
        device="h100-sxm",
        input_lengths="200",
        output_lengths="16",
        requests=40,
        rate=40,
        prefill_instances=2,
        decode_instances=1,
    )
    gap = report["mean_kv_transfer_ms"] / 1e3
    assert all(f.token_times[1] - f.token_times[0] >= gap * 0.5 for f in result.finished)
    assert all(len(f.token_times) == 16 for f in result.finished)


def test_more_prefill_instances_lower_time_to_first_token_under_load(capsys):
    figures = []
    for x in ("1", "4"):
        assert (
            main([*BASE, "--rate", "400", "--prefill-instances", x, "--decode-instances", "1", "--json"]) == 0
        )
        figures.append(json.loads(capsys.readouterr().out))
    assert figures[1]["mean_ttft_ms"] < figures[0]["mean_ttft_ms"]


@pytest.mark.parametrize(
    "argv, said",
    [
        (["--prefill-instances", "1"], "needs both --prefill-instances and --decode-instances"),
        (["--prefill-deployment", "tp=2"], "--prefill-deployment needs --prefill-instances"),
        (
            ["--prefill-instances", "1", "--decode-instances", "1", "--decode-deployment", "speed=fast"],
            "'speed=fast' is not OPTION=VALUE of a deployment option",
        ),
        (
            [
                "--prefill-instances",
                "1",
                "--decode-instances",
                "1",
                "--engine",
                "trtllm",
                "--kv-memory-fraction",
                "5e-7",
            ],
            "cannot hold request",
        ),
    ],
)
def test_bad_pools_are_one_line_and_exit_2(capsys, argv, said):
    assert main([*BASE, *argv]) == 2
    captured = capsys.readouterr()
    errors = [line for line in captured.err.splitlines() if line.startswith("castcore: error:")]
    assert captured.out == "" and len(errors) == 1 and said in errors[0]  # after any progress line


def test_speculative_decoding_runs_on_the_decode_pool_and_its_draft_prefills_with_the_prompt(
    tmp_path, capsys
):
    config = json.loads((DATA / "tiny-llama.json").read_text())
    config["num_hidden_layers"] = 1  # a draft of the same family, half the depth
    small = tmp_path / "draft.json"
    small.write_text(json.dumps(config))
    pools = ["--prefill-instances", "1", "--decode-instances", "1"]
    assert main([*BASE, *pools, "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert (
        main(
            [
                *BASE,
                *pools,
                "--spec-tokens",
                "3",
                "--acceptance",
                "0.9",
                "--draft-model",
                str(small),
                "--json",
            ]
        )
        == 0
    )
    spec = json.loads(capsys.readouterr().out)
    assert spec["spec_tokens_per_step"] == pytest.approx(1 + 0.9 + 0.81 + 0.729) and spec["completed"] == 40
    # The decode pool keeps ~3.4 tokens a pass: far fewer decode iterations for the same 15 tokens a request.
    assert spec["iterations"] < plain["iterations"] * 0.75
    # The draft's cache (half the model's layers) moves with the model's: the transfer carries 1.5 times the bytes.
    assert spec["mean_kv_transfer_ms"] > plain["mean_kv_transfer_ms"]
    assert spec["kv_bytes_per_token"] == pytest.approx(plain["kv_bytes_per_token"] * 1.5, rel=0.01)


def test_a_sweep_prices_disaggregated_points_with_each_pools_power(tmp_path):
    other = tmp_path / "other.toml"  # the same device under another name, drawing twice the power
    other.write_text(
        Path(H100)
        .read_text()
        .replace('name = "h100-sxm"', 'name = "other"')
        .replace("tdp_w = 700.0", "tdp_w = 1400.0")
        .replace("idle_w = 140.0", "idle_w = 280.0")
    )
    session = castcore.Session(load_packs=[], device_files=[H100, other])
    options = dict(
        device="h100-sxm",
        input_lengths="200",
        output_lengths="16",
        requests=40,
        rate=40,
        prefill_instances=2,
        decode_instances=1,
    )
    same = session.simulate(LLAMA, **options)
    mixed = session.simulate(LLAMA, **options, decode_deployment="device=other")
    assert [(u.device, u.devices) for u in mixed.pool_use] == [("h100-sxm", 2), ("other", 1)]
    from castcore.sweeps.rows import simulate_figures

    rows = [simulate_figures(r, None, session.pipeline.host) for r in (same, mixed)]
    assert rows[0]["devices"] == rows[1]["devices"] == 3
    # Each pool at its own device's power: 140 W idle + 560 W busy on the prefill pool, 280 + 1120 on the decode.
    held, (prefill, decode) = mixed.summary["duration"], mixed.pool_use
    assert rows[1]["energy_j"] == pytest.approx(
        140 * 2 * held + 560 * prefill.busy_device_s + 280 * 1 * held + 1120 * decode.busy_device_s
    )
    assert rows[1]["energy_j"] > rows[0]["energy_j"] * 1.2


def test_the_prefill_pool_caches_shared_prefixes(capsys):
    pools = ["--prefill-instances", "1", "--decode-instances", "1", "--json"]
    assert main([*BASE, *pools]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main([*BASE, *pools, "--prefix-len", "160"]) == 0
    cached = json.loads(capsys.readouterr().out)
    # One prefill instance: the first request computes the prefix's 10 whole 16-token blocks, the other 39 hit them.
    assert cached["prefix_cache_hits"] == 39 and cached["cached_prompt_tokens"] == 39 * 160
    assert cached["mean_ttft_ms"] < plain["mean_ttft_ms"]
