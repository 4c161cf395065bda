"""The ascend:: fused ops: fake shapes equal real ones, each captures as one op, and its estimate by hand."""

from __future__ import annotations

import pytest
import torch

import castcore
import castpack_ascend.ops  # noqa: F401  (defines torch.ops.ascend)

ascend = torch.ops.ascend
B, S, N, KV, D, H = 2, 24, 4, 2, 32, 128


def cases():
    r = lambda *shape, dtype=torch.float32: torch.randn(*shape).to(dtype)  # noqa: E731
    table = torch.tensor([[0, 2, 4], [1, 3, 5]], dtype=torch.int32)
    return {
        "rms_norm": (ascend.rms_norm, (r(B, S, H), r(H)), {"epsilon": 1e-6}),
        "add_rms_norm": (ascend.add_rms_norm, (r(B, S, H), r(B, S, H), r(H)), {}),
        "swiglu": (ascend.swiglu, (r(B, S, 2 * H),), {"dim": -1}),
        "rotary_mul": (ascend.rotary_mul, (r(B, S, N, D), r(1, S, 1, D), r(1, S, 1, D)), {}),
        "apply_rotary_pos_emb": (ascend.apply_rotary_pos_emb,
                                 (r(B, S, N, D), r(B, S, KV, D), r(B, S, 1, D), r(B, S, 1, D)), {"layout": "BSND"}),
        "prompt_flash_attention": (ascend.prompt_flash_attention, (r(B, S, N * D), r(B, S, KV * D), r(B, S, KV * D)),
                                   {"num_heads": N, "num_key_value_heads": KV, "input_layout": "BSH",
                                    "sparse_mode": 3, "scale_value": D**-0.5}),
        "incre_flash_attention": (ascend.incre_flash_attention, (r(B, 1, N * D), r(6, 16, KV * D), r(6, 16, KV * D)),
                                  {"num_heads": N, "num_key_value_heads": KV, "block_table": table,
                                   "actual_seq_lengths": [40, 17], "block_size": 16}),
        "grouped_matmul": (ascend.grouped_matmul, (r(10, H), r(3, H, 48)), {"group_list": [3, 3, 10]}),
        "moe_gating_top_k_softmax": (ascend.moe_gating_top_k_softmax, (r(10, 8),), {"k": 2}),
    }


@pytest.mark.parametrize("name", list(cases()))
def test_fake_shapes_match_the_reference_and_capture_as_one_op(name):
    op, args, kwargs = cases()[name]
    real = op(*args, **kwargs)
    captured = castcore.capture(lambda *a: op(*a, **kwargs), *args)
    (invoke,) = captured.invokes
    assert invoke.name == f"ascend::{name}"
    real = real if isinstance(real, (tuple, list)) else (real,)
    assert [(t.shape, t.dtype) for t in invoke.outputs()] == [(tuple(t.shape), t.dtype) for t in real]


@pytest.fixture(scope="module")
def session():
    return castcore.Session(load_packs=["ascend"])


def test_every_fused_op_is_answered_by_the_pack(session):
    for name, (op, args, kwargs) in cases().items():
        (record,) = session.estimate(lambda *a: op(*a, **kwargs), *args, device="ascend-910b3").records
        assert record.estimate.source.plugin.startswith("castpack-ascend"), name
        assert record.flops > 0, name


def test_prompt_flash_attention_gqa_causal_by_hand(session):
    q = torch.empty(1, 8, 1000, 128, dtype=torch.bfloat16, device="meta")
    kv = torch.empty(1, 2, 1000, 128, dtype=torch.bfloat16, device="meta")
    report = session.estimate(lambda q, k, v: ascend.prompt_flash_attention(
        q, k, v, num_heads=8, num_key_value_heads=2, input_layout="BNSD", sparse_mode=3), q, kv, kv,
        device="ascend-910b3")
    (record,) = report.records
    pairs = 8 * 1000 * 1001 // 2  # causal: 500,500 kept (query, key) pairs per head
    assert record.flops == 2 * pairs * 2 * 128 + 8 * pairs  # two products + softmax (8 vector ops per score)
    est = record.estimate
    # Each head's products pad 1000 -> 1008 on M and N (and K of PV): kept fraction 500500/1e6 of padded tiles.
    padded = 8 * (2 * 1008 * 128 * 1008 + 2 * 1008 * 1008 * 128) * (1000 * 1001 / 2) / 1e6
    assert est.detail["cube_ops"] == pytest.approx(padded)
    assert est.detail["gqa_group"] == 4 and est.detail["causal"]
    assert record.bytes == q.nbytes * 2 + kv.nbytes * 2  # GQA: K and V read at 2 heads, not 8


def test_paged_decode_reads_only_the_blocks_in_use(session):
    q = torch.empty(2, 1, 8 * 128, dtype=torch.float16, device="meta")
    cache = torch.empty(1000, 128, 2 * 128, dtype=torch.float16, device="meta")  # 1000 blocks of 128 tokens
    table = torch.empty(2, 64, dtype=torch.int32, device="meta")
    report = session.estimate(lambda q, k, v, t: ascend.incre_flash_attention(
        q, k, v, block_table=t, actual_seq_lengths=[4096, 1000], num_heads=8, num_key_value_heads=2,
        block_size=128), q, cache, cache, table, device="ascend-910b3")
    (record,) = report.records
    kv_read = (4096 + 1000) * 2 * 128 * 2 * 2  # tokens x kv heads x dim x 2 bytes x (K and V)
    assert record.properties.memory_read_bytes == q.nbytes + table.nbytes + kv_read
    assert record.estimate.detail["paged"] and record.estimate.bound in ("memory", "overhead")


def test_grouped_matmul_pads_each_expert_separately(session):
    x = torch.empty(40, 256, dtype=torch.bfloat16, device="meta")
    w = torch.empty(4, 256, 512, dtype=torch.bfloat16, device="meta")
    report = session.estimate(lambda x, w: ascend.grouped_matmul(x, w, group_list=[1, 1, 20, 40]), x, w,
                              device="ascend-910b3")
    est = report.records[0].estimate
    assert est.detail["group_sizes"] == [1, 0, 19, 20]
    assert est.detail["cube_ops"] == 2 * (16 + 32 + 32) * 256 * 512  # 1 -> 16, 19 -> 32, 20 -> 32; empty skipped
    assert report.records[0].properties.memory_read_bytes == x.nbytes + 3 * 256 * 512 * 2  # 3 experts' weights


def test_fused_attention_runs_at_the_fitted_attention_rate_plus_its_call_cost(session):
    # One 3072-row query block against 8192 keys, head_dim 128, on a 910B2: the Cube work at the profile's
    # attention_efficiency (0.58 of 24 cores x 16^3 MACs x 2 x 1.8 GHz) and 100 us per call, as fitted on
    # torch_npu's fused attention (huawei-csl/pto-dsl#126: 175.53 us for this shape).
    q = torch.empty(1, 1, 3072, 128, dtype=torch.float16, device="meta")
    kv = torch.empty(1, 1, 8192, 128, dtype=torch.float16, device="meta")
    report = session.estimate(lambda q, k, v: ascend.prompt_flash_attention(
        q, k, v, num_heads=1, input_layout="BNSD"), q, kv, kv, device="ascend-910b2")
    est = report.records[0].estimate
    assert est.detail["cube_s"] == pytest.approx(4 * 3072 * 8192 * 128 / (24 * 16**3 * 2 * 1.8e9 * 0.58))
    assert est.overhead_s == pytest.approx(100e-6) and est.bound == "overhead"  # 100 us > 63 us of Cube work
    assert est.time_s == pytest.approx(175.53e-6, rel=0.1)
