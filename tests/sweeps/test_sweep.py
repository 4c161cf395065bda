"""castcore sweep on real captures of tiny models: rows equal what estimate and serve give, captures made once per
workload and reused across devices and sweeps (from disk), a dying worker costs only its points, --resume, the
Pareto picture."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import castcore
from castcore.report.output_files import pareto

ROOT = Path(__file__).parents[2]
DATA = ROOT / "tests" / "data"
LLAMA, MIXTRAL = str(DATA / "tiny-llama.json"), str(DATA / "tiny-mixtral.json")
H100, A100 = str(DATA / "h100-sxm.toml"), str(DATA / "a100-sxm-80gb.toml")


def slow_variant(folder: Path) -> str:
    """The H100 profile at half its efficiencies and twice its per-op costs: another device that shares every
    capture with it."""
    text = (DATA / "h100-sxm.toml").read_text().replace('name = "h100-sxm"', 'name = "h100-sxm-slow"')
    for before, after in (
        ("compute_efficiency = 0.78", "compute_efficiency = 0.39"),
        ("memory_efficiency = 0.85", "memory_efficiency = 0.425"),
        ("mma_op_cost_s = 5e-6", "mma_op_cost_s = 1e-5"),
        ("gp_op_cost_s = 4e-6", "gp_op_cost_s = 8e-6"),
    ):
        assert before in text
        text = text.replace(before, after)
    path = folder / "h100-slow.toml"
    path.write_text(text)
    return str(path)


def write_spec(path: Path, **keys) -> Path:
    path.write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in keys.items()))  # JSON values are TOML here
    return path


def sweep_cli(*argv: str, cache: Path, **env: str) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, "-m", "castcore", "sweep", *argv],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "XDG_CACHE_HOME": str(cache), **env},
    )
    assert done.returncode == 0, done.stderr
    return done


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def session(*files: str) -> castcore.Session:
    return castcore.Session(load_packs=[], device_files=list(files))


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    """One estimate sweep over two models, two devices (one an efficiency variant), two batches, two --tp."""
    folder = tmp_path_factory.mktemp("sweep")
    variant = slow_variant(folder)
    spec = write_spec(
        folder / "spec.toml",
        command="estimate",
        model=[LLAMA, MIXTRAL],
        device=["h100-sxm", "h100-sxm-slow"],
        batch=[1, 2],
        tp=[1, 2],
        seq=32,
        device_file=[H100, variant],
        no_packs=True,
    )
    out, png, cache = folder / "rows.parquet", folder / "pareto.png", folder / "cache"
    done = sweep_cli(str(spec), "--out", str(out), "--workers", "2", "--plot", str(png), cache=cache)
    import pyarrow.parquet as pq

    return {
        "folder": folder,
        "variant": variant,
        "spec": spec,
        "rows": pq.read_table(out).to_pylist(),
        "stderr": done.stderr,
        "png": png,
        "cache": cache,
    }


def test_every_point_has_a_row_in_grid_order_with_its_parameters(grid):
    rows = grid["rows"]
    assert len(rows) == 16
    assert [(r["model"], r["device"], r["batch"], r["tp"]) for r in rows[:3]] == [
        (LLAMA, "h100-sxm", 1, 1),
        (LLAMA, "h100-sxm", 1, 2),
        (LLAMA, "h100-sxm", 2, 1),
    ]
    assert all(r["error"] is None and r["seq"] == 32 and r["phase"] == "prefill" and r["fits"] for r in rows)
    assert all(r["seconds"] > 0 for r in rows)
    first = list(rows[0])
    assert first[:2] == ["model", "batch"] and first[-2:] == ["error", "seconds"]
    assert {"time_s", "flops", "bytes", "peak_bytes", "fallback_ops", "tokens_per_s_per_device"} <= set(first)


def test_a_capture_is_made_once_for_every_device_that_shares_it(grid):
    assert "captures: 8 made, 8 reused in this sweep, 0 from the cache (50% hits)" in grid["stderr"]
    rows = grid["rows"]
    pairs = [
        (
            r,
            next(
                s
                for s in rows
                if s["device"] == "h100-sxm-slow"
                and (s["model"], s["batch"], s["tp"]) == (r["model"], r["batch"], r["tp"])
            ),
        )
        for r in rows
        if r["device"] == "h100-sxm"
    ]
    assert len(pairs) == 8
    for fast, slow in pairs:
        assert fast["flops"] == slow["flops"] and fast["calls"] == slow["calls"]
        assert slow["time_s"] > 1.5 * fast["time_s"]


def test_rows_hold_what_castcore_estimate_gives(grid):
    s = session(H100, grid["variant"])
    for row in grid["rows"][::5]:
        workload = castcore.build_workload(row["model"], batch=row["batch"], tp=row["tp"], seq=32)
        report = s.estimate(workload, device=row["device"])
        assert row["time_s"] == report.time_s and row["flops"] == report.flops
        assert row["peak_bytes"] == report.memory.peak_bytes and row["calls"] == len(report.records)
        assert row["tokens_per_s_per_device"] == pytest.approx(row["batch"] * 32 / report.time_s / row["tp"])


def test_a_second_sweep_over_new_devices_captures_nothing(grid):
    spec = write_spec(
        grid["folder"] / "a100.toml",
        command="estimate",
        model=[LLAMA, MIXTRAL],
        device="a100-sxm-80gb",
        batch=[1, 2],
        tp=[1, 2],
        seq=32,
        device_file=[A100],
        no_packs=True,
    )
    out = grid["folder"] / "a100.jsonl"
    done = sweep_cli(str(spec), "--out", str(out), "--workers", "2", cache=grid["cache"])
    assert "captures: 0 made, 0 reused in this sweep, 8 from the cache (100% hits)" in done.stderr
    rows = read_jsonl(out)
    s = session(A100)
    for row in rows:
        report = s.estimate(
            castcore.build_workload(row["model"], batch=row["batch"], tp=row["tp"], seq=32),
            device="a100-sxm-80gb",
        )
        assert (row["time_s"], row["peak_bytes"]) == (report.time_s, report.memory.peak_bytes)
    info = subprocess.run(
        [sys.executable, "-m", "castcore", "cache", "info", "--json"],
        capture_output=True,
        text=True,
        env={**os.environ, "XDG_CACHE_HOME": str(grid["cache"])},
    )
    assert json.loads(info.stdout)["captures"] == 8


def test_the_pareto_picture(grid):
    assert grid["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "points, " in grid["stderr"] and "on the Pareto front" in grid["stderr"]
    # throughput up, latency down: (10, 1) beats (5, 2) and (10, 3); (20, 4) is the fastest, so it stays.
    assert sorted(pareto([(10.0, 1.0), (5.0, 2.0), (20.0, 4.0), (10.0, 3.0)])) == [0, 2]


def test_a_dying_worker_costs_only_its_points(grid):
    deaths = grid["folder"] / "deaths.txt"
    spec = write_spec(
        grid["folder"] / "dying.toml",
        command="estimate",
        model="tests.factories.dying:make",
        dtype="fp32",
        device=["h100-sxm", "h100-sxm-slow"],
        batch=[1, 2, 3, 4],
        device_file=[H100, grid["variant"]],
        no_packs=True,
    )
    out = grid["folder"] / "dying.csv"
    done = sweep_cli(
        str(spec), "--out", str(out), "--workers", "2", cache=grid["cache"], CASTCORE_TEST_DEATHS=str(deaths)
    )
    import csv

    rows = list(csv.DictReader(out.open()))
    failed = [(r["batch"], r["device"]) for r in rows if r["error"]]
    assert failed == [("3", "h100-sxm"), ("3", "h100-sxm-slow")]
    assert all("died" in r["error"] and "retried on its own" in r["error"] for r in rows if r["error"])
    assert all(r["fits"] == "True" for r in rows if not r["error"])
    # The group of both batch-3 points died once together; each was then retried alone and died again.
    assert len(deaths.read_text().splitlines()) == 3
    assert (
        "a worker died (exit code 17): 2 unfinished point(s) retried on their own, 0 marked failed"
        in done.stderr
    )


def test_resume_runs_only_the_points_not_in_the_file(grid, tmp_path):
    common = {"command": "estimate", "model": LLAMA, "seq": 32, "device_file": [H100], "no_packs": True}
    out = tmp_path / "rows.jsonl"
    sweep_cli(
        str(write_spec(tmp_path / "part.toml", **common, batch=[1, 2])),
        "--out",
        str(out),
        "--workers",
        "1",
        cache=grid["cache"],
    )
    earlier = read_jsonl(out)
    # An interrupted run leaves its rows in the journal beside the output: batch 2's row only, say.
    out.unlink()
    (tmp_path / ".rows.jsonl.rows.jsonl").write_text(json.dumps(earlier[1]) + "\n")
    done = sweep_cli(
        str(write_spec(tmp_path / "full.toml", **common, batch=[1, 2, 4])),
        "--out",
        str(out),
        "--resume",
        "--workers",
        "1",
        cache=grid["cache"],
    )
    assert "2 points run" in done.stderr and "1 resumed" in done.stderr
    rows = read_jsonl(out)
    assert [r["batch"] for r in rows] == [1, 2, 4] and rows[1] == earlier[1]  # kept as it was, seconds too
    assert not (tmp_path / ".rows.jsonl.rows.jsonl").exists()
    again = sweep_cli(str(tmp_path / "full.toml"), "--out", str(out), "--resume", cache=grid["cache"])
    assert "0 points run" in again.stderr and read_jsonl(out) == rows


def test_serve_rows_hold_what_castcore_serve_gives(tmp_path):
    rows = castcore.sweep(
        {
            "command": "serve",
            "model": LLAMA,
            "input": 32,
            "output": [8, 16],
            "batch": [1, 4],
            "device_file": H100,
            "no_packs": True,
        },
        workers=2,
        out=tmp_path / "serve.csv",
    )
    assert len(rows) == 4 and not any(r["error"] for r in rows)
    s = session(H100)
    for row in rows:
        report = s.serve(
            LLAMA, input_tokens=32, output_tokens=row["output"], batch=row["batch"], device="h100-sxm"
        )
        figures = report.to_dict()
        for key in ("ttft_s", "tpot_s", "latency_s", "output_tokens_per_s_per_device", "peak_bytes", "fits"):
            assert row[key] == figures[key], key
        assert row["served_batch"] == row["batch"] and row["prefill_flops"] == report.prefill.flops
    assert (
        (tmp_path / "serve.csv").read_text().splitlines()[0].startswith("model,input,output,batch,max_batch")
    )


REWRITE = '''
import torch

import castcore


class Twice(torch.nn.Module):
    """The final norm run twice: another graph, so another capture."""

    def __init__(self, norm):
        super().__init__()
        self.norm = norm

    def forward(self, x):
        return self.norm(self.norm(x))


@castcore.hookimpl
def fuse_model(model, device):
    if device.name != "h100-sxm":
        return None
    model.model.norm = Twice(model.model.norm)
    return ["final norm run twice"]
'''


def test_devices_a_plugin_rewrites_the_model_for_get_their_own_capture(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    ops = tmp_path / "ops"
    ops.mkdir()
    (ops / "rewrite.py").write_text(REWRITE)
    variant = slow_variant(tmp_path)
    grid = {
        "command": "estimate",
        "model": LLAMA,
        "device": ["h100-sxm", "h100-sxm-slow", "a100-sxm-80gb"],
        "batch": [1, 2],
        "seq": 16,
        "device_file": [H100, variant, A100],
        "custom_op_dir": str(ops),
        "no_packs": True,
    }
    rows = castcore.sweep(grid, workers=2)
    s = castcore.Session(load_packs=[], device_files=[H100, variant, A100], custom_op_dirs=[ops])
    for row in rows:
        report = s.estimate(castcore.build_workload(LLAMA, batch=row["batch"], seq=16), device=row["device"])
        assert (row["time_s"], row["calls"]) == (report.time_s, len(report.records)), row["device"]
    calls = {row["device"]: row["calls"] for row in rows if row["batch"] == 1}
    assert calls["h100-sxm"] > calls["h100-sxm-slow"] == calls["a100-sxm-80gb"]
    from castcore.sweeps import store

    # Two captures a batch (h100-sxm's, and the one the others share); a rewrite probed once per device.
    assert (store.info().captures, store.info().fused) == (4, 3)


@pytest.mark.parametrize(
    "foreign, said",
    [
        ("name,score\nalice,3\n", "holds rows of another sweep (no column model, input"),
        (
            None,
            "holds rows of another sweep (no column input",
        ),  # an estimate sweep's rows, resumed by a serve spec
    ],
)
def test_resume_refuses_rows_of_another_sweep(tmp_path, foreign, said):
    out = tmp_path / "rows.csv"
    if foreign is None:
        castcore.sweep(
            {"command": "estimate", "model": LLAMA, "seq": 16, "device_file": [H100], "no_packs": True},
            out=out,
            workers=1,
        )
    else:
        out.write_text(foreign)
    before = out.read_text()
    spec = write_spec(
        tmp_path / "serve.toml",
        command="serve",
        model=LLAMA,
        input=16,
        output=4,
        device_file=[H100],
        no_packs=True,
    )
    done = subprocess.run(
        [sys.executable, "-m", "castcore", "sweep", str(spec), "--out", str(out), "--resume"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "XDG_CACHE_HOME": str(tmp_path)},
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert said in done.stderr.strip().splitlines()[-1]
    assert out.read_text() == before  # untouched


def test_a_cache_home_that_is_a_file_is_one_warning_and_the_sweep_runs(tmp_path):
    home = tmp_path / "not-a-folder"
    home.write_text("")
    spec = write_spec(
        tmp_path / "s.toml",
        command="estimate",
        model=LLAMA,
        seq=16,
        batch=[1, 2],
        device_file=[H100],
        no_packs=True,
    )
    done = sweep_cli(str(spec), "--workers", "1", cache=home)
    warnings = [line for line in done.stderr.splitlines() if line.startswith("castcore: warning:")]
    assert (
        len(warnings) == 1 and "the capture cache folder" in warnings[0] and "cannot be made" in warnings[0]
    )
    assert "2 points run" in done.stderr


def test_an_unreadable_cache_entry_a_worker_finds_is_one_warning_of_the_sweep(tmp_path):
    spec = write_spec(
        tmp_path / "s.toml", command="estimate", model=LLAMA, seq=16, device_file=[H100], no_packs=True
    )
    cache = tmp_path / "cache"
    first = sweep_cli(str(spec), "--workers", "1", "--out", str(tmp_path / "a.jsonl"), cache=cache)
    (entry,) = (cache / "castcore" / "captures").glob("*.capture")
    entry.write_bytes(b"\xff\xfe cut short")
    second = sweep_cli(str(spec), "--workers", "1", "--out", str(tmp_path / "b.jsonl"), cache=cache)
    warnings = [line for line in second.stderr.splitlines() if line.startswith("castcore: warning:")]
    assert len(warnings) == 1 and f"discarded the unreadable cache entry {entry}" in warnings[0]
    strip = [{k: v for k, v in row.items() if k != "seconds"} for row in read_jsonl(tmp_path / "a.jsonl")]
    assert strip == [
        {k: v for k, v in row.items() if k != "seconds"} for row in read_jsonl(tmp_path / "b.jsonl")
    ]
    assert "warning" not in first.stderr


def test_resume_refuses_rows_another_spec_of_the_same_command_wrote(tmp_path):
    out = tmp_path / "rows.csv"
    common = {"command": "estimate", "seq": 16, "device_file": [H100], "no_packs": True}
    castcore.sweep({**common, "model": MIXTRAL}, out=out, workers=1)
    before = out.read_text()
    spec = write_spec(tmp_path / "llama.toml", **common, model=LLAMA, batch=[1, 2])
    done = subprocess.run(
        [sys.executable, "-m", "castcore", "sweep", str(spec), "--out", str(out), "--resume"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "XDG_CACHE_HOME": str(tmp_path)},
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    line = done.stderr.strip().splitlines()[-1]
    assert (
        "holds 1 row(s) that are no point of this spec (the first: model = " in line
        and "tiny-mixtral" in line
    )
    assert out.read_text() == before
