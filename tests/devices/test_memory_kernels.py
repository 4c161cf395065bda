"""A profile's [memory_kernels] table: checked as one line naming the key, each family's bandwidth fraction,
floor and ramp pricing real torch calls as docs/devices.md says, and a profile without it priced as before."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import castcore
from castcore.devices.memory_kernels import MEMORY_FAMILIES, memory_family

BASE = """
name = "membound"
vendor = "test"
memory_bytes = 64e9
memory_bandwidth = 1e12
memory_efficiency = 0.8
gp_op_cost_s = 2e-6
{ramp}
[mma_flops]
bfloat16 = 100e12
[gp_flops]
bfloat16 = 10e12
float32 = 5e12
{table}
[sources]
mma_flops = "test value"
gp_flops = "test value"
memory_bytes = "test value"
memory_bandwidth = "test value"
memory_efficiency = "test value"
gp_op_cost_s = "test value"
memory_half_bytes = "test value"
{source}
"""
RMS = """[memory_kernels]
rms_norm = {efficiency = 0.5, floor_s = 9e-6}
"""


def _profile(tmp_path, table: str = "", source: str = 'memory_kernels = "test fit"', ramp: str = ""):
    path = tmp_path / "membound.toml"
    path.write_text(BASE.format(table=table, source=source if table else "", ramp=ramp))
    return castcore.load_device_file(path)


def _rms(rows: int, hidden: int = 4096):
    x = torch.empty(rows, hidden, dtype=torch.bfloat16, device="meta")
    weight = torch.empty(hidden, dtype=torch.bfloat16, device="meta")
    return (lambda x, w: F.rms_norm(x, (hidden,), w, eps=1e-6)), x, weight, 2 * (2 * rows * hidden + hidden)


def _time(device, fn, *inputs) -> float:
    session = castcore.Session(load_packs=[])
    (record,) = session.estimate(fn, *inputs, device=device).records
    return record.estimate.time_s


@pytest.mark.parametrize(
    ("table", "source", "culprit"),
    [
        (
            "[memory_kernels]\nrms_norm = {efficiency = 1.5}\n",
            None,
            "'memory_kernels.rms_norm.efficiency' = 1.5",
        ),
        (
            "[memory_kernels]\nrms_norm = {floor_s = -1e-6}\n",
            None,
            "'memory_kernels.rms_norm.floor_s' = -1e-06",
        ),
        (
            "[memory_kernels]\nrms_norm = {floor = 1e-6}\n",
            None,
            "'memory_kernels.rms_norm' has unknown field(s) floor",
        ),
        (
            "[memory_kernels]\nrmsnorm = {efficiency = 0.5}\n",
            None,
            "'memory_kernels.rmsnorm' is not a memory-bound",
        ),
        ("[memory_kernels]\nrms_norm = 0.5\n", None, "'memory_kernels.rms_norm' must be a table"),
        (RMS, 'l2_bytes = "unused"', "no source for memory_kernels.rms_norm"),
    ],
)
def test_a_bad_table_is_one_line_naming_the_key(tmp_path, table, source, culprit):
    with pytest.raises(castcore.DeviceError) as caught:
        _profile(tmp_path, table, source or 'memory_kernels = "test fit"')
    assert culprit in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_table_that_is_not_one_is_named(tmp_path):
    with pytest.raises(castcore.DeviceError, match="'memory_kernels' must be a table of family"):
        _profile(tmp_path, "[error_bands]\n", ramp="memory_kernels = 3")


def test_a_family_prices_a_torch_call_at_its_own_fraction_and_floor(tmp_path):
    device = _profile(tmp_path, RMS)  # no ramp: the family's per-call cost is added, as gp_op_cost_s would be
    for rows in (1, 8192):
        fn, x, weight, moved = _rms(rows)
        assert _time(device, fn, x, weight) == pytest.approx(moved / (1e12 * 0.5) + 9e-6)


def test_with_a_ramp_the_floor_is_a_floor_and_the_family_ramp_replaces_the_device_one(tmp_path):
    table = "[memory_kernels]\nrms_norm = {efficiency = 0.5, floor_s = 9e-6, half_bytes = 4e6}\n"
    device = _profile(tmp_path, table, ramp="memory_half_bytes = 1e6")
    fn, x, weight, moved = _rms(8192)
    assert _time(device, fn, x, weight) == pytest.approx((moved + 4e6) / 0.5e12)
    fn, x, weight, moved = _rms(1)
    assert (moved + 4e6) / 0.5e12 < 9e-6
    assert _time(device, fn, x, weight) == pytest.approx(9e-6)
    # an op of a family the table leaves out keeps the device-wide fraction, ramp and floor
    y = torch.empty(1 << 20, dtype=torch.float32, device="meta")
    assert _time(device, torch.add, y, y) == pytest.approx((3 * 4 * (1 << 20) + 1e6) / 0.8e12)


def test_a_profile_without_the_table_prices_as_before(tmp_path):
    device = _profile(tmp_path)
    assert not device.memory_kernels
    fn, x, weight, moved = _rms(8192)
    assert _time(device, fn, x, weight) == pytest.approx(moved / 0.8e12 + 2e-6)


def test_every_family_names_ops_and_ops_map_to_one_family():
    assert memory_family("aten::add.Tensor") == "residual_add"
    assert memory_family("castcore::silu_and_mul") == "activation"
    assert memory_family("aten::index_put_") == "kv_cache_write"
    assert memory_family("aten::mm") == ""
    assert {"rms_norm", "rotary", "embedding", "quantize", "sampling"} <= set(MEMORY_FAMILIES)
