"""castcore sweep --backend ray on a local Ray instance of 2 CPUs gives the local backend's rows (but ``seconds``),
a dying worker's points included; an unreachable cluster is one line naming its address."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import castcore

ROOT = Path(__file__).parents[2]
DATA = ROOT / "tests" / "data"
H100, A100 = str(DATA / "h100-sxm.toml"), str(DATA / "a100-sxm-80gb.toml")


def _without_seconds(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if k != "seconds"} for row in rows]


@pytest.fixture
def local_ray(tmp_path, monkeypatch):
    """A local Ray instance of 2 CPUs whose workers see this test's cache folder and death log."""
    import ray  # nox -s tests installs it; imported here so the sessions that deselect this file need not

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("CASTCORE_TEST_DEATHS", str(tmp_path / "deaths.txt"))
    monkeypatch.chdir(ROOT)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    yield tmp_path
    ray.shutdown()


def test_ray_and_local_rows_are_identical(local_ray):
    grid = {
        "command": "estimate",
        "model": [str(DATA / "tiny-llama.json"), "tests.factories.dying:make"],
        "dtype": "fp32",
        "device": ["h100-sxm", "a100-sxm-80gb"],
        "batch": [2, 3],
        "tp": 1,
        "seq": 16,
        "device_file": [H100, A100],
        "no_packs": True,
    }
    local = castcore.sweep(grid, workers=2, out=local_ray / "local.jsonl")
    deaths_local = (local_ray / "deaths.txt").read_text().splitlines()
    on_ray = castcore.sweep(grid, backend="ray", out=local_ray / "ray.jsonl")
    assert len(local) == 8 and _without_seconds(on_ray) == _without_seconds(local)
    lines = [json.loads(line) for line in (local_ray / "ray.jsonl").read_text().splitlines()]
    assert _without_seconds(lines) == _without_seconds(local)
    failed = [(r["model"], r["batch"], r["device"]) for r in local if r["error"]]
    assert failed == [
        ("tests.factories.dying:make", 3, "h100-sxm"),
        ("tests.factories.dying:make", 3, "a100-sxm-80gb"),
    ]
    # Ray's own retry is off: castcore retries each point of a dead worker once, on both backends.
    assert len(deaths_local) == 3 and len((local_ray / "deaths.txt").read_text().splitlines()) == 6
    assert all(r["time_s"] > 0 for r in local if not r["error"])


def test_an_unreachable_cluster_is_one_line_naming_its_address(tmp_path):
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    spec = tmp_path / "spec.toml"
    spec.write_text(
        f'command = "estimate"\nmodel = "{DATA / "tiny-llama.json"}"\ndevice_file = "{H100}"\n'
        "no_packs = true\n"
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "castcore",
            "sweep",
            str(spec),
            "--out",
            str(tmp_path / "rows.csv"),
            "--backend",
            "ray",
            "--ray-address",
            f"127.0.0.1:{port}",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "XDG_CACHE_HOME": str(tmp_path)},
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"castcore: error: cannot reach the Ray cluster at 127.0.0.1:{port}: Connection refused; check "
        "--ray-address (or RAY_ADDRESS), or drop it for a local Ray instance"
    ]
    assert not (tmp_path / "rows.csv").exists()


def test_simulate_points_on_ray_give_the_local_rows(local_ray):
    grid = {
        "command": "simulate",
        "model": str(DATA / "tiny-llama.json"),
        "device": "h100-sxm",
        "device_file": H100,
        "no_packs": True,
        "requests": 20,
        "input": "uniform:16:64",
        "output": "8",
        "rate": [20.0, 40.0],
        "tp": [1, 2],
    }
    local = castcore.sweep(grid, workers=2)
    on_ray = castcore.sweep(grid, backend="ray")
    assert len(local) == 4 and not any(r["error"] for r in local)
    assert _without_seconds(on_ray) == _without_seconds(local)
    assert all(r["completed"] == 20 and r["p99_ttft_ms"] > 0 for r in on_ray)
