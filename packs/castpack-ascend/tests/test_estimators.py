"""The pack's aten estimators, checked against numbers worked out by hand from the 910B3 profile."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import castcore

BF16_CUBE = 20 * 16 * 16 * 16 * 2 * 1.8e9  # 294.912 TFLOPS, ascend-910b3
HBM = 1.6e12
EFF = 0.88  # the 910B profiles' compute_efficiency, fitted with the 12 us Cube cost on the 910B2 matmuls


@pytest.fixture(scope="module")
def session():
    return castcore.Session(load_packs=["ascend"])


def only(report):
    (record,) = report.records
    return record.estimate


def test_unaligned_matmul_pays_for_whole_fractals_and_base_blocks(session):
    # 1000 x 100 x 200 bf16: M 1000 -> 1008, K 100 -> 112, N 200 -> 208 (16 x 16 x 16 fractals). The kernel cuts
    # the output into 128 x 256 blocks: 8 blocks for 20 AI cores, so K (2 steps of 64) is split over 2 cores each;
    # 16 cores busy for one step of one block, 4 idle: the time is one block-step.
    a = torch.empty(1000, 100, dtype=torch.bfloat16, device="meta")
    b = torch.empty(100, 200, dtype=torch.bfloat16, device="meta")
    est = only(session.estimate(torch.mm, a, b, device="ascend-910b3"))
    fractals, useful = 2 * 1008 * 112 * 208, 2 * 1000 * 100 * 200
    assert est.detail["padded_shape"] == "1008x112x208"
    assert (est.detail["tile"], est.detail["tiles"], est.detail["split_k"], est.detail["waves"]) == (
        "128x256x64", 8, 2, 1)
    block_step = 2 * 128 * 256 * 64
    assert est.detail["cube_ops"] == pytest.approx(20 * block_step) and est.detail["useful_ops"] == useful
    assert est.detail["cube_ops"] > fractals  # padding to the block includes the fractal padding
    assert est.detail["padding_waste"] == pytest.approx(1 - useful / (20 * block_step))
    assert est.compute_s == pytest.approx(block_step / (BF16_CUBE * EFF / 20))  # 0.32 us
    assert est.memory_s == pytest.approx((1000 * 100 + 100 * 200 + 1000 * 200) * 2 / (HBM * 0.75))  # 0.533 us
    # Both are below the kernel's 12 us fixed cost, which is added to the longer (memory) part, and says so.
    assert est.bound == "overhead" and est.overhead_s == pytest.approx(12e-6)
    assert est.time_s == pytest.approx(12e-6 + est.memory_s)


def test_large_unaligned_matmul_is_compute_bound_with_its_waste(session):
    a = torch.empty(4097, 4096, dtype=torch.float16, device="meta")  # one extra row: a 17th row of fractals
    b = torch.empty(4096, 4096, dtype=torch.float16, device="meta")
    est = only(session.estimate(torch.mm, a, b, device="ascend-910b3"))
    assert est.detail["padded_shape"] == "4112x4096x4096"
    # 33 x 16 blocks of 128 x 256 (17 x 32 of 256 x 128 would be 544): 528 blocks on 20 cores, 27 waves.
    assert (est.detail["tile"], est.detail["tiles"], est.detail["waves"]) == ("128x256x64", 528, 27)
    assert est.bound == "compute"
    assert est.time_s == pytest.approx(27 * 20 * 2 * 128 * 256 * 4096 / (BF16_CUBE * EFF) + 12e-6)


def test_a_product_with_one_block_more_than_the_cores_costs_a_second_wave(session):
    b = torch.empty(4096, 256, dtype=torch.bfloat16, device="meta")
    whole = only(session.estimate(torch.mm, torch.empty(20 * 128, 4096, dtype=torch.bfloat16, device="meta"), b,
                                  device="ascend-910b3"))
    more = only(session.estimate(torch.mm, torch.empty(21 * 128, 4096, dtype=torch.bfloat16, device="meta"), b,
                                 device="ascend-910b3"))
    assert (whole.detail["tiles"], whole.detail["waves"]) == (20, 1)
    assert (more.detail["tiles"], more.detail["waves"]) == (21, 2)
    assert whole.compute_s == pytest.approx(2 * 2560 * 256 * 4096 / (BF16_CUBE * EFF))  # 20 cores, all busy
    assert more.detail["cube_s"] == pytest.approx(2 * whole.detail["cube_s"])  # 1 of 20 cores busy in wave two


def test_a_skinny_decode_product_splits_k_over_idle_cores(session):
    # 16 tokens x 4096 x 1024: 4 blocks of 128 x 256 for 20 cores, so each block's 64 K-steps go to 5 cores.
    x = torch.empty(16, 4096, dtype=torch.bfloat16, device="meta")
    w = torch.empty(1024, 4096, dtype=torch.bfloat16, device="meta")
    est = only(session.estimate(torch.nn.functional.linear, x, w, device="ascend-910b3"))
    assert (est.detail["tile"], est.detail["tiles"], est.detail["split_k"], est.detail["waves"]) == (
        "128x256x64", 4, 5, 1)
    assert est.detail["cube_s"] == pytest.approx(13 * 2 * 128 * 256 * 64 / (BF16_CUBE * EFF / 20))  # ceil(64/5)
    assert est.memory_s > est.detail["cube_s"]  # reading the 8 MiB of weights takes longer than the Cube


def test_the_fractal_is_read_from_the_profile():
    from castpack_ascend.hardware import fractal, padded_mkn

    session = castcore.Session(load_packs=["ascend"])
    assert fractal(torch.int8, session.device("ascend-910b3")) == (16, 32, 16)  # [m, n, k] = [16, 16, 32]
    assert fractal(torch.float32, session.device("ascend-910b3")) == (16, 8, 16)
    wide = castcore.device_from_dict({
        "name": "ascend-wide-k", "vendor": "test", "memory_bytes": 1e9, "memory_bandwidth": 1e11,
        "mma_flops": {"bfloat16": 1e14}, "gp_flops": {"bfloat16": 1e12}, "mma_unit": {"bfloat16": [16, 16, 32]},
        "sources": {"memory_bytes": "t", "memory_bandwidth": "t", "mma_flops": "t", "gp_flops": "t",
                    "mma_unit": "t"}})
    assert padded_mkn(20, 40, 20, torch.bfloat16, wide) == (32, 64, 32)
    assert padded_mkn(20, 40, 20, torch.bfloat16) == (32, 48, 32)  # no profile: the 32-byte rule, K0 = 16


def test_int8_fractal_is_twice_as_deep(session):
    a = torch.empty(64, 40, dtype=torch.int8, device="meta")
    b = torch.empty(40, 64, dtype=torch.int8, device="meta")
    est = only(session.estimate(torch.ops.aten.mm.default, a, b, device="ascend-910b3"))
    assert est.detail["padded_shape"] == "64x64x64"  # K 40 -> 64 (K0 = 32 for int8), M and N stay 64


def test_w8a8_runs_int8_fractals_on_the_cube_and_its_quantize_on_the_vector_unit(session):
    """--weights int8 --activations int8 (vllm-ascend's W8A8_DYNAMIC): the product is the pack's, in int8
    fractals at twice the bf16 rate, so a large one takes about half the bf16 time; the per-token quantize is a
    row-wise vector op."""
    llama = Path(__file__).resolve().parents[3] / "tests" / "data" / "tiny-llama.json"
    work = castcore.build_workload(str(llama), seq=16, weights="int8", activations="int8")
    report = session.estimate(work, device="ascend-910b3")
    by_op = {r.invoke.name: r.estimate for r in report.records}
    assert _by_pack_estimator(by_op["castcore::int8_scaled_mm"])
    assert _by_pack_estimator(by_op["castcore::quantize_per_token"])
    rows = torch.empty(4096, 8192, dtype=torch.int8, device="meta")
    weight = torch.empty(8192, 8192, dtype=torch.int8, device="meta")
    scale_a = torch.empty(4096, 1, device="meta")
    scale_b = torch.empty(1, 8192, device="meta")
    int8 = only(
        session.estimate(
            torch.ops.castcore.int8_scaled_mm.default, rows, weight, scale_a, scale_b, None, torch.bfloat16,
            device="ascend-910b3",
        )
    )
    bf16 = only(
        session.estimate(
            torch.ops.aten.mm.default, rows.to(torch.bfloat16), weight.to(torch.bfloat16), device="ascend-910b3"
        )
    )
    assert int8.detail["padded_shape"] == "4096x8192x8192"
    assert int8.time_s == pytest.approx(bf16.time_s / 2, rel=0.1)


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
    report = session.estimate(castcore.build_workload(str(llama), seq=16, fuse=False), device="ascend-910b3")
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
    assert est.detail["vector_s"] == pytest.approx(8 * 8 * 1008 / (9.216e12 * EFF))  # 8 ops per element, fp32


def test_large_elementwise_is_memory_bound_and_small_one_is_its_fixed_cost(session):
    big = torch.empty(64 * 2**20, dtype=torch.bfloat16, device="meta")
    est = only(session.estimate(torch.add, big, big, device="ascend-910b3"))
    assert est.bound == "memory"
    assert est.time_s == pytest.approx(3 * big.nbytes / (HBM * 0.75) + 10e-6)
    small = torch.empty(16, dtype=torch.bfloat16, device="meta")
    est = only(session.estimate(torch.add, small, small, device="ascend-910b3"))
    assert est.bound == "overhead" and est.time_s == pytest.approx(10e-6 + est.memory_s)


def test_the_inference_card_has_no_bf16_cube(session):
    # The 310P lists no bf16 (or fp32) Cube rate: the core's rule puts the product on the vector unit, named.
    a = torch.empty(256, 256, dtype=torch.bfloat16, device="meta")
    est = only(session.estimate(torch.mm, a, a, device="ascend-310p-duo"))
    assert est.detail["rates"]["cube:bfloat16"] == "float32 (no bfloat16 rate)"
    assert est.compute_s == pytest.approx(2 * 256**3 / (1.98144e12 * 0.85))


@pytest.mark.parametrize(("n", "waves", "measured_tflops"), [(1024, 2, 98.08), (2048, 6, 251.01), (4096, 22, 314.52)])
def test_refit_910b2_matmul_is_waves_of_blocks_plus_the_fixed_cost(session, n, waves, measured_tflops):
    # 910B2: 24 AI cores at 1.8 GHz; 128 x 256 blocks in waves over them at 0.88 of the Cube peak, plus 12 us.
    # The fp16 square matmuls of zzc0721/torch-performance-test-data#109 these constants were fitted on.
    a = torch.empty(n, n, dtype=torch.float16, device="meta")
    est = only(session.estimate(torch.mm, a, a, device="ascend-910b2"))
    assert (est.detail["tile"], est.detail["waves"]) == ("128x256x64", waves)
    block = 2 * 128 * 256 * n / (24 * 16**3 * 2 * 1.8e9 * EFF / 24)
    assert est.time_s == pytest.approx(waves * block + 12e-6)
    assert 2 * n**3 / est.time_s / 1e12 == pytest.approx(measured_tflops, rel=0.08)
