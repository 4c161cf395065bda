"""A real torch.distributed program under a fake process group, captured and estimated through castcore."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fc
from torch.testing._internal.distributed.fake_pg import FakeStore

import castcore
from castcore import EstimatorError, OpInvoke, TensorMeta

WORLD = 8
DEVICE = "collectives-test"

PROFILE = """
name = "{name}"
vendor = "test"
memory_bytes = 1e10
memory_bandwidth = 1e12
comm_op_cost_s = 1e-5

[mma_flops]
float32 = 1e14

[gp_flops]
float32 = 1e13
{interconnect}
[sources]
memory_bytes = "test value"
memory_bandwidth = "test value"
comm_op_cost_s = "test value"
mma_flops = "test value"
gp_flops = "test value"
interconnect = "test value"
"""

LEVELS = """
[[interconnect]]
name = "board"
devices = 8
bandwidth = 1e11
latency_s = 1e-6
efficiency = 0.5

[[interconnect]]
name = "net"
devices = 64
bandwidth = 1e10
latency_s = 1e-5
"""


@pytest.fixture
def world():
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=WORLD)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


@pytest.fixture
def session(tmp_path):
    path = tmp_path / "device.toml"
    path.write_text(PROFILE.format(name=DEVICE, interconnect=LEVELS), encoding="utf-8")
    return castcore.Session(load_packs=["collectives"], device_files=[path])


def rows(report, name):
    return [r for r in report.records if r.invoke.name == name]


def test_collectives_are_timed_by_the_ring_formula(world, session):
    def step(t):
        reduced = fc.all_reduce(t, "sum", world)
        gathered = fc.all_gather_single(t, 0, world)
        scattered = fc.reduce_scatter_single(t, "sum", 0, world)
        return reduced + 1, gathered + 1, scattered + 1

    captured = castcore.capture(step, torch.empty(2000, 1000, device="meta"))  # 8e6 bytes of float32
    report = session.estimate_capture(captured, device=DEVICE)

    (all_reduce,) = rows(report, "_c10d_functional::all_reduce")
    assert all_reduce.invoke.attrs["group_size"] == WORLD
    # 14 steps * 1 us + 2*(7/8)*8e6 B / (1e11 B/s * 0.5) + 10 us
    assert all_reduce.estimate.time_s == pytest.approx(14e-6 + 14e6 / 5e10 + 1e-5)
    assert all_reduce.estimate.bound == "comm"
    assert all_reduce.estimate.source.plugin.startswith("castpack-collectives")
    assert all_reduce.estimate.detail == {"algorithm": "ring", "level": "board", "group_size": WORLD,
                                          "bytes_moved": 14e6, "steps": 14}

    (gather,) = rows(report, "_c10d_functional::all_gather_into_tensor")
    # S is the gathered output, 8 * 8e6 B: 7 us + (7/8)*64e6 B / 5e10 B/s + 10 us
    assert gather.estimate.time_s == pytest.approx(7e-6 + 56e6 / 5e10 + 1e-5)

    (scatter,) = rows(report, "_c10d_functional::reduce_scatter_tensor")
    # S is the input, 8e6 B: 7 us + (7/8)*8e6 B / 5e10 B/s + 10 us
    assert scatter.estimate.time_s == pytest.approx(7e-6 + 7e6 / 5e10 + 1e-5)

    waits = rows(report, "_c10d_functional::wait_tensor")
    assert len(waits) == 3 and all(w.estimate.time_s == 0.0 for w in waits)
    assert all(w.estimate.source.plugin.startswith("castpack-collectives") for w in waits)


def test_subgroup_size_comes_from_the_process_group(world, session):
    pair = dist.new_group(ranks=[0, 1])
    captured = castcore.capture(lambda t: fc.all_reduce(t, "sum", pair), torch.empty(2000, 1000, device="meta"))
    (row,) = rows(session.estimate_capture(captured, device=DEVICE), "_c10d_functional::all_reduce")
    assert row.invoke.attrs["group_size"] == 2
    assert row.estimate.time_s == pytest.approx(2e-6 + 8e6 / 5e10 + 1e-5)


def test_without_attrs_the_op_argument_gives_the_group_size(session):
    # As if captured where the group could not be resolved: only the op's own group_size is left.
    invoke = OpInvoke(op=torch.ops._c10d_functional.all_gather_into_tensor.default,
                      args=(TensorMeta((1000, 1000), torch.float32), 16, "gone"),
                      out=TensorMeta((16000, 1000), torch.float32), attrs={"group_name": "gone"})
    estimate = session.resolver.estimate(invoke, session.device(DEVICE))
    # 16 > 8: the "net" level; 15 steps * 10 us + (15/16)*64e6 B / 1e10 B/s + 10 us
    assert estimate.detail["level"] == "net" and estimate.detail["group_size"] == 16
    assert estimate.time_s == pytest.approx(150e-6 + 60e6 / 1e10 + 1e-5)


def test_all_reduce_without_a_known_group_is_reported_by_name(session):
    invoke = OpInvoke(op=torch.ops._c10d_functional.all_reduce.default,
                      args=(TensorMeta((10,), torch.float32), "sum", "gone"),
                      out=TensorMeta((10,), torch.float32), attrs={"group_name": "gone"})
    with pytest.raises(EstimatorError, match="castpack-collectives.*process group 'gone' unknown"):
        session.resolver.estimate(invoke, session.device(DEVICE))


def test_device_without_interconnect_names_the_fix(world, tmp_path):
    path = tmp_path / "lonely.toml"
    path.write_text(PROFILE.format(name="lonely", interconnect=""), encoding="utf-8")
    session = castcore.Session(load_packs=["collectives"], device_files=[path])
    captured = castcore.capture(lambda t: fc.all_reduce(t, "sum", world), torch.empty(4, device="meta"))
    with pytest.raises(EstimatorError, match=r"device 'lonely' has no interconnect.*add \[\[interconnect\]\]"):
        session.estimate_capture(captured, device="lonely")
