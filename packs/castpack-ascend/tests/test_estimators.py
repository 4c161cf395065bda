"""The pack's aten estimators, checked against numbers worked out by hand from the 910B3 profile."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import castcore

BF16_CUBE = 20 * 16 * 16 * 16 * 2 * 1.8e9  # 294.912 TFLOPS, ascend-910b3
HBM = 1.6e12


@pytest.fixture(scope="module")
def session():
    return castcore.Session(load_packs=["ascend"])


def only(report):
    (record,) = report.records
    return record.estimate


def test_unaligned_matmul_pays_for_whole_fractals(session):
    # 1000 x 100 x 200 bf16: M 1000 -> 1008, K 100 -> 112, N 200 -> 208 (16 x 16 x 16 fractals).
    a = torch.empty(1000, 100, dtype=torch.bfloat16, device="meta")
    b = torch.empty(100, 200, dtype=torch.bfloat16, device="meta")
    est = only(session.estimate(torch.mm, a, b, device="ascend-910b3"))
    padded, useful = 2 * 1008 * 112 * 208, 2 * 1000 * 100 * 200
    assert est.detail["padded_shape"] == "1008x112x208"
    assert est.detail["cube_ops"] == padded and est.detail["useful_ops"] == useful
    assert est.detail["padding_waste"] == pytest.approx(1 - useful / padded)  # 14.8% of the Cube's work
    assert est.compute_s == pytest.approx(padded / (BF16_CUBE * 0.85))  # 0.187 us
    assert est.memory_s == pytest.approx((1000 * 100 + 100 * 200 + 1000 * 200) * 2 / (HBM * 0.75))  # 0.533 us
    # Both are below the 12 us launch floor: the op costs the floor, and says so.
    assert est.bound == "overhead" and est.time_s == pytest.approx(12e-6)
    assert est.overhead_s == pytest.approx(12e-6 - est.memory_s)  # the floor minus the longer (memory) part


def test_large_unaligned_matmul_is_compute_bound_with_its_waste(session):
    a = torch.empty(4097, 4096, dtype=torch.float16, device="meta")  # one extra row: a 17th row of fractals
    b = torch.empty(4096, 4096, dtype=torch.float16, device="meta")
    est = only(session.estimate(torch.mm, a, b, device="ascend-910b3"))
    assert est.detail["padded_shape"] == "4112x4096x4096"
    assert est.bound == "compute"
    assert est.time_s == pytest.approx(2 * 4112 * 4096 * 4096 / (BF16_CUBE * 0.85))


def test_int8_fractal_is_twice_as_deep(session):
    a = torch.empty(64, 40, dtype=torch.int8, device="meta")
    b = torch.empty(40, 64, dtype=torch.int8, device="meta")
    est = only(session.estimate(torch.ops.aten.mm.default, a, b, device="ascend-910b3"))
    assert est.detail["padded_shape"] == "64x64x64"  # K 40 -> 64 (K0 = 32 for int8), M and N stay 64


def test_linear_folds_leading_dims_into_m(session):
    # The pack claims aten.linear, so the capture keeps it whole: the leading dims become one M = 14 -> 16.
    x = torch.empty(2, 7, 64, dtype=torch.bfloat16, device="meta")
    w = torch.empty(96, 64, dtype=torch.bfloat16, device="meta")
    est = only(session.estimate(torch.nn.functional.linear, x, w, device="ascend-910b3"))
    assert est.detail["padded_shape"] == "16x64x96"


def test_linear_and_matmul_estimators_answer_for_a_model(session):
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(64, 96, dtype=torch.bfloat16)

        def forward(self, x):
            y = self.proj(x)
            return y @ y.transpose(-1, -2)  # a batched matmul, as eager attention's scores

    x = torch.empty(2, 7, 64, dtype=torch.bfloat16, device="meta")
    report = session.estimate(Block().to("meta"), x, device="ascend-910b3")
    by_op = {r.invoke.name: r.estimate for r in report.records if r.invoke.name in ("aten::linear", "aten::matmul")}
    assert all(_by_pack_estimator(e) for e in by_op.values())
    assert by_op["aten::linear"].detail["padded_shape"] == "16x64x96"
    assert by_op["aten::matmul"].detail["padded_shape"] == "2x16x96x16"  # 7 x 96 x 7 per batch, padded
    assert not [r for r in report.records if r.invoke.name in ("aten::mm", "aten::bmm", "aten::addmm")]
    llama = Path(__file__).resolve().parents[3] / "tests" / "data" / "tiny-llama.json"
    report = session.estimate(castcore.build_workload(str(llama), seq=16), device="ascend-910b3")
    linear = [r for r in report.records if r.invoke.name == "aten::linear"]
    assert len(linear) == 15 and all(_by_pack_estimator(r.estimate) for r in linear)


def _by_pack_estimator(estimate) -> bool:
    return estimate.source.plugin.startswith("castpack-ascend") and estimate.source.step == "estimator"


def test_softmax_rows_are_padded_to_32_byte_blocks(session):
    x = torch.empty(8, 1000, dtype=torch.float32, device="meta")
    est = only(session.estimate(torch.ops.aten._softmax.default, x, -1, False, device="ascend-910b3"))
    assert est.detail["padded_elements"] == 8 * 1000  # 1000 fp32 = 125 blocks of 8: no waste
    x = torch.empty(8, 1001, dtype=torch.float32, device="meta")
    est = only(session.estimate(torch.ops.aten._softmax.default, x, -1, False, device="ascend-910b3"))
    assert est.detail["padded_elements"] == 8 * 1008
    assert est.detail["vector_s"] == pytest.approx(8 * 8 * 1008 / (9.216e12 * 0.85))  # 8 ops per element, fp32


def test_large_elementwise_is_memory_bound_and_small_one_hits_the_floor(session):
    big = torch.empty(64 * 2**20, dtype=torch.bfloat16, device="meta")
    est = only(session.estimate(torch.add, big, big, device="ascend-910b3"))
    assert est.bound == "memory"
    assert est.time_s == pytest.approx(3 * big.nbytes / (HBM * 0.75))
    small = torch.empty(16, dtype=torch.bfloat16, device="meta")
    est = only(session.estimate(torch.add, small, small, device="ascend-910b3"))
    assert est.bound == "overhead" and est.time_s == pytest.approx(10e-6)


def test_the_inference_card_has_no_bf16_cube(session):
    # The 310P lists no bf16 (or fp32) Cube rate: the core's rule puts the product on the vector unit, named.
    a = torch.empty(256, 256, dtype=torch.bfloat16, device="meta")
    est = only(session.estimate(torch.mm, a, a, device="ascend-310p-duo"))
    assert est.detail["rates"]["cube:bfloat16"] == "float32 (no bfloat16 rate)"
    assert est.compute_s == pytest.approx(2 * 256**3 / (1.98144e12 * 0.85))
