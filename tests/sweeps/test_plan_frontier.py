"""castcore plan --frontier: each best layout's output tokens/s per device against output tokens/s per user, one
replica simulated as a closed loop of rising concurrency; real plans of a tiny model on the H100 test profile."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

import castcore
from castcore.cli.main import main
from castcore.sweeps import plan_frontier

DATA = Path(__file__).parents[1] / "data"
LLAMA, H100 = str(DATA / "tiny-llama.json"), str(DATA / "h100-sxm.toml")
PLAN = [
    *("plan", "--model", LLAMA, "--tp", "1", "2", "--pp", "1", "--weights", "bf16"),
    *("--input", "192", "--output", "32", "--device-file", H100, "--no-packs", "--workers", "1"),
]


def test_the_frontier_trades_tokens_per_user_for_throughput_per_device(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    argv = [*PLAN, "--concurrency", "4", "--requests", "40", "--frontier", "--price-per-device-hour", "2"]
    assert main([*argv, "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert len(found["frontier"]) == len(found["best"]) == 2
    for curve in found["frontier"]:
        assert [p["concurrency"] for p in curve] == [2**n for n in range(len(curve))]
        assert 2 <= len(curve) <= plan_frontier.MOST_POINTS
        pairs = list(zip(curve, curve[1:]))
        # more requests in flight: more tokens per device each second, fewer per user, slower tokens, cheaper ones
        assert all(
            b["output_tokens_per_s_per_device"] > a["output_tokens_per_s_per_device"] for a, b in pairs
        )
        assert all(b["output_tokens_per_s_per_user"] < a["output_tokens_per_s_per_user"] for a, b in pairs)
        assert all(b["p99_tpot_ms"] >= a["p99_tpot_ms"] for a, b in pairs)
        assert all(b["usd_per_million_output_tokens"] < a["usd_per_million_output_tokens"] for a, b in pairs)
    # a point is castcore simulate of that layout under that closed loop
    best, point = found["best"][0], found["frontier"][0][1]
    simulated = castcore.Session(load_packs=[], device_files=[H100]).simulate(
        LLAMA, input_lengths="192", output_lengths="32", tp=best["tp"], concurrency=2, requests=32
    )
    assert point["output_tokens_per_s_per_user"] == pytest.approx(
        simulated.summary["output_tokens_per_s_per_user"]
    )
    assert point["output_tokens_per_s_per_device"] == pytest.approx(
        simulated.summary["output_throughput"] / best["devices"]
    )
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "throughput per device against tokens/s per user" in text
    assert "in flight  tok/s/user  tok/s/device    TPOT p99  $/M out tok" in text


def test_a_static_plan_refuses_the_frontier(capsys):
    assert main([*PLAN, "--frontier"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.strip().splitlines()[-1] == (
        "castcore: error: --frontier simulates the best layouts of a plan under traffic: give --rate QPS, "
        "--concurrency C or --max-rate"
    )


def test_a_curve_ends_where_throughput_stops_rising_and_skips_disaggregated_pools():
    # Scripted rounds: throughput per device doubles up to 4 in flight, then rises 2%: the curve ends there.
    per_device = {1: 100.0, 2: 200.0, 4: 400.0, 8: 408.0, 16: 900.0}
    asked = []

    def round_of(values):
        asked.append([(v["concurrency"], v["requests"], v["dp"]) for v in values])
        return [
            {
                "output_tokens_per_s_per_device": per_device[v["concurrency"]],
                "output_tokens_per_s_per_user": per_device[v["concurrency"]] / v["concurrency"],
                "p99_tpot_ms": 1.0,
            }
            for v in values
        ]

    layout = {k: None for k in plan_frontier.LAYOUT_KEYS}
    request = SimpleNamespace(shared={}, engine="vllm", requests=500, traffic=True)
    pooled = {**layout, "prefill_instances": 1, "decode_instances": 1}
    curves = plan_frontier.frontier(request, [layout, pooled], round_of)
    assert [p["concurrency"] for p in curves[0]] == [1, 2, 4, 8] and curves[1] == []
    # one point a round, one replica, enough requests for the loop to run steady
    assert asked == [[(1, 32, 1)], [(2, 32, 1)], [(4, 32, 1)], [(8, 64, 1)]]
