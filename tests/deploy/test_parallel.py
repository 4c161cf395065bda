"""Tensor parallelism: torch's parallelize_module on a fake process group, captured per device."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import castcore
from castcore.report.memory import kv_cache_bytes
from castcore.report.memory import analyze_memory
from castcore.workload.spec import ModelError
from castcore.deploy.parallel.tensor import per_device_config, tensor_parallel
from castcore.deploy.pipeline import build

DATA = Path(__file__).parents[1] / "data"
TINY = str(DATA / "tiny-llama.json")  # hidden 64, ffn 160, 2 layers, 4 heads, 2 KV heads, vocab 500
LAYERS, HIDDEN, BATCH, SEQ = 2, 64, 2, 16


def _capture(tp: int, reuse: bool = True):
    workload = build(castcore.build_workload(TINY, batch=BATCH, seq=SEQ))
    with tensor_parallel(workload, tp) as info:
        captured = castcore.capture(workload.model, *workload.args, reuse=reuse, **workload.kwargs)
    return workload, captured, info


def _mm_flops(captured) -> int:
    return sum(
        2 * i.args[0].shape[0] * i.args[0].shape[1] * i.args[1].shape[1]
        for i in captured.invokes
        if i.name == "aten::mm"
    )


@pytest.fixture(scope="module")
def whole():
    return _capture(1)


@pytest.fixture(scope="module")
def tp2():
    return _capture(2)


def test_matmul_flops_per_device_are_one_nth(whole, tp2):
    # Embedding and LM head are vocab-parallel too, so every matmul is split: exactly half.
    # (A model whose vocab does not divide by N keeps its LM head whole: its matmul is then not split.)
    assert _mm_flops(tp2[1]) * 2 == _mm_flops(whole[1])
    assert [i.name for i in tp2[1].invokes].count("aten::mm") == [i.name for i in whole[1].invokes].count(
        "aten::mm"
    )


def test_local_shard_shapes_reach_the_estimators(tp2):
    mms = {i.module.rsplit(".", 1)[-1]: i for i in tp2[1].invokes if i.name == "aten::mm"}
    assert mms["q_proj"].args[1].shape == (HIDDEN, HIDDEN // 2)  # column-parallel: half the outputs
    assert mms["k_proj"].args[1].shape == (HIDDEN, 16)  # 2 KV heads of 16 -> 1 per device
    assert mms["o_proj"].args[0].shape == (BATCH * SEQ, HIDDEN // 2)  # row-parallel: half the inputs
    assert mms["down_proj"].args[1].shape == (80, HIDDEN)
    assert mms["lm_head"].out.shape == (BATCH, 250)  # the last token's logits only
    (sdpa, *_) = [i for i in tp2[1].invokes if "scaled_dot_product" in i.name]
    assert sdpa.args[0].shape[1] == 2 and sdpa.args[1].shape[1] == 1  # 2 query heads, 1 KV head per device
    assert sdpa.argument("is_causal") is True


def test_one_all_reduce_per_attention_and_mlp_block(tp2):
    reduces = [i for i in tp2[1].invokes if i.name == "_c10d_functional::all_reduce"]
    blocks = [i.module.rsplit(".", 1)[-1] for i in reduces]
    assert blocks == ["model"] + ["self_attn", "mlp"] * LAYERS  # "model": the vocab-parallel embedding
    assert all(i.attrs["group_size"] == 2 and i.args[0].shape == (BATCH, SEQ, HIDDEN) for i in reduces)
    gathers = [i for i in tp2[1].invokes if i.name == "_c10d_functional::all_gather_into_tensor"]
    assert len(gathers) == 1 and gathers[0].out.shape == (2 * BATCH, 1, 250)  # the last token's logits, once
    waits = [i for i in tp2[1].invokes if i.name == "_c10d_functional::wait_tensor"]
    assert len(waits) == len(reduces) + len(gathers)


def test_replayed_layers_record_what_a_full_per_device_capture_does(tp2):
    # tp2 is captured with reuse: layer 1 is replayed from layer 0's local-shard ops and collectives.
    _, full, _ = _capture(2, reuse=False)
    assert [(i.name, i.module, i.key, i.attrs) for i in tp2[1].invokes] == [
        (i.name, i.module, i.key, i.attrs) for i in full.invokes
    ]
    assert tp2[1].weight_storages == full.weight_storages
    assert analyze_memory(tp2[1]).to_dict() == analyze_memory(full).to_dict()


def test_weights_per_device_are_one_nth_but_the_norms(whole, tp2):
    # RMSNorm weights (bf16) and the rotary inv_freq buffers (2 x float32[8]) stay whole on every device
    replicated = (2 * LAYERS + 1) * HIDDEN * 2 + 2 * 8 * 4
    full, per_device = analyze_memory(whole[1]).weight_bytes, analyze_memory(tp2[1]).weight_bytes
    assert per_device == (full - replicated) // 2 + replicated
    assert per_device / full == pytest.approx(0.5, rel=0.01)


def test_the_plan_and_per_device_kv_cache(tp2):
    workload, _, info = tp2
    assert info.size == 2 and not info.replicated
    assert info.plan["model.layers.0.self_attn.q_proj"] == "colwise"
    assert info.plan["model.layers.1.mlp.down_proj"] == "rowwise"
    assert (info.plan["model.embed_tokens"], info.plan["lm_head"]) == ("embedding", "lm_head")
    assert "tensor parallel 2" in workload.description
    whole = kv_cache_bytes(json.loads(Path(TINY).read_text()), BATCH, SEQ, "bf16")
    assert kv_cache_bytes(workload.config, BATCH, SEQ, "bf16") * 2 == whole


def test_the_fake_process_group_is_destroyed_even_on_error():
    workload = build(castcore.build_workload(TINY, batch=1, seq=8))
    with pytest.raises(RuntimeError, match="boom"):
        with tensor_parallel(workload, 2):
            assert dist.is_initialized() and dist.get_world_size() == 2
            raise RuntimeError("boom")
    assert not dist.is_initialized()


def test_tp_one_changes_nothing():
    workload = build(castcore.build_workload(TINY, batch=1, seq=8))
    with tensor_parallel(workload, 1) as info:
        assert info is None and not dist.is_initialized()
    assert "tensor parallel" not in workload.description


def test_what_cannot_be_split_is_a_clear_error(tmp_path):
    with pytest.raises(ModelError, match="num_attention_heads = 4 does not divide by 3"):
        with tensor_parallel(build(castcore.build_workload(TINY, seq=8)), 3):
            pass
    assert not dist.is_initialized()
    odd = tmp_path / "three-kv-heads.json"
    odd.write_text(
        json.dumps(
            {
                **json.loads(Path(TINY).read_text()),
                "num_attention_heads": 6,
                "num_key_value_heads": 3,
                "hidden_size": 96,
            }
        )
    )
    with pytest.raises(
        ModelError, match="tp=2: num_key_value_heads = 3 does not divide by 2; .* or a multiple"
    ):
        with tensor_parallel(build(castcore.build_workload(str(odd), phase="decode", kv_len=8)), 2):
            pass
    with pytest.raises(ModelError, match="no attention/MLP projections"):
        with tensor_parallel(torch.nn.Sequential(torch.nn.Linear(4, 4)), 2):
            pass
    assert not dist.is_initialized()


def test_cli_estimate_tp(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("CASTCORE_")}
    args = [
        "estimate",
        "--model",
        TINY,
        "--seq",
        "16",
        "--no-packs",
        "--device-file",
        str(DATA / "h100-sxm.toml"),
        "--json",
    ]
    runs = [
        subprocess.run(
            [sys.executable, "-m", "castcore", *args, *extra], capture_output=True, text=True, env=env
        )
        for extra in ([], ["--tp", "2"])
    ]
    assert all(r.returncode == 0 for r in runs), runs[-1].stderr
    whole, split = (json.loads(r.stdout) for r in runs)
    assert "tensor parallel 2 (per device)" in split["description"]
    assert split["totals"]["flops"] < whole["totals"]["flops"] * 0.6
    assert split["memory"]["weight_bytes"] / whole["memory"]["weight_bytes"] == pytest.approx(0.5, rel=0.01)
    assert split["memory"]["kv_cache_bytes"] * 2 == whole["memory"]["kv_cache_bytes"]
    bad = subprocess.run(
        [sys.executable, "-m", "castcore", *args, "--tp", "3"], capture_output=True, text=True, env=env
    )
    assert bad.returncode == 2 and "does not divide by 3" in bad.stderr and "Traceback" not in bad.stderr


def _decode(spec: str, tp: int, **options):
    workload = build(castcore.build_workload(spec, phase="decode", **options))
    with tensor_parallel(workload, tp):
        captured = castcore.capture(workload.model, inputs_fn=workload.inputs_fn)
    return workload, captured


def test_decode_holds_one_devices_kv_cache():
    # tiny-llama: 2 layers x K and V x batch 2 x (32 + 1) slots x KV heads x head_dim 16 x bf16, plus each
    # layer's int64 fill counter. Each of 2 devices holds 1 of the 2 KV heads.
    (_, whole), (workload, split) = _decode(TINY, 1, kv_len=32, batch=2), _decode(TINY, 2, kv_len=32, batch=2)
    slots = 2 * 2 * 2 * 33 * 16 * 2
    assert analyze_memory(whole).kv_cache_bytes == 2 * slots + 2 * 8
    assert analyze_memory(split).kv_cache_bytes == slots + 2 * 8
    (sdpa, *_) = [i for i in split.invokes if "scaled_dot_product" in i.name]
    # local heads, whole cache
    assert sdpa.args[0].shape[1:3] == (2, 1) and sdpa.args[1].shape[1:3] == (
        1,
        33,
    )
    assert "tensor parallel 2 (per device)" in workload.description


def _grouped_mm_flops(captured) -> int:
    return sum(
        2 * i.args[0].shape[0] * i.args[0].shape[1] * i.args[1].shape[2]
        for i in captured.invokes
        if i.name == "aten::_grouped_mm"
    )


@pytest.mark.parametrize("phase", [{"seq": 16, "batch": 2}, {"phase": "decode", "kv_len": 16}])
def test_mixtral_experts_are_split_along_their_intermediate_dimension(phase):
    # tiny-mixtral: 4 experts, intermediate 96, top-2: each device holds 48 of every expert's 96 rows.
    runs = []
    for tp in (1, 2):
        workload = build(castcore.build_workload(str(DATA / "tiny-mixtral.json"), **phase))
        with tensor_parallel(workload, tp) as info:
            runs.append(castcore.capture(workload.model, inputs_fn=workload.inputs_fn, **workload.kwargs))
    whole, split = runs
    assert info.plan["model.layers.0.mlp.experts"] == "experts"
    assert _grouped_mm_flops(split) * 2 == _grouped_mm_flops(whole) > 0
    shapes = [tuple(i.args[1].shape) for i in split.invokes if i.name == "aten::_grouped_mm"][:2]
    # gate_up [experts, hidden, 2 x 48], down [experts, 48, hidden]
    assert shapes == [
        (4, 64, 96),
        (4, 48, 64),
    ]
    reduces = [i.module.rsplit(".", 1)[-1] for i in split.invokes if i.name == "_c10d_functional::all_reduce"]
    assert reduces == ["model"] + ["self_attn", "mlp"] * LAYERS  # the experts' partial sums, after them
    per_device, full = analyze_memory(split).weight_bytes, analyze_memory(whole).weight_bytes
    assert per_device / full == pytest.approx(0.5, rel=0.03)


def test_falcon_fused_qkv_splits_by_column_with_one_replicated_kv_head():
    # tiny-falcon: hidden 64, 4 heads of 16, multi-query (1 KV head): query_key_value is [64, (4 + 2) x 16].
    workload = build(castcore.build_workload(str(DATA / "tiny-falcon.json"), seq=16))
    with tensor_parallel(workload, 2) as info:
        captured = castcore.capture(workload.model, **workload.kwargs)
    mms = {i.module.rsplit(".", 1)[-1]: i for i in captured.invokes if i.name == "aten::mm"}
    assert mms["query_key_value"].args[1].shape == (64, (2 + 2) * 16)  # 2 query heads, the K and V head kept
    assert mms["dense"].args[1].shape == (32, 64)  # row-parallel output projection
    assert mms["dense_h_to_4h"].args[1].shape == (64, 128) and mms["dense_4h_to_h"].args[1].shape == (128, 64)
    assert info.plan["transformer.h.0.self_attention.query_key_value"] == "fused_qkv"
    reduces = [
        i.module.rsplit(".", 1)[-1] for i in captured.invokes if i.name == "_c10d_functional::all_reduce"
    ]
    assert reduces == ["self_attention", "mlp"] * LAYERS  # embedding and LM head are tied: kept whole


GPT2 = {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 500, "n_positions": 256}


def _layer_matmuls(report) -> dict[str, float]:
    """Matrix-unit FLOPs of the first decoder layer's matmuls, by the projection that ran them (the bias adds
    aside: a row-parallel layer adds its whole bias on every device)."""
    return {
        r.invoke.module.rsplit(".h.0.", 1)[1]: sum(c.mma_ops for c in r.properties.compute_ops.values())
        for r in report.records
        if r.invoke.name in ("aten::addmm", "aten::mm") and ".h.0." in r.invoke.module
    }


@pytest.mark.parametrize("fuse", [True, False])
def test_gpt2_conv1d_layers_are_tensor_parallel(session, tmp_path, fuse):
    # GPT-2's Conv1D weights are [in, out]: c_attn (q, k, v of 4 heads) and c_fc split by column, c_proj by row.
    path = tmp_path / "tiny-gpt2.json"
    path.write_text(json.dumps(GPT2))
    whole, split = (
        session.estimate(castcore.build_workload(str(path), seq=16, batch=2, tp=tp, fuse=fuse))
        for tp in (1, 2)
    )
    layers = _layer_matmuls(whole)
    assert set(layers) == {"attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"}
    assert {k: v / 2 for k, v in layers.items()} == _layer_matmuls(split)
    shapes = {
        r.invoke.module.rsplit(".h.0.", 1)[1]: tuple(r.invoke.args[2].shape)
        for r in split.records
        if r.invoke.name == "aten::addmm" and ".h.0." in r.invoke.module
    }
    assert shapes == {
        "attn.c_attn": (64, 96),
        "attn.c_proj": (32, 64),
        "mlp.c_fc": (64, 128),
        "mlp.c_proj": (128, 64),
    }
    reduces = [
        r.invoke.module.rsplit(".", 1)[-1]
        for r in split.records
        if r.invoke.name == "_c10d_functional::all_reduce"
    ]
    # after each layer's attention and MLP (the tied embedding stays whole)
    assert reduces == ["attn", "mlp"] * 2
    (attention, *_) = [
        r
        for r in split.records
        if r.invoke.name
        in (
            "castcore::attention",
            "aten::_scaled_dot_product_efficient_attention",
            "aten::_scaled_dot_product_flash_attention_for_cpu",
            "aten::scaled_dot_product_attention",
        )
    ]
    assert attention.invoke.args[0].shape[1] == 2  # 2 of the 4 heads per device


KV2 = {
    "model_type": "llama",
    "hidden_size": 128,
    "intermediate_size": 160,
    "num_hidden_layers": 2,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "vocab_size": 512,
    "max_position_embeddings": 256,
    "tie_word_embeddings": False,
}


@pytest.mark.parametrize("fuse", [True, False])
def test_fewer_kv_heads_than_devices_are_replicated(session, tmp_path, fuse):
    # 8 query heads and 2 KV heads of 16 over 8 devices: each device holds 1 query head and one KV head (as vLLM
    # replicates each KV head over 4 devices), in its projections and its decode cache.
    path = tmp_path / "kv2.json"
    path.write_text(json.dumps(KV2))
    from castcore.workload.spec import check_model_split

    check_model_split(str(path), KV2, tp=8)  # spec.py and the sharding agree: allowed
    prefill = session.estimate(castcore.build_workload(str(path), seq=16, batch=2, tp=8, fuse=fuse))
    mms = {
        r.invoke.module.rsplit(".", 1)[-1]: r.invoke
        for r in prefill.records
        if r.invoke.name == "aten::mm" and ".layers.0." in r.invoke.module
    }
    # deployed, q/k/v run as one merged projection: 1 query head and the one replicated K and V head
    expected = (
        {"qkv_proj": (128, 16 + 16 + 16), "o_proj": (16, 128)}
        if fuse
        else {"q_proj": (128, 16), "k_proj": (128, 16), "v_proj": (128, 16), "o_proj": (16, 128)}
    )
    assert {p: tuple(mms[p].args[1].shape) for p in expected} == expected
    assert not {"q_proj", "k_proj", "v_proj"} & set(mms) if fuse else "qkv_proj" not in mms
    decode = session.estimate(
        castcore.build_workload(str(path), phase="decode", kv_len=31, batch=2, tp=8, fuse=fuse)
    )
    # 2 layers x K and V x batch 2 x 32 slots x 1 head x 16 x bf16, and each layer's int64 fill counter.
    assert decode.memory.kv_cache_bytes == 2 * 2 * 2 * 32 * 1 * 16 * 2 + 2 * 8
    whole = session.estimate(
        castcore.build_workload(str(path), phase="decode", kv_len=31, batch=2, fuse=fuse)
    )
    assert whole.memory.kv_cache_bytes == 2 * 2 * 2 * 32 * 2 * 16 * 2 + 2 * 8
    assert kv_cache_bytes(per_device_config(KV2, 8), 1, 1, "bf16") * 2 == kv_cache_bytes(KV2, 1, 1, "bf16")


@pytest.mark.parametrize("fuse", [True, False])
def test_projections_no_name_identifies_are_split_by_where_they_sit(session, fuse):
    """GPT-J names its projections q/k/v_proj, out_proj, fc_in and fc_out: q/k/v and fc_in read the hidden size
    and are split by column, out_proj and fc_out end their blocks and are split by row."""
    gptj = str(DATA / "tiny-gptj.json")
    whole, split = (
        session.estimate(castcore.build_workload(gptj, seq=16, batch=2, tp=tp, fuse=fuse)) for tp in (1, 2)
    )
    layers = _layer_matmuls(whole)
    # deployed, q/k/v run as one merged projection, split by heads as the three were
    qkv = {"attn.qkv_proj"} if fuse else {"attn.q_proj", "attn.k_proj", "attn.v_proj"}
    assert set(layers) == qkv | {"attn.out_proj", "mlp.fc_in", "mlp.fc_out"}
    assert {k: v / 2 for k, v in layers.items()} == _layer_matmuls(split)
    reduces = [
        r.invoke.module.rsplit(".", 1)[-1]
        for r in split.records
        if r.invoke.name == "_c10d_functional::all_reduce"
    ]
    assert reduces.count("attn") == reduces.count("mlp") == 2  # one after each block of the two layers
