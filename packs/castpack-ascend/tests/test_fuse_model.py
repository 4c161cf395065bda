"""fuse_model on a stock tiny Llama: the fused ops replace the stock modules, FLOPs stay put."""

from __future__ import annotations

from pathlib import Path

import pytest

import castcore

TINY_LLAMA = Path(__file__).resolve().parents[3] / "tests" / "data" / "tiny-llama.json"
FUSED = {"ascend::rms_norm", "ascend::swiglu", "ascend::apply_rotary_pos_emb", "ascend::prompt_flash_attention"}



@pytest.fixture(scope="module")
def session():
    return castcore.Session(load_packs=["ascend"])


def estimate(session, fuse: bool):
    work = session.build(castcore.build_workload(str(TINY_LLAMA), seq=16))
    lines = session.fuse(work.model, "ascend-910b3") if fuse else []
    return lines, session.estimate(work.model, *work.args, kwargs=work.kwargs, device="ascend-910b3")


def test_fuse_swaps_each_kind_and_counts_it(session):
    lines, _ = estimate(session, fuse=True)
    assert lines == [
        "castpack-ascend 0.1.0: 5 RMSNorm -> ascend::rms_norm",
        "castpack-ascend 0.1.0: 2 SiLU-gated MLP -> merged gate/up projection + ascend::swiglu",
        "castpack-ascend 0.1.0: 2 rotary attention -> ascend::apply_rotary_pos_emb + "
        "ascend::prompt_flash_attention (incre_flash_attention when decoding)",
    ]
    assert not session.warnings


def test_fused_model_runs_the_fused_ops_answered_by_the_pack_with_the_same_flops(session):
    _, stock = estimate(session, fuse=False)
    _, fused = estimate(session, fuse=True)
    rows = {row.op: row for row in fused.by_op()}
    assert FUSED <= set(rows)
    assert rows["ascend::rms_norm"].calls == 5 and rows["ascend::prompt_flash_attention"].calls == 2
    assert all(rows[op].source.startswith("castpack-ascend") for op in FUSED)
    stock_ops = {row.op for row in stock.by_op()}
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in stock_ops
    assert not any(op.startswith("aten::_scaled_dot_product") for op in rows)
    assert fused.flops == pytest.approx(stock.flops, rel=0.03)
    assert len(fused.records) < len(stock.records)


def test_fuse_leaves_non_ascend_devices_alone(tmp_path):
    h100 = Path(__file__).resolve().parents[3] / "tests" / "data" / "h100-sxm.toml"
    session = castcore.Session(load_packs=["ascend"], device_files=[str(h100)])
    work = session.build(castcore.build_workload(str(TINY_LLAMA), seq=16))
    assert session.fuse(work.model, "h100-sxm") == []


def test_fused_decode_step_uses_incremental_attention(session):
    work = castcore.build_workload(str(TINY_LLAMA), seq=16, phase="decode", kv_len=32, fuse=True)
    report = session.estimate(work, device="ascend-910b3")
    ops = {row.op for row in report.by_op()}
    assert "ascend::incre_flash_attention" in ops and "ascend::prompt_flash_attention" not in ops


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_fused_attention_runs_one_devices_heads_under_tensor_parallelism(session, phase):
    options = dict(seq=16, phase=phase, kv_len=32 if phase == "decode" else None)
    whole, split = (session.estimate(castcore.build_workload(str(TINY_LLAMA), tp=tp, **options), device="ascend-910b3")
                    for tp in (1, 2))
    name = "ascend::prompt_flash_attention" if phase == "prefill" else "ascend::incre_flash_attention"
    heads = [r.invoke.argument("num_heads") for report in (whole, split) for r in report.records
             if r.invoke.name == name][::2]
    assert heads == [4, 2]  # tiny-llama's 4 query heads, 2 per device
    assert split.flops < 0.6 * whole.flops


def test_the_decode_tpot_fit_counts_the_kv_each_step_reads(session):
    # Each decode step's incre_flash_attention is far below the 10-12 us a kernel costs; the fixed cost is added
    # to its K/V reads, not a floor under them, so the fit keeps the per-token cost: 2 layers x (K and V) x
    # 2 KV heads x 16 dims x 2 bytes (bf16) per cached token at 0.75 of 1.6 TB/s.
    report = session.serve(str(TINY_LLAMA), device="ascend-910b3", batch=1, input_tokens=64, output_tokens=32)
    per_token = 2 * 2 * 2 * 16 * 2 / (1.6e12 * 0.75)
    assert report.fit[1] == pytest.approx(per_token)
    assert "+ 0.213 ns per cached token" in report.notes[0]
