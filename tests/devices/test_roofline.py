"""The roofline turns work and bytes into time exactly as the formula in docs/estimates.md says."""

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


def test_float32_products_run_as_tf32_when_torch_allows_it(session, h100_file, simple_profile):
    """torch.set_float32_matmul_precision("high") (what allow_tf32 = True sets) at capture time: float32 products
    are priced at the profile's tf32 rate; torch's default ("highest") keeps them float32."""
    a = torch.empty(4096, 4096, dtype=torch.float32, device="meta")
    h100 = castcore.load_device_file(h100_file)
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("high")
        tf32 = session.estimate(torch.mm, a, a, device=h100).records[0]
        no_tf32_rate = session.estimate(torch.mm, a, a, device=simple_profile).records[0]
    finally:
        torch.set_float32_matmul_precision(before)
    fp32 = session.estimate(torch.mm, a, a, device=h100).records[0]
    assert tf32.invoke.attrs["float32_matmul_precision"] == "high"
    assert "float32_matmul_precision" not in fp32.invoke.attrs
    assert tf32.estimate.detail["rates"] == {"mma:tf32": "tf32"}
    assert tf32.flops == fp32.flops
    assert fp32.estimate.time_s > 5 * tf32.estimate.time_s  # 494.7 TFLOP/s tensor cores, 66.9 CUDA cores
    # A device without a tf32 rate runs the product as float32.
    assert no_tf32_rate.estimate.detail["rates"] == {"mma:tf32": "float32"}
    assert no_tf32_rate.estimate.time_s == pytest.approx(2 * 4096**3 / (25e12 * 0.5) + 4e-6)


def test_dtype_tf32_captures_with_tf32_products_and_restores_the_setting(session, tiny_llama):
    report = session.estimate(castcore.build_workload(str(tiny_llama), seq=16, dtype="tf32"))
    mm = [r for r in report.records if r.invoke.name == "aten::mm"]
    assert mm and all(r.estimate.detail["rates"] == {"mma:tf32": "tf32"} for r in mm)
    assert all(a.dtype == torch.float32 for a in mm[0].invoke.inputs())
    assert torch.get_float32_matmul_precision() == "highest"
    assert "tf32" in report.description
