"""bench/kernels/fit_memory.py: fitted on times a known [memory_kernels] entry gives, it finds that entry again."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import castcore

ROOT = Path(__file__).parents[2]
sys.path.insert(0, str(ROOT / "bench" / "kernels"))  # benchmark code, not castcore's

import fit_memory  # noqa: E402
import gpu_measure  # noqa: E402

BASE = (ROOT / "tests" / "data" / "h100-sxm.toml").read_text()


def _device(tmp_path, name: str, table: str = "") -> Path:
    # the H100 test profile with a bandwidth ramp (so the floor is a floor), and a [memory_kernels] table
    text = BASE.replace('name = "h100-sxm"', f'name = "{name}"\nmemory_half_bytes = 2e6', 1)
    text = text.replace(
        "[sources]", f'{table}\n[sources]\nmemory_half_bytes = "test value"\nmemory_kernels = "test value"', 1
    )
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    return path


def test_the_fit_recovers_the_entry_the_times_came_from(tmp_path):
    truth = _device(
        tmp_path, "truth", "[memory_kernels]\nrms_norm = {efficiency = 0.6, floor_s = 0.0, half_bytes = 1e7}"
    )
    base = _device(tmp_path, "base")
    session = castcore.Session(load_packs=[], device_files=[truth, base])
    rows = []
    for tokens in (1, 16, 256, 4096, 32768):
        row = {
            "family": "rms_norm",
            "op": gpu_measure.OPS["rms_norm"],
            "dtype": "bfloat16",
            "tokens": tokens,
            "hidden": 4096,
        }
        fn, inputs = gpu_measure.build(row, "meta")
        rows.append(row | {"time_s": session.estimate(fn, *inputs, device="truth").time_s})
    points, bandwidth = fit_memory.calls(rows, session, "base", "time_s")
    assert [family for _, parts, _ in points for family, _, _ in parts] == ["rms_norm"] * 5
    found = fit_memory.fit(points, bandwidth)
    assert found["rms_norm"] == pytest.approx((0.6, 0.0, 1e7), abs=1e-9)
    # the base profile's own pricing is far from these times: the fit, not the starting point, matched them
    fn, inputs = gpu_measure.build(rows[-1], "meta")
    assert session.estimate(fn, *inputs, device="base").time_s < 0.8 * rows[-1]["time_s"]
    assert (
        max(abs(m / t - 1) for t, (m, _, _) in zip(fit_memory.predict(points, found, bandwidth), points))
        < 1e-6
    )
