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
    # Many rows: every expert's share rounds to a row.
    assert routing.touched(8, 4096, 2, 1.2) == 8
    # 16 tokens x top-8 over 128 experts: the hot experts take several rows, and 49 experts are touched, not the
    # 81 that 128 even picks reach (the collectors' random draws give 49.3 on average over 200).
    assert routing.touched(128, 16, 8, 1.2) == 49


def test_loads_round_to_whole_rows_as_the_collectors_round_them():
    # log-uniform (exponent 1) on [1, 8], 20 rows: 9.27, 5.51, 3.28, 1.95 round to 9, 6, 3, 2, summing to 20
    assert routing.whole_loads(4, 10, 2, 1.0) == (9, 6, 3, 2)
    # one token's 8 rows over 128 experts: every share rounds to nothing, and the 8 lost rows go one each to the
    # most loaded experts: the token's 8 distinct experts
    ones = routing.whole_loads(128, 1, 8, 1.2)
    assert ones[:8] == (1,) * 8 and not any(ones[8:]) and routing.touched(128, 1, 8, 1.2) == 8
    # 3 rows evenly over 4 experts: 0.75 each rounds to 1, 4 in all; the extra row comes off the least loaded
    assert routing.whole_loads(4, 1.5, 2, 0.0) == (1, 1, 1, 0)


def test_the_busiest_rank_is_the_mean_over_placements_of_the_rank_with_most_rows():
    # Loads 9, 6, 3, 2 on 2 ranks of 2 experts: the three pairings, equally likely, put 15, 12 and 11 rows on
    # the busier rank, 38 / 3 on average; each such rank runs both its experts.
    rows, touched = routing.busiest_rank(4, 2, 10, 2, 1.0)
    assert rows == pytest.approx(38 / 3, rel=0.01) and touched == 2
    # One expert a rank: the busiest holds the hottest expert, always. Log-uniform on [1, 8] with 10 rows:
    # 8^0.75 and 8^0.25 share them as 7.39 and 2.61, so 7 and 3.
    assert routing.busiest_rank(2, 2, 10, 1, 1.0) == (7, 1)


def test_the_busiest_rank_runs_fewer_experts_than_its_rows_would_reach_evenly():
    # Qwen3-30B's 128 experts over 4 ranks, 16 tokens x top-8: the busiest rank's 44 rows crowd onto about 15
    # of its 32 experts (the collectors' random draws: 42.6 rows on 14.1 experts); 44 even picks reach 24.
    rows, touched = routing.busiest_rank(128, 4, 16, 8, 1.2)
    assert 40 < rows < 48 and 13 < touched < 16
    assert touched < 32 * (1 - (31 / 32) ** rows)


def test_a_skew_is_recorded_only_with_a_top_k_and_bad_skews_are_refused():
    with routing.expert_routing(skew=1.2):
        assert routing.recorded() == {}
        with routing.expert_routing(top_k=2):
            assert routing.recorded() == {"expert_skew": 1.2, "top_k": 2}
            with routing.expert_routing(touched=3.5):
                assert routing.recorded() == {"expert_skew": 1.2, "top_k": 2, "experts_touched": 3.5}
            assert "experts_touched" not in routing.recorded()
            with routing.expert_routing(fused=True):
                assert routing.recorded() == {"expert_skew": 1.2, "top_k": 2, "fused_moe": True}
                with routing.expert_routing(fused=False):
                    assert "fused_moe" not in routing.recorded()
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
    # ep 2 over 2 attention groups, prefill of 4 x 16 tokens: each group routes 32 tokens x top-2 = 64 rows; the
    # EP group routes 64 tokens over 4 experts, 2 a rank.
    report = session.estimate(
        castcore.build_workload(MIXTRAL, seq=16, batch=4, ep=2, attention_dp=2, expert_skew=1.2)
    )
    dispatch = next(
        r.invoke for r in report.records if r.invoke.name == "_c10d_functional::all_to_all_single"
    )
    # The loads: the power law's quantiles on [1, 0.8 x 64], scaled to 128 rows and rounded. The busiest rank:
    # over the three equally likely pairings of 4 experts on 2 ranks, the larger pair's rows.
    draws = [((51.2**-0.2 - 1) * q + 1) ** (1 / -0.2) for q in (7 / 8, 5 / 8, 3 / 8, 1 / 8)]
    loads = [round(128 * d / sum(draws)) for d in draws]
    assert loads == [86, 27, 11, 5]  # 129: the extra row comes off the least loaded expert
    a, b, c, d = 86, 27, 11, 4
    by_hand = (max(a + b, c + d) + max(a + c, b + d) + max(a + d, b + c)) / 3
    received = dispatch.outputs()[0].shape[0]
    assert by_hand > 64 and abs(received - by_hand) <= 1
    assert tuple(dispatch.args[0].shape) == (64, 64) and dispatch.outputs()[0].shape[1] == 64
    assert any(n.startswith("--ep 2: ") and "skewed (expert_skew=1.2" in n for n in report.notes)
    grouped = [r.invoke for r in report.records if r.invoke.name == "aten::_grouped_mm"]
    assert grouped and all(i.attrs["experts_touched"] == 2 for i in grouped)
    balanced = session.estimate(
        castcore.build_workload(MIXTRAL, seq=16, batch=4, ep=2, attention_dp=2, expert_skew=0)
    )
    assert report.time_s > balanced.time_s


def test_a_mixture_of_experts_routes_as_its_family_is_fitted_unless_told(session):
    # tiny-mixtral is not DeepSeek-V3's architecture: 1.2, said in a note; --expert-skew 0 is balanced
    assert routing.model_skew(json.loads(Path(MIXTRAL).read_text())) == 1.2
    assert routing.model_skew({"model_type": "deepseek_v3"}) == 1.01
    # decoding 2 tokens: their 4 rows reach 2.73 of the 4 experts evenly, 2 under the skew
    step = dict(phase="decode", batch=2, kv_len=8)
    default = session.estimate(castcore.build_workload(MIXTRAL, **step))
    skewed = session.estimate(castcore.build_workload(MIXTRAL, **step, expert_skew=1.2))
    balanced = session.estimate(castcore.build_workload(MIXTRAL, **step, expert_skew=0))
    assert default.time_s == skewed.time_s < balanced.time_s
    assert any(
        "power law of exponent 1.2" in n and "expert skew of 0 prices it balanced" in n for n in default.notes
    )
    assert not any("power law" in n for n in skewed.notes + balanced.notes)
    # an eager graph's experts know no top-k: priced as they run, and no note claims a skew
    eager = session.estimate(castcore.build_workload(MIXTRAL, **step, fuse=False))
    assert not any("power law" in n for n in eager.notes)
    grouped = next(r for r in default.by_op() if r.op == "aten::_grouped_mm")
    assert grouped.experts_run == 2
    assert next(r for r in balanced.by_op() if r.op == "aten::_grouped_mm").experts_run == 2.73


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
    assert main(["estimate", "--model", MIXTRAL, "--device-file", str(h100_file), "--expert-skew", "0"]) == 0
    capsys.readouterr()
    assert main(["estimate", "--model", MIXTRAL, "--device-file", str(h100_file), "--expert-skew", "-1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--expert-skew -1" in err and "0 or more" in err


def _enumerated_busiest(experts: int, ranks: int, top_k: int) -> float:
    """One token's top-k over experts placed evenly on ranks: every choice of k distinct experts, equally likely,
    and the most any rank gets, averaged."""
    import itertools

    per_rank, total, count = experts // ranks, 0, 0
    for chosen in itertools.combinations(range(experts), top_k):
        on_rank = [0] * ranks
        for expert in chosen:
            on_rank[expert // per_rank] += 1
        total, count = total + max(on_rank), count + 1
    return total / count


@pytest.mark.parametrize("experts, ranks, top_k", [(16, 4, 4), (32, 8, 8), (24, 8, 2), (8, 2, 2)])
def test_one_tokens_busiest_device_is_near_the_enumerated_expectation(experts, ranks, top_k):
    exact = _enumerated_busiest(experts, ranks, top_k)
    found = routing.busiest_rows(experts, ranks, 1, top_k, 0.0)
    assert top_k / ranks < exact and 0.95 * exact <= found <= 1.12 * exact  # Poisson counts: a little off


def test_the_poisson_maximum_worked_by_hand():
    # two ranks, mean 1 row each: E[max] = sum over c of 1 - F(c)^2 with F the Poisson(1) CDF
    pmf = [math.exp(-1) / math.factorial(c) for c in range(30)]
    cdf = [sum(pmf[: c + 1]) for c in range(30)]
    by_hand = sum(1 - f * f for f in cdf)
    assert routing.busiest_rows(64, 2, 1, 2, 0.0) == pytest.approx(by_hand, rel=1e-9)
    assert by_hand == pytest.approx(1.5238, abs=1e-3)  # .8647 + .4586 + .1542 + .0376 + .0074 + ...


def test_the_busiest_share_grows_smoothly_with_the_batch_and_nears_the_even_share():
    # DeepSeek-V3's 256 experts, top-8, over 8 devices: continuous from one token up, no step where rows pass
    # the expert count, and within 2% of the even share at 16,384 tokens
    tokens = [t / 4 for t in range(4, 4 * 600)]
    rows = [routing.busiest_rows(256, 8, t, 8, 0.0) for t in tokens]
    steps = [b - a for a, b in zip(rows, rows[1:])]
    assert all(0 < s <= 8 * 0.25 + 1e-9 for s in steps)  # a quarter token adds at most its 2 rows
    assert rows[0] == pytest.approx(2.5785, abs=1e-3)  # about 2.6 of one token's 8 rows
    big = routing.busiest_rows(256, 8, 16384, 8, 0.0)
    assert 16384 < big < 1.02 * 16384


def test_a_device_takes_at_most_a_tokens_rows_on_its_own_experts_and_the_skew_only_adds():
    assert (
        routing.busiest_rows(16, 8, 1, 8, 0.0) <= 2
    )  # two experts a device: two of the token's rows at most
    assert routing.busiest_rows(256, 1, 3, 8, 0.0) == 24  # one rank takes every row
    skewed = routing.busiest_rows(256, 8, 512, 8, 1.01)
    assert skewed >= routing.busiest_rows(256, 8, 512, 8, 0.0)
    assert skewed == routing.busiest_rank(256, 8, 512, 8, 1.01)[0]
