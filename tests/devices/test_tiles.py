"""Shape-aware pricing: tiles, waves and split-K for matrix products, a fused attention kernel's own efficiency,
the bandwidth ramp of small transfers, and the profile fields that hold them."""

from __future__ import annotations

import pytest
import torch

import castcore
from castcore.devices.profile import DeviceError
from castcore.devices.profile_files import device_from_dict
from castcore.devices.tiles import tiled_matmul

PEAK = 1e15


def profile(**extra) -> castcore.DeviceProfile:
    # Estimates are cached per device name: every variant gets its own.
    data = {
        "name": f"tiled-{sorted(extra.items())}",
        "vendor": "test",
        "memory_bytes": 8e10,
        "memory_bandwidth": 3e12,
        "mma_flops": {"bfloat16": PEAK},
        "gp_flops": {"bfloat16": 1e14},
        "compute_efficiency": 0.8,
        "compute_units": 4,
        "mma_unit": {"bfloat16": [16, 8, 16]},
        "mma_tile": {"bfloat16": [[128, 128, 64]]},
        **extra,
    }
    data["sources"] = {key: "test" for key in data if key not in ("name", "vendor")}
    return device_from_dict(data)


def test_a_product_that_fills_whole_waves_reaches_the_sustained_rate():
    device = profile()
    seconds, how = tiled_matmul(device, torch.bfloat16, 1, 512, 256, 4096, PEAK * 0.8)  # 4 x 2 tiles: 2 waves
    assert how["waves"] == 2 and how["split_k"] == 1
    assert seconds == pytest.approx(2 * 512 * 256 * 4096 / (PEAK * 0.8))


def test_one_tile_more_than_the_units_costs_a_second_wave():
    device = profile()
    full, _ = tiled_matmul(device, torch.bfloat16, 1, 512, 128, 4096, PEAK)  # 4 tiles, 1 wave
    more, how = tiled_matmul(device, torch.bfloat16, 1, 640, 128, 4096, PEAK)  # 5 tiles, 2 waves
    assert how["waves"] == 2 and more == pytest.approx(2 * full)


def test_padding_to_the_tile_is_paid_and_skinny_products_split_k():
    device = profile()
    # one row: one tile of 128 rows
    seconds, how = tiled_matmul(device, torch.bfloat16, 1, 1, 128, 4096, PEAK)
    assert how["split_k"] == 4 and how["tiles"] == 1
    assert seconds == pytest.approx(2 * 128 * 128 * 4096 / 4 / (PEAK / 4))
    assert how["tile_efficiency"] == pytest.approx(1 / 128)


def test_each_wave_waits_for_memory_to_fill_and_drain_and_split_k_for_its_partial_sums():
    latency = 1e-6
    device = profile(memory_latency_s=latency)
    # 2 waves of whole tiles: each adds a load before its first product and a store after its last.
    seconds, how = tiled_matmul(device, torch.bfloat16, 1, 512, 256, 4096, PEAK * 0.8)
    assert how["waves"] == 2 and how["split_k"] == 1
    assert seconds == pytest.approx(2 * 512 * 256 * 4096 / (PEAK * 0.8) + 2 * 2 * latency)
    # One tile, K split over the 4 units (64 steps -> 16 each): the partial tiles make two more round trips.
    seconds, how = tiled_matmul(device, torch.bfloat16, 1, 128, 128, 4096, PEAK)
    assert how["split_k"] == 4 and how["waves"] == 1
    assert seconds == pytest.approx(2 * 128 * 128 * 4096 / 4 / (PEAK / 4) + 4 * latency)
    # A small K leaves few steps to hide the latency in: the product runs far below the sustained rate.
    seconds, how = tiled_matmul(device, torch.bfloat16, 1, 512, 256, 64, PEAK)
    assert how["tile_efficiency"] < 0.1


def test_the_fastest_of_the_profiles_tiles_is_taken():
    device = profile(mma_tile={"bfloat16": [[128, 128, 64], [32, 32, 64]]})
    _, how = tiled_matmul(device, torch.bfloat16, 1, 64, 64, 4096, PEAK)
    assert how["tile"] == "32x32x64"


def test_estimates_use_the_tiles_for_real_torch_products():
    session = castcore.Session(load_packs=[], device_files=[])
    device = profile()
    plain = device_from_dict(
        {
            k: v
            for k, v in {
                "name": "plain",
                "vendor": "test",
                "memory_bytes": 8e10,
                "memory_bandwidth": 3e12,
                "mma_flops": {"bfloat16": PEAK},
                "gp_flops": {"bfloat16": 1e14},
                "compute_efficiency": 0.8,
            }.items()
        }
        | {
            "sources": {
                "memory_bytes": "t",
                "memory_bandwidth": "t",
                "mma_flops": "t",
                "gp_flops": "t",
                "compute_efficiency": "t",
            }
        }
    )
    a, b = torch.empty(640, 4096, dtype=torch.bfloat16), torch.empty(4096, 128, dtype=torch.bfloat16)
    tiled = session.estimate(lambda a, b: a @ b, a, b, device=device).records[0].estimate
    flat = session.estimate(lambda a, b: a @ b, a, b, device=plain).records[0].estimate
    assert tiled.detail["tiling"]["waves"] == 2
    # 5 tiles on 4 units: 8 tile-times of work 5
    assert tiled.compute_s == pytest.approx(flat.compute_s * 8 / 5)


def test_attention_runs_at_the_kernels_own_efficiency():
    session = castcore.Session(load_packs=[], device_files=[])
    q = torch.empty(1, 8, 1024, 128, dtype=torch.bfloat16)
    run = lambda q: torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
    record = session.estimate(run, q, device=profile()).records[0]
    fa = session.estimate(run, q, device=profile(attention_efficiency=0.4)).records[0].estimate
    mma = record.properties.compute_ops[torch.bfloat16].mma_ops
    assert fa.compute_s - record.estimate.compute_s == pytest.approx(mma / PEAK * (1 / 0.4 - 1 / 0.8))


def test_a_dtype_with_its_own_matrix_efficiency_runs_at_it_and_others_keep_compute_efficiency():
    session = castcore.Session(load_packs=[], device_files=[])
    a, b = torch.empty(4096, 4096, dtype=torch.bfloat16), torch.empty(4096, 4096, dtype=torch.bfloat16)
    x = torch.empty(4096, 4096)
    base = session.estimate(torch.mm, a, b, device=profile()).records[0].estimate
    own = (
        session.estimate(torch.mm, a, b, device=profile(mma_efficiency={"bfloat16": 0.4})).records[0].estimate
    )
    assert own.compute_s == pytest.approx(base.compute_s * 0.8 / 0.4)
    # A skinny (memory-bound) product streams its operands as fast as before: only the matrix work slows.
    skinny = torch.empty(4, 4096, dtype=torch.bfloat16)
    lean, slow = (
        session.estimate(torch.mm, skinny, b, device=d).records[0].estimate
        for d in (profile(), profile(mma_efficiency={"bfloat16": 0.4}))
    )
    assert slow.memory_s == pytest.approx(lean.memory_s) and slow.bound == lean.bound == "memory"
    # Another dtype's entry leaves bf16 products and vector work at compute_efficiency.
    other = profile(mma_efficiency={"float8_e4m3fn": 0.4})
    assert session.estimate(torch.mm, a, b, device=other).records[0].estimate.compute_s == pytest.approx(
        base.compute_s
    )
    assert other.efficiency("gp", "bfloat16") == 0.8 and other.efficiency("mma", "float8_e4m3fn") == 0.4
    # Fused attention in that dtype keeps the same ratio to its GEMMs: 0.6 x 0.4 / 0.8.
    fp8 = {
        "mma_flops": {"bfloat16": PEAK, "float8_e4m3fn": 2 * PEAK},
        "mma_unit": {"bfloat16": [16, 8, 16]},
        "attention_efficiency": 0.6,
    }
    q = torch.empty(1, 8, 1024, 128, dtype=torch.float8_e4m3fn)

    def attend(q):
        return torch.ops.castcore.attention(q, q, q, 0.1, True, 0, 0.0)

    plain, slower = (
        session.estimate(attend, q, device=profile(**fp8, **more)).records[0]
        for more in ({}, {"mma_efficiency": {"float8_e4m3fn": 0.4}})
    )
    mma = plain.properties.compute_ops[torch.float8_e4m3fn].mma_ops
    assert slower.estimate.compute_s - plain.estimate.compute_s == pytest.approx(
        mma / (2 * PEAK) * (1 / (0.6 * 0.4 / 0.8) - 1 / 0.6)
    )
    assert session.estimate(torch.neg, x, device=other).records[0].estimate.time_s == pytest.approx(
        session.estimate(torch.neg, x, device=profile()).records[0].estimate.time_s
    )


def test_grouped_products_run_at_the_grouped_efficiency_in_work_and_weight_streaming():
    session = castcore.Session(load_packs=[], device_files=[])
    rows, weights = (
        torch.empty(512, 1024, dtype=torch.bfloat16),
        torch.empty(8, 1024, 2048, dtype=torch.bfloat16),
    )
    offsets = torch.arange(64, 513, 64, dtype=torch.int32)

    def grouped(x, w, offs):
        return torch._grouped_mm(x, w, offs=offs)

    plain = session.estimate(grouped, rows, weights, offsets, device=profile()).records[0].estimate
    slower = (
        session.estimate(grouped, rows, weights, offsets, device=profile(grouped_mm_efficiency=0.5))
        .records[0]
        .estimate
    )
    assert (slower.compute_s, slower.memory_s) == pytest.approx((2 * plain.compute_s, 2 * plain.memory_s))
    assert slower.overhead_s == plain.overhead_s
    # A plain product on the same device is untouched.
    a, b = torch.empty(512, 1024, dtype=torch.bfloat16), torch.empty(1024, 2048, dtype=torch.bfloat16)
    assert session.estimate(
        torch.mm, a, b, device=profile(grouped_mm_efficiency=0.5)
    ).time_s == pytest.approx(session.estimate(torch.mm, a, b, device=profile()).time_s)


def test_small_transfers_pay_the_bandwidth_ramp():
    session = castcore.Session(load_packs=[], device_files=[])
    x = torch.empty(1024, dtype=torch.bfloat16)
    plain = session.estimate(torch.neg, x, device=profile()).records[0].estimate
    ramp = session.estimate(torch.neg, x, device=profile(memory_half_bytes=4096)).records[0].estimate
    assert ramp.memory_s == pytest.approx(plain.memory_s * (4096 + 4096) / 4096)
    # The measured ramp holds the launch: the per-op cost is a floor, not added on top.
    assert ramp.time_s == pytest.approx(max(ramp.memory_s, plain.overhead_s))


@pytest.mark.parametrize(
    "change,message",
    [
        ({"mma_tile": {"bfloat16": [[120, 128, 64]]}}, "not a whole number of its MMA unit"),
        ({"mma_tile": {"bfloat16": [[8, 128, 64]]}}, "tile [8, 128, 64]"),
        ({"mma_unit": {}}, "needs 'mma_unit.bfloat16'"),
        ({"compute_units": 0}, "'compute_units' = 0"),
        ({"mma_tile": {"bfloat16": [128, 128]}}, "must be [m, n, k]"),
        ({"attention_efficiency": 1.5}, "'attention_efficiency' = 1.5 must be in (0, 1]"),
        (
            {"mma_efficiency": {"bfloat16": 1.2}},
            "'mma_efficiency.bfloat16' must name a torch dtype and be in (0, 1]",
        ),
        ({"mma_efficiency": {"fp9": 0.5}}, "'mma_efficiency.fp9' must name a torch dtype"),
        ({"mma_efficiency": 0.5}, "'mma_efficiency' must be a table of dtype"),
        ({"grouped_mm_efficiency": 2.0}, "'grouped_mm_efficiency' = 2.0 must be in (0, 1]"),
    ],
)
def test_bad_tiling_fields_are_refused_by_name(change, message):
    with pytest.raises(
        DeviceError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")
    ):
        profile(**change)


def test_a_tiling_field_without_a_source_is_refused():
    data = {
        "name": "x",
        "vendor": "t",
        "memory_bytes": 1e9,
        "memory_bandwidth": 1e12,
        "mma_flops": {"bfloat16": 1e12},
        "gp_flops": {"bfloat16": 1e11},
        "compute_units": 4,
        "sources": {"memory_bytes": "t", "memory_bandwidth": "t", "mma_flops": "t", "gp_flops": "t"},
    }
    with pytest.raises(DeviceError, match="no source for compute_units"):
        device_from_dict(data)


def test_a_profile_changed_under_the_same_name_is_estimated_afresh():
    import dataclasses

    session = castcore.Session(load_packs=[], device_files=[])
    device = profile()
    a, b = torch.empty(512, 512, dtype=torch.bfloat16), torch.empty(512, 512, dtype=torch.bfloat16)
    first = session.estimate(lambda a, b: a @ b, a, b, device=device).records[0].estimate
    faster = dataclasses.replace(device, compute_efficiency=0.4)  # same name, other numbers
    second = session.estimate(lambda a, b: a @ b, a, b, device=faster).records[0].estimate
    assert second.compute_s == pytest.approx(first.compute_s * 2)


def test_matrix_ops_keep_their_launch_cost_when_the_profile_has_a_ramp():
    session = castcore.Session(load_packs=[], device_files=[])
    device = profile(memory_half_bytes=1e7, mma_op_cost_s=5e-6)
    a = torch.empty(64, 64, dtype=torch.bfloat16)
    estimate = session.estimate(lambda a, b: a @ b, a, a, device=device).records[0].estimate
    assert estimate.overhead_s == 5e-6 and estimate.memory_s == pytest.approx(3 * a.nbytes / 3e12)
