"""Uneven MoE routing (--expert-skew, castcore.recording.routing): the experts' loads as a power law, fewer experts'
weights read, and the busiest expert-parallel device receiving more rows."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch

import castcore
from castcore.cli.main import main
from castcore.recording import routing

# 4 experts, top-2, hidden 64, ffn 96, 2 layers
MIXTRAL = str(Path(__file__).parents[1] / "data" / "tiny-mixtral.json")


def test_loads_are_the_power_laws_quantiles_scaled_to_the_routed_rows():
    # 10 tokens x top-2 = 20 rows over 4 experts: draws on [1, 0.8 x 10 = 8]; at exponent 1 the law is
    # log-uniform, so the quantiles 1/8, 3/8, 5/8, 7/8 sit at 8^q.
    draws = [8**q for q in (7 / 8, 5 / 8, 3 / 8, 1 / 8)]
    assert routing.expert_loads(4, 10, 2, 1.0) == pytest.approx([20 * d / sum(draws) for d in draws])
    # Exponent 2 on [1, 8]: x = 1 / (1 - q (1 - 1/8)).
    draws = [1 / (1 - q * 7 / 8) for q in (7 / 8, 5 / 8, 3 / 8, 1 / 8)]
    assert routing.expert_loads(4, 10, 2, 2.0) == pytest.approx([20 * d / sum(draws) for d in draws])
    assert routing.expert_loads(4, 10, 2, 0.0) == [5.0] * 4


def test_fewer_rows_than_experts_draw_from_the_narrow_range_and_few_experts_are_touched():
    loads = routing.expert_loads(64, 4, 2, 1.2)  # 8 rows over 64 experts: draws on [0.01, 2]
    assert sum(loads) == pytest.approx(8) and loads == sorted(loads, reverse=True)
    assert routing.touched(64, 4, 2, 1.2) == sum(load >= 0.5 for load in loads) < 8
    # Many rows: every expert's share rounds to a row.
    assert routing.touched(8, 4096, 2, 1.2) == 8


def test_the_busiest_rank_holds_the_hottest_expert_and_typical_others():
    loads = routing.expert_loads(8, 100, 2, 1.2)
    total = 200
    expected = (loads[0] + 3 * (total - loads[0]) / 7) / total  # 8 experts over 2 ranks: 4 each
    assert routing.busiest_share(8, 2, 100, 2, 1.2) == pytest.approx(expected)
    assert 0.5 < expected < 1
    assert routing.busiest_share(8, 2, 100, 2, 0.0) == pytest.approx(0.5)
    assert routing.busiest_share(8, 1, 100, 2, 1.2) == 1.0


def test_a_skew_is_recorded_only_with_a_top_k_and_bad_skews_are_refused():
    with routing.expert_routing(skew=1.2):
        assert routing.recorded() == {}
        with routing.expert_routing(top_k=2):
            assert routing.recorded() == {"expert_skew": 1.2, "top_k": 2}
    assert routing.recorded() == {}
    for bad in (-1, math.inf, True):
        with pytest.raises(ValueError, match="expert skew must be a finite number >= 0"):
            with routing.expert_routing(skew=bad):
                pass


def test_a_grouped_product_under_skew_reads_only_the_experts_the_loads_reach(session):
    experts, tokens, top_k, hidden, out = 64, 48, 2, 256, 512
    rows = torch.empty(tokens * top_k, hidden, dtype=torch.bfloat16)
    weights = torch.empty(experts, hidden, out, dtype=torch.bfloat16)
    offsets = torch.empty(experts, dtype=torch.int32)

    def grouped(x, w, offs):
        return torch._grouped_mm(x, w, offs=offs)

    def weight_bytes(report):
        (record,) = report.records
        return record.properties.memory_read_bytes - rows.nbytes - offsets.nbytes

    balanced = session.estimate(grouped, rows, weights, offsets)
    with routing.expert_routing(skew=1.2, top_k=top_k):
        skewed = session.estimate(grouped, rows, weights, offsets)
    touched = routing.touched(experts, tokens, top_k, 1.2)
    assert skewed.records[0].invoke.attrs["expert_skew"] == 1.2
    assert weight_bytes(skewed) == pytest.approx(weights.nbytes * touched / experts)
    assert touched < 64 * (1 - (63 / 64) ** 96)  # fewer than balanced routing reaches
    assert weight_bytes(skewed) < weight_bytes(balanced)


def test_with_ep_the_busiest_device_receives_its_skewed_share(session):
    # ep 2 over tp 2, prefill of 4 x 16 tokens: each rank routes 32 tokens x top-2 = 64 rows; the EP group
    # routes 64 tokens over 4 experts, 2 a rank.
    report = session.estimate(castcore.build_workload(MIXTRAL, seq=16, batch=4, tp=2, ep=2, expert_skew=1.2))
    dispatch = next(
        r.invoke for r in report.records if r.invoke.name == "_c10d_functional::all_to_all_single"
    )
    draws = [((51.2**-0.2 - 1) * q + 1) ** (1 / -0.2) for q in (1 / 8, 3 / 8, 5 / 8, 7 / 8)]
    hottest = max(draws) / sum(draws)
    received = round((hottest + (1 - hottest) / 3) * 128)
    assert received > 64
    assert tuple(dispatch.args[0].shape) == (64, 64) and tuple(dispatch.outputs()[0].shape) == (received, 64)
    assert any(n.startswith("--ep 2: ") and "skewed (expert_skew=1.2" in n for n in report.notes)
    balanced = session.estimate(castcore.build_workload(MIXTRAL, seq=16, batch=4, tp=2, ep=2))
    assert report.time_s > balanced.time_s


def test_the_option_from_the_command_line(h100_file, capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["castcore"])
    assert (
        main(
            [
                "estimate",
                "--model",
                MIXTRAL,
                "--device-file",
                str(h100_file),
                "--expert-skew",
                "1.2",
                "--json",
            ]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out)["workload"]["expert_skew"] == 1.2
    assert main(["estimate", "--model", MIXTRAL, "--device-file", str(h100_file), "--expert-skew", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--expert-skew 0" in err and "above zero" in err
