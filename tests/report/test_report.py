"""What castcore estimate hands a user: rows by op and module, coverage, CSV, JSON, a trace, a chart, memory."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys

import pytest
import torch

from castcore.workload.spec import build_workload
from castcore.deploy.pipeline import build
from tests.factories.tiny_mlp import mystery


@pytest.fixture
def report(session, tiny_llama):
    return session.estimate(build_workload(str(tiny_llama), seq=32))


def test_rows_by_module_add_up_to_the_total(report):
    modules = report.by_module()
    assert sum(m.time_s for m in modules) == pytest.approx(report.time_s)
    assert sum(m.calls for m in modules) == len(report.records)
    names = {m.module for m in modules}
    assert "LlamaForCausalLM.model.layers.1.self_attn" in names
    assert "module" in report.format_table(by="module").splitlines()[2]


def test_coverage_counts_fallback_ops_and_time(session):
    x = torch.empty(1024, dtype=torch.float32, device="meta")
    report = session.estimate(lambda t: mystery(t) + 1, x)
    coverage = report.coverage()
    fallback = [r for r in report.records if r.estimate.fallback]
    assert coverage["fallback_calls"] == len(fallback) >= 1
    assert coverage["fallback_time_s"] == pytest.approx(sum(r.estimate.time_s for r in fallback))
    assert coverage["fallback_time_share"] == pytest.approx(coverage["fallback_time_s"] / report.time_s)
    assert coverage["fallback_ops"] == sorted({r.invoke.name for r in fallback})
    assert "by memory-only fallback" in report.format_table()


def test_csv_has_every_op_row_and_a_total(report):
    rows = list(csv.DictReader(io.StringIO(report.to_csv())))
    assert [r["op"] for r in rows[:-1]] == [s.op for s in report.by_op()]
    assert rows[-1]["op"] == "TOTAL"
    assert float(rows[-1]["time_s"]) == pytest.approx(report.time_s)
    assert sum(float(r["flops"]) for r in rows[:-1]) == pytest.approx(report.flops)


def test_json_has_rows_totals_coverage_and_memory(report):
    data = json.loads(report.to_json())
    assert data["totals"]["time_s"] == pytest.approx(report.time_s)
    assert len(data["ops"]) == len(report.by_op())
    assert data["memory"]["weight_bytes"] == report.memory.weight_bytes > 0
    assert data["coverage"]["calls"] == len(report.records)


def test_trace_is_chrome_trace_events_one_slice_per_call(report):
    trace = json.loads(json.dumps(report.to_trace()))
    slices = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(slices) == len(report.records)
    assert sum(e["dur"] for e in slices) == pytest.approx(report.time_s * 1e6)
    for before, after in zip(slices, slices[1:]):
        assert after["ts"] == pytest.approx(before["ts"] + before["dur"])
    mm = next(e for e in slices if e["name"] == "aten::mm")
    assert {"inputs", "outputs", "bound", "source", "module"} <= set(mm["args"])


def test_cli_writes_trace_and_roofline_png(tiny_llama, h100_file, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("CASTCORE_")}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "castcore",
            "estimate",
            "--model",
            str(tiny_llama),
            "--seq",
            "16",
            "--no-packs",
            "--device-file",
            str(h100_file),
            "--trace",
            str(tmp_path / "t.json"),
            "--plot",
            str(tmp_path / "r.png"),
            "--csv",
            "--by",
            "module",
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0].startswith("module,calls,time_s")
    assert json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    assert (tmp_path / "r.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_strict_fails_when_anything_falls_back(h100_file):
    env = {k: v for k, v in os.environ.items() if not k.startswith("CASTCORE_")}
    command = [
        sys.executable,
        "-m",
        "castcore",
        "estimate",
        "--model",
        "tests.factories.tiny_mlp:with_custom_op",
        "--no-packs",
        "--device-file",
        str(h100_file),
    ]
    root = h100_file.parents[2]
    relaxed = subprocess.run(command, capture_output=True, text=True, env=env, cwd=root)
    assert relaxed.returncode == 0, relaxed.stderr
    assert "castcore_factories::mystery" in relaxed.stdout
    strict = subprocess.run([*command, "--strict"], capture_output=True, text=True, env=env, cwd=root)
    assert strict.returncode == 1
    assert "--strict is on: castcore_factories::mystery" in strict.stderr


def test_memory_warns_when_the_model_does_not_fit(session):
    workload = build(build_workload("llama-3-70b", seq=8))
    report = session.estimate(workload.model, kwargs=workload.kwargs)
    assert report.memory.weight_bytes == sum(p.numel() * 2 for p in workload.model.parameters()) + sum(
        b.numel() * b.element_size() for b in workload.model.buffers()
    )
    assert not report.memory.fits(report.device)
    assert "does not fit" in report.format_table()


def test_json_never_prints_infinity(session, tmp_path, h100_file, capsys):
    (tmp_path / "huge.py").write_text(
        "import torch\nimport castcore\n\n"
        "@castcore.register_op_estimator(torch.ops.aten.mm.default)\n"
        "def mm(invoke, device):\n    return 1e308\n",
        encoding="utf-8",
    )
    from castcore.cli.main import main

    argv = [
        "estimate",
        "--json",
        "--model",
        "tests/data/tiny-llama.json",
        "--seq",
        "8",
        "--no-packs",
        "--device-file",
        str(h100_file),
        "--custom-op-dir",
        str(tmp_path),
    ]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and "overflow to infinity" in err and "aten::mm" in err
