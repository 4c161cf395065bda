"""The traffic side of ``castcore simulate``: length distributions, requests and traces, arrivals, and the
summary under vLLM's field names."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from castcore.errors import ModelError
from castcore.simulation.arrivals import Arrivals, poisson
from castcore.simulation.lengths import Lengths
from castcore.simulation.metrics import Finished, format_table, percentile, summarize
from castcore.simulation.requests import Request, make_requests, read_dataset, reject_overlong


def _one_line_error(call, *culprits: str) -> str:
    with pytest.raises(ModelError) as caught:
        call()
    message = str(caught.value)
    assert "\n" not in message
    for culprit in culprits:
        assert culprit in message
    return message


# Lengths


def test_fixed_lengths():
    assert Lengths.parse("512").sample(random.Random(0), 3) == [512, 512, 512]
    assert Lengths.parse(64) == Lengths.fixed(64)
    assert str(Lengths.parse("512")) == "512"


def test_uniform_lengths_stay_in_bounds_and_reach_both_ends():
    draws = Lengths.parse("uniform:256:1024").sample(random.Random(1), 4000)
    assert min(draws) >= 256 and max(draws) <= 1024
    assert statistics.fmean(draws) == pytest.approx(640, abs=20)
    assert set(Lengths.uniform(1, 3).sample(random.Random(1), 100)) == {1, 2, 3}


def test_normal_lengths_have_their_mean_and_are_clamped_to_one():
    draws = Lengths.parse("normal:500:50").sample(random.Random(2), 4000)
    assert statistics.fmean(draws) == pytest.approx(500, abs=5)
    assert statistics.pstdev(draws) == pytest.approx(50, abs=5)
    assert all(isinstance(n, int) for n in draws)
    assert min(Lengths.normal(2, 10).sample(random.Random(2), 1000)) == 1
    assert Lengths.parse("normal:7:0").sample(random.Random(2), 3) == [7, 7, 7]


def test_lognormal_lengths_are_given_by_their_median():
    draws = Lengths.parse("lognormal:100:0.5").sample(random.Random(3), 4000)
    assert statistics.median(draws) == pytest.approx(100, abs=5)
    assert statistics.fmean(draws) == pytest.approx(100 * math.exp(0.5**2 / 2), rel=0.05)
    assert min(draws) >= 1


def test_lengths_are_reproducible_with_a_seed():
    lengths = Lengths.parse("lognormal:300:1")
    assert lengths.sample(random.Random(7), 50) == lengths.sample(random.Random(7), 50)
    assert lengths.sample(random.Random(7), 50) != lengths.sample(random.Random(8), 50)


@pytest.mark.parametrize(
    "text, why",
    [
        ("normal:100:-1", "STD must not be negative"),
        ("uniform:1024:256", "LOW must not exceed HIGH"),
        ("uniform:0:10", "LOW must be a whole number of at least 1"),
        ("uniform:1.5:10", "LOW must be a whole number"),
        ("lognormal:100:0", "SIGMA must be greater than 0"),
        ("lognormal:0:1", "MEDIAN must be at least 1"),
        ("normal:0:1", "MEAN must be at least 1"),
        ("gamma:2:3", "not one of the forms"),
        ("uniform:5", "not one of the forms"),
        ("long", "not one of the forms"),
        ("normal:a:b", "must be numbers"),
        ("normal:nan:1", "finite numbers"),
        ("0", "the length must be a whole number of at least 1"),
        ("512.5", "the length must be a whole number"),
    ],
)
def test_impossible_lengths_are_refused_naming_the_text(text, why):
    message = _one_line_error(lambda: Lengths.parse(text), repr(text), why)
    assert "uniform:LOW:HIGH" in message  # the accepted forms


def test_impossible_lengths_from_python_are_refused_too():
    _one_line_error(lambda: Lengths.normal(100, -1), "'normal:100:-1'", "STD")
    _one_line_error(lambda: Lengths.fixed(0), "'0'")


# Requests


def test_make_requests_draws_reproducible_requests():
    requests = make_requests(20, Lengths.parse("uniform:10:20"), Lengths.parse("normal:50:5"), seed=4)
    assert requests == make_requests(20, Lengths.parse("uniform:10:20"), Lengths.parse("normal:50:5"), seed=4)
    assert [r.index for r in requests] == list(range(20))
    assert all(10 <= r.input_tokens <= 20 and r.arrival_s is None for r in requests)
    _one_line_error(lambda: make_requests(0, Lengths.fixed(1), Lengths.fixed(1), 0), "requests=0")


def test_read_dataset_takes_both_key_styles_and_skips_blank_lines(tmp_path):
    path = tmp_path / "trace.jsonl"
    path.write_text(
        '{"input_tokens": 512, "output_tokens": 128, "arrival_s": 0.5}\n\n'
        '{"prompt_len": 30, "output_len": 7, "timestamp": 1}\n   \n'
    )
    assert read_dataset(path) == [Request(0, 512, 128, 0.5), Request(1, 30, 7, 1.0)]
    path.write_text('{"prompt_len": 30, "output_len": 7, "conversation_id": "x"}\n')
    assert read_dataset(str(path)) == [Request(0, 30, 7, None)]


@pytest.mark.parametrize(
    "third_line, culprit",
    [
        ('{"input_tokens": 5, "output_tokens": ', "not JSON"),
        ("[5, 6]", "not a JSON object"),
        ('{"input_tokens": 5}', "output None"),
        ('{"input_tokens": 0, "output_tokens": 3}', "input 0"),
        ('{"input_tokens": 5.5, "output_tokens": 3}', "input 5.5"),
        ('{"input_tokens": true, "output_tokens": 3}', "input True"),
        ('{"input_tokens": 5, "output_tokens": 3, "arrival_s": -1}', "arrival -1"),
    ],
)
def test_a_malformed_line_is_named_by_its_number(tmp_path, third_line, culprit):
    path = tmp_path / "trace.jsonl"
    path.write_text('{"input_tokens": 5, "output_tokens": 3}\n\n' + third_line + "\n")
    message = _one_line_error(lambda: read_dataset(path), f"dataset={str(path)!r} line 3", culprit)
    assert '"input_tokens": 512' in message  # what a line needs


def test_an_empty_or_unreadable_dataset_is_refused(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("\n  \n")
    _one_line_error(lambda: read_dataset(path), str(path), "has no requests")
    _one_line_error(lambda: read_dataset(tmp_path / "missing.jsonl"), "missing.jsonl", "no such dataset")


def test_a_dataset_gives_every_request_an_arrival_time_or_none(tmp_path):
    path = tmp_path / "trace.jsonl"
    path.write_text(
        '{"input_tokens": 5, "output_tokens": 3}\n{"input_tokens": 5, "output_tokens": 3, "arrival_s": 2}\n'
    )
    _one_line_error(lambda: read_dataset(path), "line 2 has an arrival time", "line 1 has none")


def test_requests_beyond_the_context_are_rejected_one_by_one_and_the_rest_kept_as_they_arrive():
    requests = [Request(0, 100, 28, 0.5), Request(1, 4000, 200, 1.0), Request(2, 9000, 1, 1.5)]
    requests.append(Request(3, 4000, 96, 2.0))  # exactly the context: served
    kept, rejected = reject_overlong(requests, 4096, "--max-model-len")
    assert kept == [requests[0], requests[3]]  # arrival times untouched
    assert rejected == [
        {"index": 1, "why": "4000 input + 200 output = 4200 tokens, beyond --max-model-len of 4096"},
        {"index": 2, "why": "9000 input + 1 output = 9001 tokens, beyond --max-model-len of 4096"},
    ]
    assert reject_overlong(requests, 9001, "the model's position limit") == (requests, [])


# Arrivals


@pytest.mark.parametrize("burstiness, spread", [(1.0, 1.0), (4.0, 0.5), (0.25, 2.0)])
def test_gamma_arrivals_keep_the_rate_and_their_burstiness(burstiness, spread):
    times = poisson(4.0, burstiness, 5000, seed=5)
    gaps = [b - a for a, b in zip([0.0, *times], times)]
    assert all(gap >= 0 for gap in gaps)
    # vLLM scales the last arrival to n / rate
    assert statistics.fmean(gaps) == pytest.approx(1 / 4.0, rel=1e-9)
    # A gamma of shape k has coefficient of variation 1 / sqrt(k): 1 for Poisson, less for even, more for bursty.
    assert statistics.pstdev(gaps) / statistics.fmean(gaps) == pytest.approx(spread, rel=0.1)


def test_arrivals_are_reproducible_with_a_seed():
    assert poisson(2.0, 1.0, 100, seed=9) == Arrivals.at_rate(2.0).times(100, seed=9)
    assert poisson(2.0, 1.0, 100, seed=9) != poisson(2.0, 1.0, 100, seed=10)
    assert Arrivals.offline().times(3, seed=0) == [0.0, 0.0, 0.0]


@pytest.mark.parametrize(
    "build, culprit",
    [
        (lambda: Arrivals.at_rate(0), "rate=0"),
        (lambda: Arrivals.at_rate(-2.5), "rate=-2.5"),
        (lambda: Arrivals.at_rate(math.inf), "rate=inf"),
        (lambda: Arrivals.at_rate(math.nan), "rate=nan"),
        (lambda: Arrivals.at_rate(1, burstiness=0), "burstiness=0"),
        (lambda: poisson(1, -1, 5, seed=0), "burstiness=-1"),
        (lambda: Arrivals.closed_loop(0), "concurrency=0"),
        (lambda: Arrivals.closed_loop(-3), "concurrency=-3"),
        (lambda: Arrivals.closed_loop(2.5), "concurrency=2.5"),
        (lambda: Arrivals("bursty"), "'bursty'"),
    ],
)
def test_bad_arrivals_are_refused(build, culprit):
    _one_line_error(build, culprit)


def test_a_closed_loop_has_no_arrival_times():
    with pytest.raises(ValueError, match="closed loop"):
        Arrivals.closed_loop(8).times(3, seed=0)


def test_schedule_keeps_a_traces_times_and_draws_the_rest():
    timed = [Request(0, 5, 5, 3.0), Request(1, 5, 5, 1.0)]
    assert Arrivals.at_rate(10).schedule(timed, seed=0) == timed
    untimed = [Request(i, 5, 5) for i in range(4)]
    assert [r.arrival_s for r in Arrivals.at_rate(10).schedule(untimed, seed=0)] == poisson(10, 1, 4, seed=0)
    assert [r.arrival_s for r in Arrivals.offline().schedule(untimed, seed=0)] == [0.0] * 4
    assert [r.arrival_s for r in Arrivals.closed_loop(2).schedule(untimed, seed=0)] == [None] * 4


# Metrics


def test_percentile_matches_numpys_linear_method():
    # Expected values worked by hand: rank = p / 100 * (n - 1) in the sorted list, interpolated linearly.
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([1, 2, 3, 4], 90) == pytest.approx(3.7)
    assert percentile([1, 2, 3, 4], 99) == pytest.approx(3.97)
    assert percentile([1, 2, 3, 4], 0) == 1 and percentile([1, 2, 3, 4], 100) == 4
    assert percentile([15, 20, 35, 40, 50], 40) == pytest.approx(29.0)
    assert percentile([15, 20, 35, 40, 50], 90) == pytest.approx(46.0)
    assert percentile([3, 1, 2], 25) == pytest.approx(1.5)
    assert percentile([10], 99) == 10
    assert percentile([], 50) == 0.0


def _three_requests() -> list[Finished]:
    """ttft 0.5/0.8/0.25 s, e2el 0.8/0.8/1.0 s, tpot 0.15 s and 0.25 s (the one-token request has none), ITLs
    0.1, 0.2 and 0.25 three times."""
    return [
        Finished(0, 10, 3, 0.0, 0.5, 0.8, [0.5, 0.6, 0.8]),
        Finished(1, 20, 1, 0.2, 1.0, 1.0, [1.0]),
        Finished(2, 30, 4, 1.0, 1.25, 2.0, [1.25, 1.5, 1.75, 2.0], preemptions=1),
    ]


def test_summary_of_three_requests_worked_by_hand():
    s = summarize(_three_requests())
    expected = {
        "duration": 2.0,
        "completed": 3,
        "total_input_tokens": 60,
        "total_output_tokens": 8,
        "request_throughput": 1.5,
        "output_throughput": 4.0,
        "total_token_throughput": 34.0,
        "mean_ttft_ms": 1550 / 3,
        "median_ttft_ms": 500,
        "std_ttft_ms": math.sqrt(455000 / 9),
        "p90_ttft_ms": 740,
        "p95_ttft_ms": 770,
        "p99_ttft_ms": 794,
        "mean_tpot_ms": 200,
        "median_tpot_ms": 200,
        "std_tpot_ms": 50,
        "p90_tpot_ms": 240,
        "p95_tpot_ms": 245,
        "p99_tpot_ms": 249,
        "mean_itl_ms": 210,
        "median_itl_ms": 250,
        "std_itl_ms": math.sqrt(3400),
        "p90_itl_ms": 250,
        "p95_itl_ms": 250,
        "p99_itl_ms": 250,
        "mean_e2el_ms": 2600 / 3,
        "median_e2el_ms": 800,
        "std_e2el_ms": math.sqrt(80000 / 9),
        "p90_e2el_ms": 960,
        "p95_e2el_ms": 980,
        "p99_e2el_ms": 996,
        "preemptions": 1,
        "output_tokens_per_s_per_user": 5.0,  # 1000 / the mean TPOT of 200 ms
    }
    assert s.keys() == expected.keys() | {"request_goodput"}
    assert s["request_goodput"] is None
    for key, value in expected.items():
        assert s[key] == pytest.approx(value), key


def test_goodput_counts_requests_meeting_every_slo():
    # ttft 500/800/250 ms, tpot 150/0/250 ms (0 for the one-token request, as vLLM counts it).
    assert summarize(_three_requests(), slo_ttft_ms=600, slo_tpot_ms=200)["request_goodput"] == 0.5
    assert summarize(_three_requests(), slo_tpot_ms=200)["request_goodput"] == 1.0
    assert summarize(_three_requests(), slo_ttft_ms=800)["request_goodput"] == 1.5
    _one_line_error(lambda: summarize(_three_requests(), slo_ttft_ms=-1), "slo_ttft=-1")


def test_format_table_reads_like_vllms_printout():
    table = format_table(summarize(_three_requests(), slo_ttft_ms=600))
    assert "Successful requests:" in table and "Request goodput (req/s):" in table
    assert any(
        line.startswith("P99 TPOT (ms):") and line.split()[-1] == "249.00" for line in table.splitlines()
    )
    assert "Request goodput" not in format_table(summarize(_three_requests()))
    lines = format_table({**summarize(_three_requests()), "failed": 2}).splitlines()
    assert lines[1].startswith("Successful requests:") and lines[2].split() == ["Failed", "requests:", "2"]
