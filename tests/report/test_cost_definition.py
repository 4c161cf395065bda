"""One $ per million tokens for one deployment: serve's static batch, simulate offline and simulate at a rate all
charge only the device time that works for tokens, state the tokens/s per user it was served at, and report the
idle device time apart."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import castcore
from castcore.cli.main import main
from castcore.report.energy import simulation_cost
from castcore.simulation.overheads import ENGINES

DATA = Path(__file__).parents[1] / "data"
LLAMA, H100 = str(DATA / "tiny-llama.json"), str(DATA / "h100-sxm.toml")
PRICE = 2.0
LENGTHS = {"input_lengths": "32", "output_lengths": "8"}


@pytest.fixture(scope="module")
def session():
    return castcore.Session(load_packs=[], device_files=[H100])


def _simulated(session, **options):
    report = session.simulate(LLAMA, **LENGTHS, **options)
    return report, simulation_cost(PRICE, report.pool_use, report.summary)


def _served(session, batch, **options):
    return session.serve(
        LLAMA, input_tokens=32, output_tokens=8, batch=batch, price_per_device_hour=PRICE, **options
    ).to_dict()


def test_offline_and_a_static_batch_of_the_same_requests_cost_alike(session):
    static = _served(session, 20)
    report, offline = _simulated(session, requests=20)
    assert report.mean_running == 20  # the engine runs the 20 requests as one batch, as serve does
    # A static batch takes every output token from a decode step (8 here) where the engine takes the first from the
    # prefill (7 steps), and the two price a decode step from their own captures (their TPOTs differ by the
    # ratio of the per-user figures): the output costs agree up to those two factors.
    steps = 8 / 7
    tpot = offline["output_tokens_per_s_per_user"] / static["output_tokens_per_s_per_user"]
    ratio = static["usd_per_million_output_tokens"] / offline["usd_per_million_output_tokens"]
    assert ratio == pytest.approx(steps * tpot, rel=0.1)
    # The engine's own time around the prefill (its launches and CPU work, castcore.simulation.overheads) is in
    # the simulated prompt cost; serve's TTFT is the prefill's kernels.
    assert static["usd_per_million_input_tokens"] < offline["usd_per_million_input_tokens"]
    # A static batch's held time all works; the engine waits for the requests' tokenizing before its first step.
    wait = ENGINES["vllm"].request_s / report.summary["duration"]
    assert static["idle_share"] == 0 and offline["idle_share"] == pytest.approx(wait, rel=1e-9)
    assert offline["output_tokens_per_s_per_user"] == pytest.approx(1000 / report.summary["mean_tpot_ms"])
    assert static["output_tokens_per_s_per_user"] == pytest.approx(1 / static["tpot_s"])


def test_a_light_rate_costs_what_one_request_at_a_time_costs_and_reports_its_idle_time(session):
    report, light = _simulated(session, requests=40, rate=50)
    assert report.mean_running == pytest.approx(1, rel=0.05)  # 20 ms apart on average, each done in 2 ms
    alone = _served(session, 1)
    ratio = alone["usd_per_million_output_tokens"] / light["usd_per_million_output_tokens"]
    tpot = light["output_tokens_per_s_per_user"] / alone["output_tokens_per_s_per_user"]
    assert ratio == pytest.approx(8 / 7 * tpot, rel=0.1)  # as above: the same batching, the same cost
    # The devices mostly wait for the next arrival: that time is idle, priced per hour, not per token.
    assert light["idle_share"] > 0.8
    assert light["usd_per_hour_idle"] == pytest.approx(PRICE * light["idle_share"])
    _, offline = _simulated(session, requests=40)
    # batching 40 at once is what makes offline cheaper per token, not the idle time
    assert offline["usd_per_million_output_tokens"] < light["usd_per_million_output_tokens"] / 5


def test_a_second_replica_at_a_light_rate_adds_idle_time_not_cost_per_token(session):
    one, single = _simulated(session, requests=40, rate=50)
    two, double = _simulated(session, requests=40, rate=50, dp=2)
    assert [u.devices for u in two.pool_use] == [2]
    assert double["usd_per_million_output_tokens"] <= 1.3 * single["usd_per_million_output_tokens"]
    assert double["usd_per_million_input_tokens"] <= 1.3 * single["usd_per_million_input_tokens"]
    assert double["idle_share"] > single["idle_share"]
    assert (
        double["usd_per_hour"] == 2 * PRICE and double["usd_per_hour_idle"] > 2 * single["usd_per_hour_idle"]
    )


def test_disaggregated_pools_charge_the_prefill_pool_to_input_tokens_and_the_decode_pool_to_output(session):
    report, cost = _simulated(
        session, requests=20, rate=40, prefill_instances=2, decode_instances=1, decode_deployment="tp=2"
    )
    prefill, decode = report.pool_use
    assert (prefill.devices, decode.devices) == (2, 2)
    assert (prefill.prefill_share, decode.prefill_share) == (1.0, 0.0)  # prompts only, decodes only
    per_second = PRICE / 3600
    summary = report.summary
    assert cost["usd_per_million_input_tokens"] == pytest.approx(
        per_second * prefill.working_device_s / summary["total_input_tokens"] * 1e6
    )
    assert cost["usd_per_million_output_tokens"] == pytest.approx(
        per_second * decode.working_device_s / summary["total_output_tokens"] * 1e6
    )
    held = 4 * summary["duration"]
    assert cost["idle_share"] == pytest.approx(
        1 - (prefill.working_device_s + decode.working_device_s) / held
    )


def test_simulate_prints_the_cost_at_its_interactivity_and_the_idle_time_apart(capsys):
    argv = [
        "simulate",
        "--model",
        LLAMA,
        "--input",
        "32",
        "--output",
        "8",
        "--requests",
        "20",
        "--rate",
        "50",
        "--device-file",
        H100,
        "--no-packs",
        "--price-per-device-hour",
        "2",
    ]
    assert main([*argv, "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["output_tokens_per_s_per_user"] == pytest.approx(1000 / found["mean_tpot_ms"])
    assert 0.8 < found["idle_share"] < 1 and found["usd_per_hour_idle"] == pytest.approx(
        2 * found["idle_share"]
    )
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    cost = next(line for line in lines if line.startswith("cost "))
    idle = next(line for line in lines if line.startswith("idle "))
    assert f"per million output tokens at {found['output_tokens_per_s_per_user']:,.1f} tok/s/user" in cost
    assert f"{found['idle_share']:.0%} of the held device time" in idle
    assert f"${found['usd_per_hour_idle']:,.2f}/hour" in idle
