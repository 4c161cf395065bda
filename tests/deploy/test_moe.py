"""Mixture-of-experts: a grouped matmul reads the weights of the experts its rows are expected to touch."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import castcore
from castcore.builtin.formulas.matmul import _grouped_mm, touched_experts
from castcore.deploy.pipeline import build

# 4 experts, top-2, hidden 64, ffn 96, bf16
MIXTRAL = str(Path(__file__).parents[1] / "data" / "tiny-mixtral.json")


def _grouped(**options) -> list:
    workload = build(castcore.build_workload(MIXTRAL, **options))
    captured = castcore.capture(workload.model, inputs_fn=workload.inputs_fn, **workload.kwargs)
    return [i for i in captured.invokes if i.name == "aten::_grouped_mm"]


def _weight_bytes_read(invoke) -> float:
    other = sum(t.nbytes for t in invoke.inputs()) - invoke.args[1].nbytes  # routed rows and offsets
    return _grouped_mm(invoke, None).memory_read_bytes - other


def test_touched_experts():
    assert touched_experts(4, 2) == 4 * (1 - 0.75**2) == 1.75
    assert touched_experts(8, 2) == 8 * (1 - (7 / 8) ** 2)
    assert touched_experts(4, 10_000) == pytest.approx(4)
    assert touched_experts(1, 5) == 1


def test_decode_batch_one_reads_the_touched_experts_weights():
    # One token, top-2: 2 routed rows, 4 x (1 - (3/4)^2) = 1.75 of 4 experts expected touched.
    gate_up, down = _grouped(phase="decode", kv_len=16, batch=1)[:2]
    assert gate_up.args[0].shape[0] == 2 and gate_up.args[1].shape == (4, 64, 192)
    assert _weight_bytes_read(gate_up) == 4 * 64 * 192 * 2 * 1.75 / 4 == 43008
    assert _weight_bytes_read(down) == 4 * 96 * 64 * 2 * 1.75 / 4 == 21504


def test_prefill_reads_nearly_every_expert():
    # 2 x 16 tokens, top-2: 64 routed rows; 4 x (1 - (3/4)^64) experts, all but 4e-8 of them.
    gate_up, down = _grouped(seq=16, batch=2)[:2]
    assert gate_up.args[0].shape[0] == 64
    touched = 4 * (1 - 0.75**64)
    assert _weight_bytes_read(gate_up) == pytest.approx(4 * 64 * 192 * 2 * touched / 4, rel=1e-12)
    assert _weight_bytes_read(down) == pytest.approx(4 * 96 * 64 * 2 * touched / 4, rel=1e-12)
    assert 4 * 64 * 192 * 2 - _weight_bytes_read(gate_up) < 0.01


@pytest.mark.parametrize("fuse", [True, False])
@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
def test_grouped_products_are_priced_in_every_dtype(session, dtype, fuse):
    """torch's fake grouped product takes bf16 only (as its CUDA kernel); engines' MoE kernels run fp16 and fp32."""

    def grouped(report):
        return [r for r in report.records if r.invoke.name == "aten::_grouped_mm"]

    base, other = (
        session.estimate(castcore.build_workload(MIXTRAL, seq=8, dtype=d, fuse=fuse)) for d in ("bf16", dtype)
    )
    assert len(grouped(other)) == len(grouped(base)) == 4
    for ours, theirs in zip(grouped(other), grouped(base)):
        assert ours.invoke.outputs()[0].shape == theirs.invoke.outputs()[0].shape
        assert ours.invoke.outputs()[0].dtype == ours.invoke.args[0].dtype != torch.bfloat16
        assert (
            sum(c.mma_ops for c in ours.properties.compute_ops.values())
            == sum(c.mma_ops for c in theirs.properties.compute_ops.values())
            > 0
        )
