"""plan's recommendation is a simulated fact: its best are simulated again with many requests and judged on their
steady state with confidence intervals; a replicated layout that misses gets one more replica. Real plans of a tiny
model on the H100 test profile, and the confirming rounds on made-up simulations."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import castcore
from castcore.options.option import Objective
from castcore.simulation.metrics import format_ms
from castcore.sweeps import plan_validation
from castcore.sweeps.plan import PlanRequest

ROOT = Path(__file__).parents[2]
DATA = ROOT / "tests" / "data"
LLAMA = str(DATA / "tiny-llama.json")
# 4500 requests/s of 200 + 40 tokens: the short search finds 2 replicas meet p99 TTFT 12.3 ms
OBJECTIVE_MS = 12.3
TRAFFIC = (
    "--input",
    "200",
    "--output",
    "40",
    "--rate",
    "4500",
    "--requests",
    "200",
    "--ttft",
    f"p99:{OBJECTIVE_MS}ms",
)


def _plan(tmp_path, *argv: str) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, "-m", "castcore", "plan", "--model", LLAMA, "--tp", "1", "--pp", "1"]
        + ["--weights", "bf16", "--max-devices", "4", "--workers", "1", *TRAFFIC, *argv]
        + ["--device-file", str(DATA / "h100-sxm.toml"), "--no-packs"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")},
    )
    assert done.returncode == 0, done.stderr
    return done


def _steady_p99_ttft(dp: int) -> list[float]:
    session = castcore.Session(load_packs=[], device_files=[DATA / "h100-sxm.toml"])
    report = session.simulate(
        LLAMA,
        device="h100-sxm",
        input_lengths="200",
        output_lengths="40",
        rate=4500.0,
        requests=2000,
        dp=dp,
    )
    return report.summary["steady_state"]["ttft"]["p99"]


def test_the_searchs_answer_is_confirmed_with_more_requests_or_given_another_replica(tmp_path):
    searched = json.loads(_plan(tmp_path, "--validate", "0", "--json").stdout)
    assert [(r["dp"], r["completed"]) for r in searched["best"]] == [(2, 200)]
    found = json.loads(_plan(tmp_path, "--validate", "1", "--validate-requests", "2000", "--json").stdout)
    best = found["best"][0]
    # 2 and 3 replicas miss once 2000 requests run; 4 meet, by the upper end of the interval
    assert (best["dp"], best["completed"], best["saturated"]) == (4, 2000, False)
    margin = best["margins"]["ttft"]
    assert margin["statistic"] == "p99" and margin["objective_ms"] == pytest.approx(OBJECTIVE_MS)
    assert margin["low_ms"] <= margin["value_ms"] <= margin["high_ms"] <= OBJECTIVE_MS
    assert margin["margin"] == pytest.approx((OBJECTIVE_MS - margin["high_ms"]) / OBJECTIVE_MS)
    assert [best["steady_p99_ttft_ms"], best["steady_p99_ttft_ms_low"], best["steady_p99_ttft_ms_high"]] == (
        _steady_p99_ttft(4)
    )
    assert _steady_p99_ttft(2)[2] > OBJECTIVE_MS and _steady_p99_ttft(3)[2] > OBJECTIVE_MS  # as simulate says
    assert found["missed"] == []  # the layout met with its fourth replica
    text = _plan(tmp_path, "--validate", "1", "--validate-requests", "2000").stdout
    assert "confirmed with 2,000 requests: steady state" in text
    assert "simulations of 200 requests and 3 simulations of 2,000 requests" in text  # 2, 3 then 4 replicas
    assert (
        f"p99 TTFT {format_ms(margin['value_ms'])} (95% CI" in text
        and f"under {format_ms(OBJECTIVE_MS)}" in text
    )


def _row(name: str, **more) -> dict:
    return {"name": name, "error": None, "never_fit": 0, "devices": 1, "dp": 1, "p99_ttft_ms": 1.0, **more}


def test_confirming_rounds_take_the_next_candidates_and_retry_only_replicated_layouts():
    request = PlanRequest(model=LLAMA, ttft=Objective("p99", 0.010), rate=5.0, max_devices=2, validate=2)
    # the validation runs: a disaggregated layout saturates, one replica of "b" misses, two meet, "c" meets
    outcome = {
        ("pooled", 1): dict(saturated=True, steady_requests=800, prefill_instances=1, devices=2),
        ("b", 1): dict(steady_p99_ttft_ms=9.0, steady_p99_ttft_ms_low=8.0, steady_p99_ttft_ms_high=11.0),
        ("b", 2): dict(
            steady_p99_ttft_ms=5.0, steady_p99_ttft_ms_low=4.0, steady_p99_ttft_ms_high=6.0, devices=2
        ),
        ("c", 1): dict(steady_p99_ttft_ms=7.0, steady_p99_ttft_ms_low=6.0, steady_p99_ttft_ms_high=8.0),
    }
    rounds = []

    def round_of(values):
        rounds.append([(v["name"], v["dp"], v["requests"]) for v in values])
        return [_row(v["name"], dp=v["dp"], **outcome[(v["name"], v["dp"])]) for v in values]

    def again(row, **changes):
        return {"name": row["name"], "dp": row["dp"], **changes}

    ranked = [_row("pooled", prefill_instances=1), _row("b"), _row("c"), _row("d")]
    confirmed, failed, untried = plan_validation.confirm(
        request, ranked, again, round_of, lambda rows: rows.sort(key=str)
    )
    assert rounds == [[("pooled", 1, 4000), ("b", 1, 4000)], [("b", 2, 4000), ("c", 1, 4000)]]
    assert [(r["name"], r["dp"]) for r in confirmed] == [("b", 2), ("c", 1)]
    assert [r["name"] for r in untried] == ["d"]  # never needed: its search row stays, unconfirmed
    assert confirmed[1]["margins"]["ttft"]["margin"] == (10.0 - 8.0) / 10.0
    assert [(r["name"], r["missed"]) for r in failed] == [
        ("pooled", "with 4,000 requests: saturated: 800 steady requests arrived faster than they were served")
    ]


def test_slots_a_round_would_leave_idle_confirm_the_next_candidates_in_rank():
    request = PlanRequest(model=LLAMA, ttft=Objective("p99", 0.010), rate=5.0, max_devices=1, validate=3)
    meets = dict(steady_p99_ttft_ms=5.0, steady_p99_ttft_ms_low=4.0, steady_p99_ttft_ms_high=6.0)
    misses = dict(steady_p99_ttft_ms=12.0, steady_p99_ttft_ms_low=11.0, steady_p99_ttft_ms_high=13.0)
    outcome = {"a": meets, "b": misses, "c": meets, "d": meets, "e": meets, "f": meets}
    rounds = []

    def round_of(values):
        rounds.append([v["name"] for v in values])
        return [_row(v["name"], **outcome[v["name"]]) for v in values]

    def again(row, **changes):
        return {"name": row["name"], "dp": row["dp"], **changes}

    ranked = [_row(name) for name in "abcdef"]
    confirmed, _, untried = plan_validation.confirm(
        request, ranked, again, round_of, lambda rows: None, slots=2
    )
    # three candidates on two workers: the fourth runs beside the third, and takes the place "b" missed
    assert rounds == [["a", "b", "c", "d"]]
    assert [r["name"] for r in confirmed] == ["a", "c", "d"] and [r["name"] for r in untried] == ["e", "f"]
    rounds.clear()
    outcome["b"] = meets  # none misses: the spare slot's candidate is confirmed too
    confirmed, _, _ = plan_validation.confirm(request, ranked, again, round_of, lambda rows: None, slots=2)
    assert rounds == [["a", "b", "c", "d"]] and len(confirmed) == 4
    rounds.clear()
    outcome["b"] = misses
    plan_validation.confirm(request, ranked, again, round_of, lambda rows: None, slots=1)
    assert rounds == [["a", "b", "c"], ["d"]]  # one worker: no slot is idle, the miss is replaced next round


def test_the_best_of_each_kind_is_confirmed_so_the_verdict_compares_confirmed_layouts():
    request = PlanRequest(model=LLAMA, ttft=Objective("p99", 0.010), rate=5.0, disaggregated=True, validate=1)
    fine = dict(steady_p99_ttft_ms=5.0, steady_p99_ttft_ms_low=4.0, steady_p99_ttft_ms_high=6.0)
    outcome = {"a": fine, "p": dict(fine, steady_p99_ttft_ms_high=12.0), "q": fine}
    rounds = []

    def round_of(values):
        rounds.append([v["name"] for v in values])
        return [
            _row(v["name"], prefill_instances=v["prefill_instances"], **outcome[v["name"]]) for v in values
        ]

    def again(row, **changes):
        return {"name": row["name"], "dp": 1, "prefill_instances": row.get("prefill_instances"), **changes}

    ranked = [_row("a"), _row("b"), _row("p", prefill_instances=1), _row("q", prefill_instances=2)]
    confirmed, failed, untried = plan_validation.confirm(request, ranked, again, round_of, lambda rows: None)
    # the best aggregated and the best disaggregated first; that one misses, so the next of its kind is tried
    assert rounds == [["a", "p"], ["q"]]
    assert [r["name"] for r in confirmed] == ["a", "q"] and [r["name"] for r in failed] == ["p"]
    assert [r["name"] for r in untried] == ["b"]


@pytest.mark.parametrize(
    "argv, said",
    [
        (["--rate", "5", "--validate-requests", "2000000"], "--validate-requests 2000000: is over 1,000,000"),
        (["--rate", "5", "--validate", "-1"], "--validate -1: must be a whole number of at least 0"),
        (
            ["--validate", "2"],
            "--validate 2 confirms a plan under traffic, and a static plan prices one batch",
        ),
    ],
)
def test_bad_validation_options_are_one_line_and_exit_2(argv, said):
    done = subprocess.run(
        [sys.executable, "-m", "castcore", "plan", "--model", LLAMA, *argv, "--no-packs"]
        + ["--device-file", str(DATA / "h100-sxm.toml")],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert done.returncode == 2 and done.stdout == ""
    errors = [line for line in done.stderr.splitlines() if line.startswith("castcore: error:")]
    assert len(errors) == 1 and said in errors[0] and "Traceback" not in done.stderr


def test_the_plan_page_marks_the_simulations_that_meet_as_the_confirming_rounds_judge_them():
    from castcore.plugins.selection import PluginOptions
    from castcore.report.html.plan import plan_data

    def candidates(ttft: str) -> list[tuple]:
        result = castcore.plan(
            LLAMA,
            input_tokens=32,
            output_tokens=8,
            rate=40.0,
            requests=40,
            ttft=ttft,
            tp=[1],
            pp=[1],
            weights=["bf16"],
            validate=1,
            validate_requests=300,
            workers=1,
            plugins=PluginOptions(no_packs=True, device_file=[str(DATA / "h100-sxm.toml")]),
        )
        return [(c["requests"], c["meets"]) for c in plan_data(result)["results"]["candidates"]]

    assert candidates("p90:50ms") == [(40, True), (300, True)]  # the search's run, then the confirming one
    missed = candidates("p90:1us")  # missed by every replica count searched: nothing to confirm
    assert len(missed) > 1 and set(missed) == {(40, False)}


def test_under_max_rate_a_rate_that_misses_is_confirmed_lower():
    request = PlanRequest(model=LLAMA, ttft=Objective("p99", 0.010), max_rate=True, validate=1)
    rounds = []

    def round_of(values):
        rounds.append([v["rate"] for v in values])
        high = 12.0 if values[0]["rate"] > 9.5 else 8.0  # the searched edge misses; 90% of it holds
        return [_row("a", steady_p99_ttft_ms=5.0, steady_p99_ttft_ms_low=4.0, steady_p99_ttft_ms_high=high)]

    def again(row, **changes):
        return {"name": row["name"], "dp": 1, "rate": row["max_rate"], **changes}

    confirmed, failed, _ = plan_validation.confirm(
        request, [_row("a", max_rate=10.0)], again, round_of, lambda rows: None
    )
    assert rounds == [[10.0], [9.0]]
    assert [r["max_rate"] for r in confirmed] == [9.0] and failed == []
