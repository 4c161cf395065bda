"""castcore measure / calibrate: structure and positivity only, never timing values."""

from __future__ import annotations

import json

import torch

import castcore
from castcore.cli.main import main
from castcore.operator_tools.timing import calibrate, profile_toml, real_inputs

GENERATED = []


def _gen(invoke):
    GENERATED.append(invoke.name)
    x, index = invoke.args
    return (torch.rand(x.shape), torch.arange(index.shape[0]) % x.shape[0])


@castcore.register_op("n^ d, k -> k d", name="measure_test::gather_rows", input_gen_fn=_gen)
def gather_rows(x, index):
    return x[index]


def test_measure_a_function_measured_against_estimated(session):
    def block(x, w):
        return torch.relu(x @ w)

    report = castcore.measure(
        block, torch.empty(32, 16), torch.empty(16, 8), session=session, warmup=1, repeat=3
    )
    assert [r.op for r in report.rows] == ["aten::mm", "aten::relu"]
    for row in report.rows:
        assert row.error == "" and row.measured_s > 0 and row.min_s > 0 and row.estimated_s > 0
        assert row.ratio > 0 and row.calls == 1
    assert report.device == "h100-sxm" and report.runtime in ("cpu", "cuda:0")
    assert "est/meas" in report.format_table()


def test_registered_op_uses_its_input_gen_fn(session):
    GENERATED.clear()
    report = castcore.measure(
        gather_rows,
        torch.empty(10, 4),
        torch.zeros(6, dtype=torch.int64),
        session=session,
        warmup=1,
        repeat=2,
    )
    (row,) = report.rows
    assert row.op == "measure_test::gather_rows" and row.measured_s > 0
    assert row.estimated_s > 0 and "fallback" in row.answered_by
    assert GENERATED == ["measure_test::gather_rows"]


def test_default_inputs_are_random_floats_and_zero_integers():
    captured = castcore.capture(lambda x, i: x[i], torch.empty(3, 2), torch.zeros(4, dtype=torch.int64))
    (invoke,) = [i for i in captured.invokes if i.name.startswith("aten::index")]
    args, _ = real_inputs(invoke)
    x, (i,) = args
    assert x.dtype == torch.float32 and x.shape == (3, 2) and bool((x >= 0).all() and (x < 1).all())
    assert i.dtype == torch.int64 and not i.any()


def test_calls_that_cannot_run_are_reported_not_fatal(session):
    def shape_op(x):
        return x.new_empty(2, 2).fill_(1.0)

    report = castcore.measure(shape_op, torch.empty(2), session=session, warmup=0, repeat=1)
    assert report.rows and all(r.measured_s is not None or r.error for r in report.rows)


def test_calibrate_writes_a_valid_sourced_profile(tmp_path):
    cal = calibrate(quick=True, dtypes=(torch.float32,), repeat=2)
    assert cal.mma_flops["float32"] > 0 and cal.gp_flops["float32"] > 0 and cal.memory_bandwidth > 0
    path = tmp_path / "local.toml"
    path.write_text(profile_toml(cal, name="here"), encoding="utf-8")
    profile = castcore.load_device_file(path)
    assert profile.name == "here" and profile.mma_flops["float32"] > 0
    assert all("castcore calibrate" in s and s.startswith("measurement, ") for s in profile.sources.values())


def test_cli_calibrate_then_measure_on_that_profile(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("CASTCORE_LOAD_PACKS", "")
    out = tmp_path / "local.toml"
    assert main(["calibrate", "--quick", "--name", "this-cpu", "-o", str(out)]) == 0
    assert castcore.load_device_file(out).name == "this-cpu"
    ops = tmp_path / "ops.py"
    ops.write_text("import torch\ndef block(x, w):\n    return torch.tanh(x @ w)\n", encoding="utf-8")
    capsys.readouterr()
    assert (
        main(
            [
                "measure",
                f"{ops}:block",
                "--input",
                "16x8:fp32",
                "--input",
                "8x4:fp32",
                "--repeat",
                "2",
                "--device-file",
                str(out),
                "--json",
            ]
        )
        == 0
    )
    report = json.loads(capsys.readouterr().out)
    assert report["device"] == "this-cpu" and [r["op"] for r in report["rows"]] == ["aten::mm", "aten::tanh"]
    assert all(r["measured_s"] > 0 for r in report["rows"])
