"""A published nccl-tests point of the repository's fidelity set, estimated through this pack (the fidelity code is
benchmark code in the repository's bench/, so this runs from a checkout, as the nox session does)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "bench"))
from fidelity.collectives import in_metric  # noqa: E402
from fidelity.published import estimate_point, load_points, make_session  # noqa: E402


def test_large_all_reduce_busbw_reaches_the_link_rate():
    session = make_session(packs=("collectives",), device_files=[ROOT / "tests" / "data" / "h100-sxm.toml"])
    h100 = session.device("h100-sxm")
    (point,) = [p for p in load_points() if p["id"] == "h200x8-allreduce-ring-16gib"]
    row = estimate_point(point, session, h100)
    nvlink = h100.interconnect[0]
    # A 16 GiB ring all-reduce: busbw is the link's bandwidth x efficiency, less the fixed costs (tiny here).
    assert row["estimated"] == pytest.approx(nvlink.bandwidth * nvlink.efficiency / 1e9, rel=1e-3)
    assert row["how"]["algorithm"] == "ring"


def test_collective_figures_follow_nccl_tests_definitions():
    """The fidelity code reads nccl-tests' bus bandwidth with this pack's bus factors."""
    s, t = 2**30, 0.01  # 1 GiB in 10 ms: algbw 107.4 GB/s
    assert in_metric("algbw", "GB/s", "all_reduce", s, 8, t) == pytest.approx(s / t / 1e9)
    assert in_metric("busbw", "GB/s", "all_reduce", s, 8, t) == pytest.approx(s / t / 1e9 * 2 * 7 / 8)
    assert in_metric("busbw", "GB/s", "all_gather", s, 8, t) == pytest.approx(s / t / 1e9 * 7 / 8)
    assert in_metric("time", "us", "all_reduce", s, 8, t) == pytest.approx(1e4)
