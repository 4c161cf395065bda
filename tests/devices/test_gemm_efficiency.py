"""A GEMM's efficiency at small and medium shapes: wave quantization at the tiles' own rate under the sustained
cap, the operand-streaming rate and ramp of matrix kernels, the per-call floor; and the quantized products as
engines run them on castpack-nvidia's profiles (the fp8 activation quantize pass, NVFP4 only where FP4 runs)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import castcore
from castcore.deploy.quantize.layers import W8A8, quantize_linear
from castcore.devices.profile import DeviceError
from castcore.devices.profile_files import device_from_dict
from castcore.devices.tiles import tiled_matmul

# castpack-nvidia's profiles read as files: the core's tests run with no pack installed.
NVIDIA_PROFILES = sorted(
    (Path(__file__).parents[2] / "packs/castpack-nvidia/castpack_nvidia/profiles").glob("*.toml")
)

PEAK, BANDWIDTH = 1e15, 3e12
FP8 = torch.float8_e4m3fn


def profile(**extra) -> castcore.DeviceProfile:
    data = {
        "name": f"gemm-{sorted(extra.items())}",  # estimates are cached per device name
        "vendor": "test",
        "memory_bytes": 8e10,
        "memory_bandwidth": BANDWIDTH,
        "mma_flops": {"bfloat16": PEAK},
        "gp_flops": {"bfloat16": 1e14},
        "compute_efficiency": 0.5,
        "memory_efficiency": 0.8,
        "compute_units": 4,
        "mma_unit": {"bfloat16": [16, 8, 16]},
        "mma_tile": {"bfloat16": [[128, 128, 64]]},
        **extra,
    }
    data["sources"] = {key: "test" for key in data if key not in ("name", "vendor")}
    return device_from_dict(data)


@pytest.fixture(scope="module")
def session() -> castcore.Session:
    return castcore.Session(load_packs=[], device_files=[])


def test_tiles_step_at_their_own_rate_and_one_tile_over_a_full_wave_costs_a_second_wave():
    device = profile(mma_tile_efficiency={"bfloat16": 0.6})
    # K of one step (no split-K over idle units); a tile's work, on 4 units, each at 0.6 x PEAK / 4
    sustained, tile = PEAK * 0.5, 2 * 128 * 128 * 64
    half, how = tiled_matmul(device, torch.bfloat16, 1, 256, 128, 64, sustained)  # 2 tiles, 2 units idle
    assert how["waves"] == 1 and half == pytest.approx(tile / (PEAK * 0.6 / 4))
    # A full wave would beat the sustained rate at the tiles' rate: it is held to it (the power limit).
    full, how = tiled_matmul(device, torch.bfloat16, 1, 512, 128, 64, sustained)
    assert how["waves"] == 1 and full == pytest.approx(4 * tile / sustained)
    # One tile more: a second wave, each at the tiles' rate.
    more, how = tiled_matmul(device, torch.bfloat16, 1, 640, 128, 64, sustained)
    assert how["waves"] == 2 and more == pytest.approx(2 * half) and more > 1.5 * full
    many, how = tiled_matmul(device, torch.bfloat16, 1, 4096, 4096, 4096, sustained)
    assert how["waves"] == 256 and many == pytest.approx(2 * 4096**3 / sustained)
    # Without the field every tile steps at the sustained rate: the second wave doubles the time.
    plain_full, _ = tiled_matmul(profile(), torch.bfloat16, 1, 512, 128, 64, sustained)
    plain_more, _ = tiled_matmul(profile(), torch.bfloat16, 1, 640, 128, 64, sustained)
    assert plain_full == pytest.approx(full) and plain_more == pytest.approx(2 * full)


def test_a_gemm_streams_its_operands_at_its_own_rate_after_its_ramp(session):
    skinny = torch.empty(4, 8192, dtype=torch.bfloat16)
    weight = torch.empty(8192, 8192, dtype=torch.bfloat16)
    device = profile(mma_memory_efficiency=0.9, mma_half_bytes=1e6, mma_op_cost_s=2e-6)
    record = session.estimate(torch.mm, skinny, weight, device=device).records[0]
    moved = record.properties.memory_bytes
    assert record.estimate.bound == "memory"
    assert record.estimate.memory_s == pytest.approx((moved + 1e6) / (BANDWIDTH * 0.9))
    assert record.estimate.time_s == pytest.approx(record.estimate.memory_s + 2e-6)  # the launch is added
    # A memory-bound op that is no GEMM keeps the device-wide efficiency and no ramp.
    x = torch.empty(1 << 20, dtype=torch.bfloat16)
    neg = session.estimate(torch.neg, x, device=device).records[0].estimate
    assert neg.memory_s == pytest.approx(2 * x.nbytes / (BANDWIDTH * 0.8))


def test_no_gemm_call_takes_less_than_the_floor_and_larger_ones_are_untouched(session):
    device, plain = profile(mma_floor_s=8e-6, mma_op_cost_s=2e-6), profile(mma_op_cost_s=2e-6)
    tiny = torch.empty(64, 64, dtype=torch.bfloat16)
    small = session.estimate(torch.mm, tiny, tiny, device=device).records[0].estimate
    assert small.time_s == pytest.approx(8e-6) and small.bound == "overhead"
    assert session.estimate(torch.mm, tiny, tiny, device=plain).time_s < 8e-6
    big = torch.empty(4096, 4096, dtype=torch.bfloat16)
    assert session.estimate(torch.mm, big, big, device=device).time_s == pytest.approx(
        session.estimate(torch.mm, big, big, device=plain).time_s
    )
    # A fused attention kernel is no GEMM: its own fixed cost, not the floor.
    q = torch.empty(1, 2, 16, 64, dtype=torch.bfloat16)
    attend = lambda q: torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)  # noqa: E731
    assert session.estimate(attend, q, device=device).time_s < 8e-6


@pytest.mark.parametrize(
    "change,message",
    [
        (
            {"mma_tile_efficiency": {"bfloat16": 1.5}},
            "'mma_tile_efficiency.bfloat16' must name a torch dtype",
        ),
        ({"mma_tile_efficiency": 0.9}, "'mma_tile_efficiency' must be a table of dtype"),
        ({"mma_memory_efficiency": 1.2}, "'mma_memory_efficiency' = 1.2 must be in (0, 1]"),
        ({"mma_floor_s": -1}, "'mma_floor_s' = -1 must be a finite number >= 0"),
    ],
)
def test_bad_gemm_fields_are_refused_by_name(change, message):
    with pytest.raises(DeviceError, match=message.replace("(", r"\(").replace(")", r"\)")):
        profile(**change)


def test_a_gemm_field_without_a_source_is_refused():
    data = {
        "name": "x",
        "vendor": "t",
        "memory_bytes": 1e9,
        "memory_bandwidth": 1e12,
        "mma_flops": {"bfloat16": 1e12},
        "gp_flops": {"bfloat16": 1e11},
        "mma_tile_efficiency": {"bfloat16": 0.9},
        "sources": {"memory_bytes": "t", "memory_bandwidth": "t", "mma_flops": "t", "gp_flops": "t"},
    }
    with pytest.raises(DeviceError, match=r"no source for mma_tile_efficiency\.bfloat16"):
        device_from_dict(data)


def _fp8_linear(rows: int, columns: int, out: int) -> tuple[torch.nn.Linear, torch.Tensor]:
    """A real nn.Linear quantized as castcore's --weights fp8 deploys it (W8A8), and its input."""
    layer = torch.nn.Linear(columns, out, bias=False, dtype=torch.bfloat16)
    quantize_linear(layer, "fp8", W8A8, fused=False)
    return layer, torch.empty(rows, columns, dtype=torch.bfloat16)


@pytest.mark.parametrize("device", ["h100-sxm5-80gb", "h200-sxm"])
def test_fp8_per_tensor_linear_pays_the_activation_quantize_pass_then_the_fp8_gemm(device):
    session = castcore.Session(load_packs=[], device_files=NVIDIA_PROFILES)
    layer, x = _fp8_linear(16, 4096, 6144)
    report = session.estimate(layer, x, device=device)
    names = [r.invoke.name for r in report.records if r.estimate.time_s > 0]
    assert names == ["castcore::quantize_per_token", "aten::_scaled_mm"]
    quantize, gemm = (r for r in report.records if r.estimate.time_s > 0)
    # The quantize is a memory-bound pass over the activations: it reads them and writes codes and scales.
    assert quantize.properties.memory_read_bytes >= x.nbytes
    assert quantize.estimate.bound in ("memory", "overhead") and quantize.estimate.time_s > 0
    assert report.time_s == pytest.approx(quantize.estimate.time_s + gemm.estimate.time_s)
    # At a decode batch the fp8 layer streams half bf16's weight bytes but pays the quantize pass, the ramp
    # and the launch: faster than bf16, well short of twice as fast.
    weight = torch.empty(6144, 4096, dtype=torch.bfloat16)
    bf16 = session.estimate(torch.nn.functional.linear, x, weight, device=device)
    assert 1.0 < bf16.time_s / report.time_s < 2.0


def test_nvfp4_runs_only_where_the_profile_has_an_fp4_rate_at_its_own_efficiency():
    session = castcore.Session(load_packs=[], device_files=NVIDIA_PROFILES)
    devices = session.devices
    nvidia = [d for d in devices.values() if d.vendor == "NVIDIA"]
    fp4 = sorted(d.name for d in nvidia if "float4_e2m1fn_x2" in d.mma_flops)
    # Blackwell only: the data-center parts and the RTX PRO 6000; no Hopper, Ampere or Ada profile has FP4
    assert fp4 == ["b200", "b300", "gb200-nvl72", "gb300-nvl72", "rtx-pro-6000-server"]
    for name in fp4:
        device = devices[name]
        # NVFP4 products sustain their own (smaller) share of the doubled FP4 peak, sourced in the profile.
        assert device.efficiency("mma", "float4_e2m1fn_x2") < device.compute_efficiency
        assert "mma_efficiency" in device.sources or "mma_efficiency.float4_e2m1fn_x2" in device.sources
