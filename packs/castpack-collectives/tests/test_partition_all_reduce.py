"""castcore.partition with this pack installed: a `+` split's all_reduce is timed by the pack."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import castcore

H100 = Path(__file__).parents[3] / "tests" / "data" / "h100-sxm.toml"


@castcore.register_op("m k+, k+ n -> m n", name="collectives_test::matmul")
def matmul(a, b):
    return a @ b


def test_sum_split_all_reduce_is_estimated_by_the_collectives_pack():
    session = castcore.Session(load_packs=["collectives"], device_files=[H100])
    a = torch.empty(4096, 4096, dtype=torch.bfloat16, device="meta")
    plan = castcore.partition(matmul, a, a, ways=8, session=session)
    k = next(s for s in plan.splits if s.dim == "k")
    assert k.collective.time_s > 0
    assert "castpack-collectives" in str(k.collective.estimate.source)
    assert k.time_s == pytest.approx(k.estimate.time_s + k.collective.time_s)
