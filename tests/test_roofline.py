"""The roofline turns work and bytes into time exactly as the README's formula says."""

from __future__ import annotations

import pytest
import torch

import castcore
import castcore.pack
from tests.factories.tiny_mlp import mystery


def test_known_mm_matches_hand_computed_time(session, simple_profile):
    m, k, n = 4096, 2048, 1024
    a = torch.empty(m, k, dtype=torch.bfloat16, device="meta")
    b = torch.empty(k, n, dtype=torch.bfloat16, device="meta")
    report = session.estimate(torch.mm, a, b, device=simple_profile)
    (record,) = report.records
    flops = 2 * m * n * k
    moved = (m * k + k * n + m * n) * 2
    compute_s = flops / (100e12 * 0.5)
    memory_s = moved / (1e12 * 0.8)
    assert compute_s > memory_s
    assert record.estimate.time_s == pytest.approx(compute_s + 4e-6, rel=1e-12)
    assert record.estimate.bound == "compute"
    assert record.estimate.source == castcore.pack.Source("core", "properties")
    assert record.flops == flops
    assert record.bytes == moved


def test_memory_bound_pointwise_uses_bandwidth_and_vector_launch_cost(session, simple_profile):
    x = torch.empty(1 << 20, dtype=torch.float32, device="meta")
    (record,) = session.estimate(torch.add, x, x, device=simple_profile).records
    moved = 3 * (1 << 20) * 4
    assert record.estimate.memory_s == pytest.approx(moved / 0.8e12)
    assert record.estimate.compute_s == pytest.approx((1 << 20) / (5e12 * 0.5))
    assert record.estimate.time_s == pytest.approx(moved / 0.8e12 + 2e-6)
    assert record.estimate.bound == "memory"


def test_views_cost_nothing_and_unknown_ops_fall_back_to_memory(session, simple_profile):
    x = torch.empty(64, 64, dtype=torch.float32, device="meta")

    def fn(t):
        return mystery(t.view(4096))  # a custom op nobody claims

    report = session.estimate(fn, x, device=simple_profile)
    by_name = {r.invoke.name: r for r in report.records}
    assert by_name["aten::view"].estimate.time_s == 0
    unclaimed = by_name["castcore_factories::mystery"].estimate
    assert unclaimed.source == castcore.pack.Source("core", "fallback")
    assert unclaimed.time_s == pytest.approx(2 * 4096 * 4 / 0.8e12 + 2e-6)
    assert report.fallback_calls == 1


def test_dtype_missing_from_profile_uses_slowest_rate_and_says_so(simple_profile):
    rate, used = simple_profile.rate("gp", torch.int64)
    assert rate == 5e12
    assert "no int64 rate" in used
