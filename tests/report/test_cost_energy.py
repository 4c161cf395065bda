"""Cost and energy: the profiles' board power, the power model worked by hand, the price per device-hour split
between prompt and output tokens, and plan's --objective ranking by them."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

import castcore
from castcore.cli.main import main
from castcore.devices.profile import DeviceError
from castcore.devices.profile_files import device_from_dict, load_device_file
from castcore.options.option import Objective
from castcore.report.energy import (
    PhaseTime,
    busy_s,
    cost_figures,
    DeviceTime,
    energy_figures,
    energy_j,
    fitted_sum,
    PoolUse,
    prefill_share,
    simulation_cost,
    simulation_energy,
)
from castcore.sweeps import capacity
from castcore.sweeps.plan import PlanRequest, PlanResult, search
from castcore.sweeps.run import SweepResult
from castcore.sweeps.sweep import check, commands
from castcore.serving import ladder_points
from castcore.serving.metering import Metered, pool_use
from castcore.simulation.chunks import Chunk

DATA = Path(__file__).parents[1] / "data"
LLAMA = str(DATA / "tiny-llama.json")
POWER = SimpleNamespace(tdp_w=700.0, idle_w=140.0)


def _minimal(**more):
    sources = {k: "test value" for k in ("mma_flops", "gp_flops", "memory_bytes", "memory_bandwidth", *more)}
    return {
        "name": "p",
        "vendor": "t",
        "mma_flops": {"bfloat16": 1e12},
        "gp_flops": {"bfloat16": 1e11},
        "memory_bytes": 1e9,
        "memory_bandwidth": 1e11,
        **more,
        "sources": sources,
    }


def test_a_profile_gives_its_power_as_a_sourced_pair_with_idle_below_the_limit():
    device = device_from_dict(_minimal(tdp_w=700, idle_w=140))
    assert (device.tdp_w, device.idle_w) == (700.0, 140.0)
    assert device_from_dict(_minimal()).tdp_w == 0.0  # optional: no power, no energy figures
    with pytest.raises(DeviceError, match="'tdp_w' needs idle_w too"):
        device_from_dict(_minimal(tdp_w=700))
    with pytest.raises(DeviceError, match="'idle_w' = 800 must be below 'tdp_w' = 700"):
        device_from_dict(_minimal(tdp_w=700, idle_w=800))
    unsourced = _minimal(tdp_w=700, idle_w=140)
    del unsourced["sources"]["idle_w"]
    with pytest.raises(DeviceError, match="no source for idle_w"):
        device_from_dict(unsourced)


def _op(time_s, compute_s=0.0, memory_s=0.0, overhead_s=0.0, comm_s=0.0):
    return SimpleNamespace(
        estimate=SimpleNamespace(
            time_s=time_s, compute_s=compute_s, memory_s=memory_s, overhead_s=overhead_s, comm_s=comm_s
        )
    )


def test_busy_time_is_each_ops_time_less_its_launch_and_communication():
    # A GEMM of 10 us (compute 6, memory 8, launch 2): busy 8, its memory-bound part; an all-reduce of 5 us: idle;
    # an estimator's 4 us kernel given as a time alone: busy.
    report = SimpleNamespace(
        records=[_op(10e-6, 6e-6, 8e-6, overhead_s=2e-6), _op(5e-6, comm_s=5e-6), _op(4e-6)]
    )
    assert busy_s(report) == pytest.approx(12e-6)
    # 20 us at 700 W limit and 140 W idle: 140 x 20 us + (700 - 140) x 12 us = 2.8 mJ + 6.72 mJ.
    assert energy_j(POWER, 20e-6, 12e-6) == pytest.approx(9.52e-3)
    assert energy_j(POWER, 20e-6, 0.0) == pytest.approx(140 * 20e-6)  # all idle
    assert energy_j(POWER, 20e-6, 30e-6) == pytest.approx(700 * 20e-6)  # never above the limit
    # Under --pp 2 with 4 micro-batches the average device runs half the layers 4 times: 12 x 4 / 2 = 24 us.
    report.pipeline = SimpleNamespace(micro_batches=4, stages=2, step_s=30e-6)
    assert busy_s(report) == pytest.approx(24e-6)


def test_decode_busy_time_is_summed_over_every_step_on_its_fitted_line():
    # busy 1.0 s at KV 10 and 2.0 s at KV 20: 0.1 s per token; the steps at KV 10, 11, 12 sum to 1.0 + 1.1 + 1.2.
    assert fitted_sum({10: 1.0, 20: 2.0}, 10, 3) == pytest.approx(3.3)


def test_energy_of_a_request_batch_by_hand():
    # 2 devices; prefill 0.1 s (busy 0.05 s) makes 1000 input tokens; decode 1 s (busy 0.5 s) 100 output tokens.
    found = energy_figures(POWER, 2, PhaseTime(0.1, 0.05, 1000), PhaseTime(1.0, 0.5, 100))
    prefill = 2 * (140 * 0.1 + 560 * 0.05)  # 84 J
    decode = 2 * (140 * 1.0 + 560 * 0.5)  # 840 J
    assert found["prefill_energy_j"] == pytest.approx(prefill) and found["decode_energy_j"] == pytest.approx(
        decode
    )
    assert found["energy_j"] == pytest.approx(924.0)
    assert found["output_tokens_per_joule"] == pytest.approx(100 / 924)
    assert found["joules_per_output_token"] == pytest.approx(9.24)
    assert found["joules_per_input_token"] == pytest.approx(0.084)
    assert found["power_w_per_device"] == pytest.approx(924 / 2 / 1.1)  # 420 W
    assert found["utilization"] == pytest.approx(0.5)
    assert (
        energy_figures(SimpleNamespace(tdp_w=0.0, idle_w=0.0), 2, PhaseTime(1, 1, 1), PhaseTime(1, 1, 1))
        == {}
    )


def test_cost_charges_each_phases_device_time_to_its_tokens():
    # $2 a device-hour on 4 devices: $8/hour; prefill 0.5 s for 8000 input tokens, decode 10 s for 800 output.
    found = cost_figures(2.0, 4, DeviceTime(4 * 10.5, 4 * 0.5, 4 * 10.0), 8000, 800, 80.0)
    assert found["usd_per_hour"] == 8.0
    assert found["usd_per_million_input_tokens"] == pytest.approx(8 / 3600 * 0.5 / 8000 * 1e6)  # $0.139
    assert found["usd_per_million_output_tokens"] == pytest.approx(8 / 3600 * 10 / 800 * 1e6)  # $27.78
    assert found["idle_share"] == 0.0 and found["usd_per_hour_idle"] == 0.0  # working all the time held
    assert found["output_tokens_per_s_per_user"] == 80.0
    assert cost_figures(None, 4, DeviceTime(1.0, 0.5, 0.5), 8000, 800, None) == {}


def test_a_simulated_runs_working_time_is_split_by_each_iterations_prompt_and_decode_tokens():
    # 1 s of 100 prompt tokens, 2 s of 30 prompt + 10 decode (1.5 s to prompts), 1 s of 10 decode: 2.5 of 4 s.
    trace = SimpleNamespace(prefill_tokens=[100, 30, 0], decode_tokens=[0, 10, 10], duration=[1.0, 2.0, 1.0])
    assert prefill_share(trace.prefill_tokens, trace.decode_tokens, trace.duration) == pytest.approx(0.625)
    use = pool_use("gpu", SimpleNamespace(devices=2, pp=1, attention_dp=1), 1, [], [trace])
    assert (use.working_device_s, use.prefill_share) == (8.0, 0.625)  # 2 devices for the 4 s of iterations
    summary = {"duration": 36.0, "total_input_tokens": 1000, "total_output_tokens": 500}
    found = simulation_cost(1.0, [use], summary)  # $1 a device-hour: 8 device-seconds working = $1/450
    assert found["usd_per_million_input_tokens"] == pytest.approx(8 / 3600 * 0.625 / 1000 * 1e6)
    assert found["usd_per_million_output_tokens"] == pytest.approx(8 / 3600 * 0.375 / 500 * 1e6)
    # held 72 device-seconds, working 8: the rest is idle, priced apart
    assert found["idle_share"] == pytest.approx(64 / 72)
    assert found["usd_per_hour_idle"] == pytest.approx(2 * 64 / 72)


def test_a_simulated_runs_energy_holds_every_device_for_the_run():
    # tp 2 x pp 2 x dp 2: 2 replicas of 4 devices held 10 s, 20 s per device position over the replicas; the
    # iterations were busy 24 s of whole-model time and a device runs half the layers (pp 2) of each: 12 s.
    # Per position 140 W x 20 s + 560 W x 12 s = 9,520 J, for each of a replica's 4 positions.
    replica = SimpleNamespace(devices=4, pp=2, attention_dp=1)
    # model + draft
    use = pool_use("gpu", replica, 2, [SimpleNamespace(busy_s=20.0), SimpleNamespace(busy_s=4.0)], [])
    assert (use.devices, use.busy_device_s) == (8, 48.0)
    found = simulation_energy([(POWER, use)], {"duration": 10.0, "total_output_tokens": 1000})
    assert found["energy_j"] == pytest.approx(4 * (140 * 20 + 560 * 12))
    assert found["utilization"] == pytest.approx(0.6) and found["power_w_per_device"] == pytest.approx(476.0)
    assert found["output_tokens_per_joule"] == pytest.approx(1000 / 38080)


def test_two_pools_of_two_devices_each_draw_their_own_power():
    # A prefill pool of 2 devices (700 W limit, 140 W idle) busy 5 of their 20 device-seconds, and a decode pool of
    # 4 others (1000 W, 200 W) busy 30 of their 40: 140 x 20 + 560 x 5 + 200 x 40 + 800 x 30 = 37,600 J.
    other = SimpleNamespace(tdp_w=1000.0, idle_w=200.0)
    pools = [(POWER, PoolUse("a", 2, 5.0, 5.0, 1.0)), (other, PoolUse("b", 4, 30.0, 30.0, 0.0))]
    found = simulation_energy(pools, {"duration": 10.0, "total_output_tokens": 376})
    assert found["energy_j"] == pytest.approx(37600.0)
    assert found["utilization"] == pytest.approx(35 / 60) and found[
        "output_tokens_per_joule"
    ] == pytest.approx(0.01)
    # a pool without power numbers
    assert (
        simulation_energy(
            [
                (POWER, PoolUse("a", 2, 5.0, 5.0, 1.0)),
                (SimpleNamespace(tdp_w=0.0), PoolUse("b", 4, 1.0, 1.0, 0.0)),
            ],
            {"duration": 10.0, "total_output_tokens": 1},
        )
        == {}
    )


class _Ladder:
    """A step-time model of two ladder captures: 1 token busy 20% of its time, 64 tokens 80%; an iteration takes
    1 ms a token."""

    points = [1, 64]

    def point(self, tokens):
        share = {1: 0.2, 64: 0.8}[tokens]
        record = _op(1.0, memory_s=share, overhead_s=1 - share)
        record.invoke = SimpleNamespace(module="model.layers.0.mlp", name="aten::mm")
        return ladder_points.Point.of(SimpleNamespace(records=[record], time_s=1.0, memory=None), [0])

    def __call__(self, batch):
        return 1e-3 * sum(c[0] for c in batch)


def test_an_iterations_busy_time_comes_from_the_ladder_captures_around_it():
    metered = Metered(_Ladder())
    assert metered.share(1) == pytest.approx(0.2) and metered.share(64) == pytest.approx(0.8)
    assert metered.share(32) == pytest.approx(0.2 + 0.6 * 31 / 63)  # on the line between them
    assert metered.share(500) == pytest.approx(0.8)  # not past the last capture
    assert metered([Chunk(16, 0, True), Chunk(16, 100, True)]) == pytest.approx(0.032)  # the engine's time
    assert metered.busy_s == pytest.approx(0.032 * (0.2 + 0.6 * 31 / 63))


def _without_overheads(tmp_path: Path) -> Path:
    """The H100 test profile with no launch costs: every op keeps the device busy, so it draws its 700 W."""
    text = (DATA / "h100-sxm.toml").read_text()
    for key in ("mma_op_cost_s = 5e-6", "gp_op_cost_s = 4e-6", "comm_op_cost_s = 1e-5"):
        text = text.replace(key, key.split(" = ")[0] + " = 0.0")
    path = tmp_path / "busy.toml"
    path.write_text(text.replace('name = "h100-sxm"', 'name = "h100-busy"'))
    return path


def test_serve_draws_the_limit_when_every_op_is_busy_and_prices_each_phase(tmp_path):
    session = castcore.Session(load_packs=[], device_files=[_without_overheads(tmp_path)])
    report = session.serve(LLAMA, input_tokens=32, output_tokens=8, batch=2, price_per_device_hour=3.6)
    found = report.to_dict()
    # Every op keeps the device busy: one device at its limit throughout (serve prices the kernels alone).
    assert found["utilization"] == pytest.approx(1.0)
    assert found["energy_j"] == pytest.approx(700 * report.latency_s)
    assert found["output_tokens_per_joule"] == pytest.approx(2 * 8 / (700 * report.latency_s))
    # $3.6 an hour is $0.001 a second: the prefill's seconds over 64 input tokens, the decode's over 16 output.
    assert found["usd_per_million_input_tokens"] == pytest.approx(1e-3 * report.ttft_s / 64 * 1e6)
    assert found["usd_per_million_output_tokens"] == pytest.approx(1e-3 * report.decode_s / 16 * 1e6)
    assert "energy " in report.format_text() and "per million output tokens" in report.format_text()


def test_a_simulation_without_launch_costs_is_busy_for_its_kernels_only(tmp_path):
    session = castcore.Session(load_packs=[], device_files=[_without_overheads(tmp_path)])
    device = session.device(None)
    # all at once; without launch costs the tiny model's kernels take microseconds, and the engine's CPU work
    # each iteration and the requests' path before it leave the device idle (castcore.simulation.overheads)
    report = session.simulate(LLAMA, requests=20, input_lengths="32", output_lengths="8")
    found = simulation_energy([(device, use) for use in report.pool_use], report.summary)
    (use,) = report.pool_use
    duration = report.summary["duration"]
    assert found["utilization"] == pytest.approx(use.busy_device_s / duration) and found["utilization"] < 0.1
    assert found["energy_j"] == pytest.approx(
        device.idle_w * duration + (700 - device.idle_w) * use.busy_device_s
    )


def test_serve_with_launch_costs_is_between_idle_and_the_limit():
    device = load_device_file(DATA / "h100-sxm.toml")
    report = castcore.Session(load_packs=[], device_files=[DATA / "h100-sxm.toml"]).serve(
        LLAMA, input_tokens=32, output_tokens=8, batch=2, tp=2
    )
    found = report.to_dict()
    assert 0 < found["utilization"] < 1  # the tiny model's ops are mostly launch costs and all-reduces
    assert found["energy_j"] == pytest.approx(
        2
        * (
            device.idle_w * report.latency_s
            + (device.tdp_w - device.idle_w) * found["utilization"] * report.latency_s
        )
    )
    assert "usd_per_hour" not in found  # no price, no cost


def test_serve_cli_prints_energy_and_cost_as_json(capsys):
    assert (
        main(
            [
                "serve",
                "--model",
                LLAMA,
                "--input",
                "32",
                "--output",
                "8",
                "--device-file",
                str(DATA / "h100-sxm.toml"),
                "--no-packs",
                "--price-per-device-hour",
                "2",
                "--json",
            ]
        )
        == 0
    )
    found = json.loads(capsys.readouterr().out)
    assert found["price_per_device_hour"] == 2.0 and found["usd_per_hour"] == 2.0
    assert found["usd_per_million_output_tokens"] > 0 and found["output_tokens_per_joule"] > 0


@pytest.mark.parametrize(
    "argv, said",
    [
        (
            ["serve", "--price-per-device-hour", "-2"],
            "--price-per-device-hour -2.0: must be a number above zero",
        ),
        (
            ["simulate", "--price-per-device-hour", "0"],
            "--price-per-device-hour 0.0: must be a number above zero",
        ),
        (
            ["plan", "--price-per-device-hour", "-1"],
            "--price-per-device-hour -1.0: must be a number above zero",
        ),
        (
            ["plan", "--objective", "cost"],
            "--objective cost ranks by dollars per million output tokens: give "
            "--price-per-device-hour (or --device-price per device)",
        ),
        (
            ["plan", "--device-price", "h100-sxm"],
            "--device-price h100-sxm: give NAME=USD with a price above zero",
        ),
        (
            ["plan", "--device-price", "h100-sxm=-3"],
            "--device-price h100-sxm=-3: give NAME=USD with a price above zero",
        ),
        (
            ["plan", "--device-price", "b300=9"],
            "--device-price b300=...: no such device; installed: h100-sxm",
        ),
    ],
)
def test_bad_cost_input_is_one_line_exit_2_and_nothing_written(capsys, argv, said):
    assert (
        main(
            [
                *argv,
                "--model",
                LLAMA,
                "--input",
                "32",
                "--output",
                "8",
                "--device-file",
                str(DATA / "h100-sxm.toml"),
                "--no-packs",
            ]
        )
        == 2
    )
    out, err = capsys.readouterr()
    last = err.strip().splitlines()[-1]
    assert out == "" and last.startswith("castcore") and f"error: {said}" in last, err


def test_an_unknown_objective_is_refused(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["plan", "--model", LLAMA, "--objective", "speed"])
    assert exited.value.code == 2
    assert "argument --objective: invalid choice: 'speed'" in capsys.readouterr().err
    with pytest.raises(
        castcore.ModelError, match="objective='speed': is not supported; use one of throughput, cost"
    ):
        castcore.plan(LLAMA, objective="speed")


def test_simulate_cli_prints_energy_and_cost_as_json(capsys):
    assert (
        main(
            [
                "simulate",
                "--model",
                LLAMA,
                "--input",
                "32",
                "--output",
                "8",
                "--requests",
                "20",
                "--device-file",
                str(DATA / "h100-sxm.toml"),
                "--no-packs",
                "--price-per-device-hour",
                "2",
                "--json",
            ]
        )
        == 0
    )
    found = json.loads(capsys.readouterr().out)
    assert 0 <= found["utilization"] <= 1 and found["energy_j"] >= 140 * found["duration"]
    assert found["usd_per_hour"] == 2.0 and 0 < found["prefill_time_share"] < 1


def test_the_energy_objective_needs_every_device_to_give_its_power(capsys):
    assert (
        main(
            [
                "plan",
                "--model",
                LLAMA,
                "--input",
                "32",
                "--output",
                "8",
                "--objective",
                "energy",
                "--device-file",
                str(DATA / "a100-sxm-80gb.toml"),
                "--no-packs",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == (
        "castcore: error: --objective energy needs each device's power (tdp_w and idle_w in its "
        "profile), which a100-sxm-80gb lack: name others with --device"
    )


def test_the_price_is_a_sweep_axis_of_serve_and_simulate():
    for command in ("serve", "simulate"):
        spec, _, _ = check({"command": command, "model": LLAMA, "price_per_device_hour": [1.0, 2.5]})
        assert spec.axes["price_per_device_hour"] == [1.0, 2.5]
    with pytest.raises(castcore.ModelError, match="price_per_device_hour = -1: must be a number above zero"):
        check({"command": "serve", "model": LLAMA, "price_per_device_hour": -1})


# Three layouts: A the fastest but dear per output token and power-hungry, B the cheapest and most frugal, C between.
FIGURES = {1: (100.0, 5.0, 1.0), 2: (80.0, 3.0, 2.0), 4: (90.0, 4.0, 0.5)}  # tp: tok/s/device, $/M out, tok/J


def _fake_serve(points):
    rows = []
    for p in points:
        speed, usd, per_joule = FIGURES[p.params["tp"]]
        rows.append(
            {
                **p.params,
                "served_batch": 8,
                "fits": True,
                "ttft_s": 0.01,
                "tpot_s": 0.001,
                "latency_s": 0.02,
                "devices": 1,
                "error": None,
                "output_tokens_per_s_per_device": speed,
                "usd_per_million_output_tokens": usd,
                "output_tokens_per_joule": per_joule,
            }
        )
    return SweepResult(rows=rows, columns=list(rows[0]))


@pytest.mark.parametrize(
    "objective, order", [("throughput", [1, 4, 2]), ("cost", [2, 4, 1]), ("energy", [2, 1, 4])]
)
def test_the_objective_changes_which_static_deployment_is_best(objective, order):
    h100 = load_device_file(DATA / "h100-sxm.toml")
    request = PlanRequest(
        model=LLAMA,
        input_tokens=32,
        output_tokens=8,
        devices=["h100-sxm"],
        tp=[1, 2, 4],
        pp=[1],
        weights=[None],
        objective=objective,
        price_per_device_hour=2.0,
    )
    result = search(request, commands()["serve"], {"h100-sxm": h100}, _fake_serve)
    assert [r["tp"] for r in result.best] == order
    assert all(r["price_per_device_hour"] == 2.0 for r in result.rows)  # every point was priced


def test_the_cost_and_energy_objectives_rank_a_traffic_plan_too():
    def run(points):
        rows = [
            {
                **p.params,
                "error": None,
                "never_fit": 0,
                "devices": p.params["tp"],
                "p99_ttft_ms": 10.0,
                "median_e2el_s": 0.1,
                "output_tokens_per_s_per_device": FIGURES[p.params["tp"]][0],
                "usd_per_million_output_tokens": FIGURES[p.params["tp"]][1],
                "output_tokens_per_joule": FIGURES[p.params["tp"]][2],
                "usd_per_hour": 2.0 * p.params["tp"],
            }
            for p in points
        ]
        return SweepResult(rows=rows, columns=list(rows[0]))

    chosen = [
        {
            "model": LLAMA,
            "input": "32",
            "output": "8",
            "dtype": "bf16",
            "device": "h100-sxm",
            "weights": None,
            "requests": 50,
            "engine": "vllm",
            "tp": tp,
            "pp": 1,
            "ep": 1,
            "price_per_device_hour": 2.0,
        }
        for tp in (1, 2, 4)
    ]
    # In a closed loop the layouts serve different tokens: cost ranks by $ per million of them. At a fixed rate they
    # serve the same ones: cost ranks by the dollars an hour each holds.
    for objective, traffic, order in (
        ("throughput", {"rate": 5.0}, [1, 4, 2]),
        ("cost", {"concurrency": 8}, [2, 4, 1]),
        ("cost", {"rate": 5.0}, [1, 2, 4]),
        ("energy", {"rate": 5.0}, [2, 1, 4]),
    ):
        request = PlanRequest(
            model=LLAMA,
            devices=["h100-sxm"],
            weights=[None],
            ttft=Objective("p99", 0.1),
            **traffic,
            max_devices=4,
            objective=objective,
            price_per_device_hour=2.0,
        )
        result = PlanResult(request, **capacity.search(request, commands()["simulate"], chosen, run))
        assert [r["tp"] for r in result.best] == order


def test_plan_prints_the_objectives_column(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    argv = [
        "plan",
        "--model",
        LLAMA,
        "--input",
        "32",
        "--output",
        "8",
        "--tp",
        "1",
        "--weights",
        "bf16",
        "--device-file",
        str(DATA / "h100-sxm.toml"),
        "--no-packs",
        "--workers",
        "1",
        "--objective",
        "cost",
        "--price-per-device-hour",
        "2",
    ]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "by the fewest $ per million output tokens (fit in memory)" in text and "$/M out tok" in text
    assert main([*argv, "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["objective"] == "cost" and found["price_per_device_hour"] == 2.0
    assert (
        found["best"][0]["usd_per_million_output_tokens"] > 0
        and found["best"][0]["output_tokens_per_joule"] > 0
    )
    # at a fixed rate the plan ranks by what each layout holds an hour, and prints it
    assert main([*argv, "--rate", "40", "--requests", "40", "--validate", "0"]) == 0
    text = capsys.readouterr().out
    assert "by the fewest $ an hour held (each serves the same rate; idle devices count)" in text
    assert "$/hour" in text and "2.00" in text


def test_a_sweep_prices_every_point_at_each_price(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    rows = castcore.sweep(
        {
            "command": "serve",
            "model": LLAMA,
            "input": 32,
            "output": 8,
            "batch": 2,
            "price_per_device_hour": [1.0, 3.0],
            "device_file": str(DATA / "h100-sxm.toml"),
            "no_packs": True,
        },
        workers=1,
    )
    assert [r["price_per_device_hour"] for r in rows] == [1.0, 3.0] and not any(r["error"] for r in rows)
    cheap, dear = rows
    assert dear["usd_per_million_output_tokens"] == pytest.approx(3 * cheap["usd_per_million_output_tokens"])
    assert dear["energy_j"] == cheap["energy_j"] > 0  # the price changes the money, not the joules


def test_a_device_price_of_its_own_prices_that_devices_points():
    h100, a100 = load_device_file(DATA / "h100-sxm.toml"), load_device_file(DATA / "a100-sxm-80gb.toml")
    seen = {}

    def run(points):
        for p in points:
            seen[p.params["device"]] = p.params["price_per_device_hour"]
        return _fake_serve(points)

    request = PlanRequest(
        model=LLAMA,
        input_tokens=32,
        output_tokens=8,
        devices=["h100-sxm", "a100-sxm-80gb"],
        tp=[1],
        pp=[1],
        weights=[None],
        objective="cost",
        price_per_device_hour=2.0,
        device_prices={"a100-sxm-80gb": 1.2},
    )
    search(request, commands()["serve"], {"h100-sxm": h100, "a100-sxm-80gb": a100}, run)
    assert seen == {"h100-sxm": 2.0, "a100-sxm-80gb": 1.2}


def test_the_cost_objective_needs_a_price_for_every_device_searched(capsys):
    assert (
        main(
            [
                "plan",
                "--model",
                LLAMA,
                "--input",
                "32",
                "--output",
                "8",
                "--objective",
                "cost",
                "--device-file",
                str(DATA / "h100-sxm.toml"),
                "--device-file",
                str(DATA / "a100-sxm-80gb.toml"),
                "--no-packs",
                "--device-price",
                "h100-sxm=2",
            ]
        )
        == 2
    )
    out, err = capsys.readouterr()
    assert out == "" and err.strip().splitlines()[-1] == (
        "castcore: error: --objective cost ranks by dollars per million output tokens: give --price-per-device-hour, "
        "or --device-price for a100-sxm-80gb"
    )
