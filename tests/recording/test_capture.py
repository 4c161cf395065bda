"""Capture records real torch operators, including torch.library custom ops, and explains failures."""

from __future__ import annotations

import pytest
import torch

import castcore
from castcore.plugins.claims import Claim, ClaimTable


@torch.library.custom_op("castcore_test::scale_rows", mutates_args=())
def scale_rows(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * w[:, None]


@scale_rows.register_fake
def _(x, w):
    return torch.empty_like(x)


@torch.library.custom_op("castcore_test::no_fake", mutates_args=())
def no_fake(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


def test_custom_op_with_fake_impl_is_one_opaque_op(session):
    x = torch.empty(8, 16, device="meta")
    w = torch.empty(8, device="meta")
    report = session.estimate(lambda a, b: scale_rows(a, b) + 1, x, w)
    names = [r.invoke.name for r in report.records]
    assert names == ["castcore_test::scale_rows", "aten::add.Tensor"]
    custom = report.records[0]
    assert custom.invoke.outputs()[0].shape == (8, 16)
    assert custom.estimate.fallback  # nobody claims it: memory-only, and marked so


def test_custom_op_without_fake_impl_names_the_op_and_both_fixes(session):
    with pytest.raises(castcore.CaptureError) as info:
        session.estimate(no_fake, torch.empty(4, device="meta"))
    message = str(info.value)
    assert "castcore_test::no_fake" in message
    assert "torch.library.register_fake('castcore_test::no_fake')" in message
    assert "castcore.register_op" in message


def test_data_dependent_shapes_are_a_clear_error(session):
    with pytest.raises(castcore.CaptureError, match="needs tensor values"):
        session.estimate(torch.nonzero, torch.empty(16, device="meta"))


def test_module_attribution_names_the_innermost_module(session):
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
    report = session.estimate(model, torch.empty(2, 8, device="meta"))
    modules = {r.invoke.name: r.invoke.module for r in report.records}
    assert modules["aten::addmm"] == "Sequential.0"
    assert modules["aten::relu"] == "Sequential.1"


def test_identical_calls_are_resolved_once(session):
    calls = []

    def count(invoke, device):
        calls.append(invoke.index)
        return castcore.PerformanceProperties(memory_read_bytes=1)

    table = ClaimTable([Claim(torch.ops.aten.relu.default, "properties", count, None, False, "test")])
    session.plugins.pm.register(table, name="test-table")
    x = torch.empty(4, 4, device="meta")
    session.estimate(lambda t: [torch.relu(t) for _ in range(5)], x)
    assert len(calls) == 1
