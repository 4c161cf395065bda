"""A run's steady state: warm-up and drain left out, saturation told from a queue that keeps up, and intervals that
bracket each statistic, on made-up queues whose answer is known and on real simulations of a tiny model."""

from __future__ import annotations

import random
from pathlib import Path

import castcore
from castcore.simulation.metrics import Finished
from castcore.simulation.steady import steady_state

DATA = Path(__file__).parents[1] / "data"
LLAMA = str(DATA / "tiny-llama.json")


def _single_server(n: int, gap_s: float, service_s: float, tokens: int = 5) -> list[Finished]:
    """n requests arriving every ``gap_s`` to one server taking ``service_s`` each, first come first served: its
    first token when its service starts, its last ``service_s`` later."""
    done, free = [], 0.0
    for i in range(n):
        arrival = i * gap_s
        start = max(arrival, free)
        free = start + service_s
        done.append(Finished(i, 10, tokens, arrival, start + 1e-3, free))
    return done


def test_a_server_slower_than_its_arrivals_is_saturated_and_a_faster_one_is_not():
    slow = steady_state(_single_server(1000, 1.0, 1.25))
    assert slow["saturated"] is True
    assert slow["offered_rate"] == 1.0
    assert abs(slow["served_rate"] - 0.8) < 0.01  # one every 1.25 s
    fast = steady_state(_single_server(1000, 1.0, 0.8))
    assert fast["saturated"] is False and fast["served_rate"] == fast["offered_rate"]
    # no queue: every request waits 1 ms for its first token, so each statistic and its interval are that
    assert all(abs(v - 1.0) < 1e-9 for v in fast["ttft"]["p99"])


def test_the_window_leaves_out_the_first_and_last_tenth_of_the_arrivals():
    run = _single_server(1000, 1.0, 0.8)
    for request in run[:100]:  # a slow start: the first tenth waits 5 s for its first token
        request.first_token_s = request.arrival_s + 5.0
    steady = steady_state(run)
    assert steady["requests"] == 800 and steady["window_s"] == [100.0, 899.0]
    assert steady["ttft"]["p99"][0] < 1.001  # the slow start is not in it


def test_an_interval_brackets_its_statistic_and_is_the_same_each_time():
    rng = random.Random(7)
    run = [Finished(i, 10, 20, i * 0.1, i * 0.1 + rng.expovariate(10.0), i * 0.1 + 2.0) for i in range(2000)]
    steady = steady_state(run)
    for metric in ("ttft", "tpot"):
        for name, (value, low, high) in steady[metric].items():
            assert low <= value <= high, (metric, name)
    value, low, high = steady["ttft"]["p99"]
    assert high - low > 0.01 * value  # a real spread, not a point
    assert steady_state(run) == steady


def test_no_steady_state_offline_or_with_too_few_requests():
    assert steady_state([Finished(i, 10, 5, 0.0, 0.1, 0.5) for i in range(500)]) is None
    assert steady_state(_single_server(100, 1.0, 0.5)) is None


def _simulate(rate: float, requests: int, **more):
    session = castcore.Session(load_packs=[], device_files=[DATA / "h100-sxm.toml"])
    return session.simulate(
        LLAMA,
        device="h100-sxm",
        input_lengths="200",
        output_lengths="40",
        rate=rate,
        requests=requests,
        **more,
    )


def test_simulate_reports_the_steady_state_of_a_real_run():
    light = _simulate(2000.0, 1000)
    steady = light.summary["steady_state"]
    assert steady["saturated"] is False and steady["requests"] == 800
    value, low, high = steady["ttft"]["p99"]
    assert low <= value <= high
    assert "steady state (800 requests" in light.format_text()
    # far past what one replica serves: the waiting queue grows for as long as requests arrive
    heavy = _simulate(400000.0, 1000)
    assert heavy.summary["steady_state"]["saturated"] is True
    assert "SATURATED" in heavy.format_text()
    assert (
        heavy.to_dict()["steady_state"]["served_rate"] < 0.95 * heavy.summary["steady_state"]["offered_rate"]
    )


def test_a_run_stopped_once_saturated_says_what_the_whole_run_says_of_its_window():
    whole = _simulate(400000.0, 1000)
    stopped = _simulate(400000.0, 1000, stop_saturated=True)
    judged = stopped.summary["steady_state"]
    expected = whole.summary["steady_state"]
    assert judged["saturated"] is True
    for key in ("requests", "window_s", "offered_rate", "served_rate"):
        assert judged[key] == expected[key], key
    assert judged["ttft"] is None and judged["tpot"] is None  # no latencies claimed of a growing queue
    assert stopped.iterations < whole.iterations
    assert stopped.summary["completed"] < whole.summary["completed"]
    assert any(note.startswith("stopped at ") and "stop_saturated" in note for note in stopped.notes)
    assert "SATURATED" in stopped.format_text()


def test_a_run_that_keeps_up_is_not_stopped():
    assert _simulate(2000.0, 1000, stop_saturated=True).summary == _simulate(2000.0, 1000).summary
