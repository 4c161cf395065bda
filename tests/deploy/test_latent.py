"""DeepSeek-V3 as engines run it: multi-head latent attention (decompressed heads for prompts, the absorbed form
over a latent cache for decode steps; the cache's size; tensor parallelism) and its grouped top-k router; and the
multi-query cache of Falcon.
Under traffic, a mixed batch runs its decodes absorbed and its prompt chunks decompressed.
Worked by hand on the tiny configs in tests/data (4 heads, kv_lora_rank 16, qk_rope_head_dim 8, 4 layers)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import castcore
from castcore.hf.cache import cache_argument
from castcore.builtin.formulas.attention import SOFTMAX_OPS_PER_SCORE
from castcore.cli.main import main
from castcore.deploy.kernels.fusing import rewrite
from castcore.serving.mixed_batch import Chunk, capture_mixed
from castcore.serving.step_time import StepTimes
from castcore.workload.models import BuiltModel

from tests.deploy.test_fusing import DATA, real_model

DEEPSEEK = str(DATA / "tiny-deepseek-v3.json")
FALCON = str(DATA / "tiny-falcon.json")
LAYERS, HEADS, RANK, ROPE, NOPE = 4, 4, 16, 8, 8
BF16 = 2


def _names(report) -> list[str]:
    return [r.invoke.name for r in report.records]


def test_decode_runs_the_absorbed_kernel_over_the_latent_cache(session):
    workload = castcore.build_workload(DEEPSEEK, phase="decode", batch=2, kv_len=63)
    report = session.estimate(workload, device="h100-sxm")
    latent = [r for r in report.records if r.invoke.name == "castcore::latent_attention"]
    assert len(latent) == LAYERS and "castcore::attention" not in _names(report)
    q, cache = latent[0].invoke.args[:2]
    assert tuple(q.shape) == (2, HEADS, 1, RANK + ROPE) and tuple(cache.shape) == (2, 1, 64, RANK + ROPE)
    # Every head scores 64 keys over rank + rope columns and sums 64 values of rank columns, with the softmax's
    # vector work on each score.
    pairs = 2 * HEADS * 64
    assert latent[0].flops == 2 * pairs * ((RANK + ROPE) + RANK) + SOFTMAX_OPS_PER_SCORE * pairs
    # The cache is read once for all heads: the query, the cache and the output, nothing else.
    assert latent[0].bytes == (q.numel() + cache.numel() + 2 * 1 * HEADS * RANK) * BF16
    # One latent entry per token and layer (and each layer's int64 length counter).
    assert report.memory.kv_cache_bytes == LAYERS * 2 * 64 * (RANK + ROPE) * BF16 + LAYERS * 8


def test_a_prompt_decompresses_the_heads_and_its_cache_is_the_latent_one(session):
    report = session.estimate(castcore.build_workload(DEEPSEEK, seq=64), device="h100-sxm")
    attention = [r for r in report.records if r.invoke.name == "castcore::attention"]
    assert len(attention) == LAYERS and "castcore::latent_attention" not in _names(report)
    q, k, v = attention[0].invoke.args[:3]
    assert tuple(q.shape) == tuple(k.shape) == (1, HEADS, 64, NOPE + ROPE) and v.shape[-1] == 16  # v_head_dim
    assert report.memory.kv_cache_bytes == LAYERS * 64 * (RANK + ROPE) * BF16


def test_tensor_parallel_splits_the_heads_and_keeps_the_latent_cache_whole(session):
    one = session.estimate(
        castcore.build_workload(DEEPSEEK, phase="decode", batch=2, kv_len=63), device="h100-sxm"
    )
    two = session.estimate(
        castcore.build_workload(DEEPSEEK, phase="decode", batch=2, kv_len=63, tp=2), device="h100-sxm"
    )
    (q, cache) = next(r for r in two.records if r.invoke.name == "castcore::latent_attention").invoke.args[:2]
    assert q.shape[1] == HEADS // 2 and cache.shape[1] == 1
    assert two.memory.kv_cache_bytes == one.memory.kv_cache_bytes  # every device holds every latent entry
    assert any("all_reduce" in name for name in _names(two))


def test_the_rewrite_computes_what_transformers_does_with_both_rotary_layouts(tmp_path):
    from transformers import DynamicCache

    for interleaved in (False, True):
        fields = json.loads((DATA / "tiny-deepseek-v3.json").read_text()) | {"rope_interleave": interleaved}
        (DATA / f"_latent_{interleaved}.json").write_text(json.dumps(fields))
        try:
            model = real_model(f"_latent_{interleaved}.json")
        finally:
            (DATA / f"_latent_{interleaved}.json").unlink()
        prompt, step = torch.randint(3, 200, (2, 12)), torch.randint(3, 200, (2, 1))

        def run():
            cache = {cache_argument(model): DynamicCache(config=model.config)}
            with torch.no_grad():
                return model(prompt, **cache, use_cache=True).logits, model(
                    step, **cache, use_cache=True
                ).logits

        eager = run()
        built = BuiltModel(model=model)
        done, _ = rewrite(built)
        assert any("latent attention" in line for line in done)
        attention = model.model.layers[0].self_attn
        assert attention.qkv_a_proj.out_features == 16 + RANK + ROPE  # q_lora_rank, then the latent entry
        assert not hasattr(attention, "q_a_proj") and not hasattr(attention, "kv_a_proj_with_mqa")
        with built.while_capturing():
            fused = run()
        for want, got in zip(eager, fused):  # the prompt (decompressed), then a decode step (absorbed)
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_serve_prices_deepseek(h100_file, capsys):
    assert (
        main(
            [
                "serve",
                "--model",
                DEEPSEEK,
                "--device-file",
                str(h100_file),
                "--no-packs",
                "--batch",
                "4",
                "--input",
                "64",
                "--output",
                "8",
                "--tp",
                "2",
                "--json",
            ]
        )
        == 0
    )
    figures = json.loads(capsys.readouterr().out)
    assert figures["ttft_s"] > 0 and figures["tpot_s"] > 0
    # At the longest context, 64 + 8 tokens, one latent entry each (and each layer's length counter).
    assert figures["kv_cache_bytes"] == LAYERS * 4 * 72 * (RANK + ROPE) * BF16 + LAYERS * 8


def _hand_latent_attention(q, latent, w_k, w_v, cached, scale):
    """One sequence by the definition: keys and values decompressed from its latent entries, causal softmax."""
    keys = torch.cat([latent[:, :RANK] @ w_k.transpose(-1, -2), latent[:, RANK:].expand(HEADS, -1, -1)], -1)
    values = latent[:, :RANK] @ w_v.transpose(-1, -2)  # [heads, keys, v_dim]
    scores = q @ keys.transpose(-1, -2) * scale  # [heads, new, keys]
    new, total = q.shape[1], keys.shape[1]
    seen = torch.arange(total)[None, :] <= torch.arange(cached, cached + new)[:, None]
    return (scores.masked_fill(~seen, float("-inf")).softmax(-1) @ values).transpose(0, 1)


def test_a_packed_row_computes_each_sequence_by_the_definition():
    torch.manual_seed(0)
    new, cached, v_dim = [1, 3, 6], [5, 4, 0], 16  # a decode, a decode verifying 2 drafts, a prompt
    q = torch.randn(1, HEADS, sum(new), NOPE + ROPE, dtype=torch.float64)
    latent = torch.randn(1, 1, sum(n + c for n, c in zip(new, cached)), RANK + ROPE, dtype=torch.float64)
    kv_b = torch.randn(HEADS, NOPE + v_dim, RANK, dtype=torch.float64)
    got = torch.ops.castcore.varlen_latent_attention(q, latent, kv_b, new, cached, 0.3)
    q_at = kv_at = 0
    for n, c in zip(new, cached):
        want = _hand_latent_attention(
            q[0, :, q_at : q_at + n],
            latent[0, 0, kv_at : kv_at + n + c],
            kv_b[:, :NOPE],
            kv_b[:, NOPE:],
            c,
            0.3,
        )
        torch.testing.assert_close(got[0, q_at : q_at + n], want, rtol=1e-5, atol=1e-5)  # fp32 scores inside
        q_at, kv_at = q_at + n, kv_at + n + c


def test_a_mixed_batch_runs_its_decodes_absorbed_and_its_prompt_decompressed(session):
    report = capture_mixed(
        session.pipeline, castcore.build_workload(DEEPSEEK), [Chunk(1, 63), Chunk(16, 0)], "h100-sxm"
    )
    calls = [r for r in report.records if r.invoke.name == "castcore::varlen_latent_attention"]
    assert len(calls) == 2 * LAYERS and "castcore::latent_attention" not in _names(report)
    decode, prompt = calls[:2]
    assert (decode.invoke.argument("new"), prompt.invoke.argument("new")) == ((1,), (16,))
    # Worked by hand (4 heads, nope 8, rope 8, v_dim 16, rank 16). The decode: its query into the latent space
    # and the result out of it (2 x 4 heads x 16 x (8 + 16)), scores over 24 columns and values over 16 for
    # 4 x 64 kept pairs. The prompt: kv_b over its 16 keys (2 x 16 x 4 x 16 x 24), 4 x 136 causal pairs over
    # 16 + 16 columns.
    assert decode.flops == 2 * 4 * 16 * 24 + 2 * 256 * 40 + SOFTMAX_OPS_PER_SCORE * 256
    assert prompt.flops == 2 * 16 * 4 * 16 * 24 + 2 * 544 * 32 + SOFTMAX_OPS_PER_SCORE * 544
    # Bytes (bf16): the decode reads its query (4 heads x 16), 64 latent entries (x 24) and kv_b (4 x 24 x 16), writes
    # its output (4 x 16) and its new entry (24). The prompt the same for 16 tokens, and its decompressed keys
    # and values (16 x 4 x (16 + 16)) written and read back.
    assert decode.bytes == (4 * 16 + 64 * 24 + 4 * 24 * 16 + 4 * 16 + 24) * BF16
    assert (
        prompt.bytes == (16 * 4 * 16 + 16 * 24 + 4 * 24 * 16 + 16 * 4 * 16 + 16 * 24 + 2 * 16 * 4 * 32) * BF16
    )


@pytest.mark.parametrize("model", [DEEPSEEK, str(DATA / "tiny-llama.json")])
def test_a_decode_iteration_agrees_with_serves_decode_step(session, model):
    steps = StepTimes(session.pipeline, castcore.build_workload(model), "h100-sxm", 512, 64)
    static = session.estimate(
        castcore.build_workload(model, phase="decode", batch=4, kv_len=100), device="h100-sxm"
    )
    # The same kernels but the glue a Hugging Face cache runs and an engine does not (its copies and index writes)
    assert steps([Chunk(1, 100)] * 4) == pytest.approx(static.time_s, rel=0.1)


def test_simulate_serves_deepseek_with_its_own_mtp_drafts(h100_file, tmp_path, capsys):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(json.loads(Path(DEEPSEEK).read_text()) | {"num_nextn_predict_layers": 1}))
    argv = [
        "simulate",
        "--model",
        str(config),
        "--device-file",
        str(h100_file),
        "--no-packs",
        "--requests",
        "12",
    ]
    argv += ["--input", "48", "--output", "8", "--concurrency", "4", "--json"]
    assert main(argv) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main([*argv, "--spec-tokens", "2", "--acceptance", "0.8", "--draft-model", "mtp"]) == 0
    drafted = json.loads(capsys.readouterr().out)
    assert plain["completed"] == drafted["completed"] == 12
    assert drafted["median_tpot_ms"] < plain["median_tpot_ms"]  # two drafts verified in one absorbed pass


def test_falcon_multi_query_decodes_with_one_kv_head(session):
    report = session.estimate(
        castcore.build_workload(FALCON, phase="decode", batch=1, kv_len=63), device="h100-sxm"
    )
    # 2 layers, one K and one V head of 16 dims over 64 tokens, and each layer's length counter.
    assert report.memory.kv_cache_bytes == 2 * 2 * 64 * 1 * 16 * BF16 + 2 * 8
    prefill = session.estimate(castcore.build_workload(FALCON, seq=64), device="h100-sxm")
    assert prefill.memory.kv_cache_bytes == 2 * 2 * 64 * 1 * 16 * BF16


@pytest.mark.parametrize("weights", ["fp8", "int8"])
def test_quantized_weights_keep_the_absorbed_products_in_the_model_dtype(session, weights):
    report = session.estimate(
        castcore.build_workload(DEEPSEEK, phase="decode", batch=2, kv_len=63, weights=weights),
        device="h100-sxm",
    )
    products = [r for r in report.records if r.invoke.name == "aten::bmm" and "self_attn" in r.invoke.module]
    assert len(products) == 2 * LAYERS and all(r.invoke.args[1].dtype == torch.bfloat16 for r in products)


def test_grouped_routing_is_one_kernel_that_chooses_what_transformers_chooses(tmp_path):
    from transformers import DynamicCache

    # 4 experts in 2 groups, the best group kept: each token's 2 experts come from one group, chosen with the bias.
    fields = json.loads((DATA / "tiny-deepseek-v3.json").read_text()) | {"n_group": 2, "topk_group": 1}
    (DATA / "_grouped.json").write_text(json.dumps(fields))
    try:
        model = real_model("_grouped.json")
    finally:
        (DATA / "_grouped.json").unlink()
    torch.manual_seed(1)
    for name, buffer in model.named_buffers():
        if name.endswith("e_score_correction_bias"):
            buffer.uniform_(0, 0.5)  # positive, so both transformers releases' masks choose alike
    prompt = torch.randint(3, 200, (2, 12))

    def run():
        with torch.no_grad():
            return model(prompt, **{cache_argument(model): DynamicCache(config=model.config)}).logits

    eager = run()
    built = BuiltModel(model=model)
    done, _ = rewrite(built)
    assert any("castcore::grouped_topk" in line for line in done)
    with built.while_capturing():
        torch.testing.assert_close(run(), eager, rtol=1e-4, atol=1e-4)


def test_the_grouped_router_is_priced_as_one_call(session):
    report = session.estimate(castcore.build_workload(DEEPSEEK, seq=64), device="h100-sxm")
    routers = [r for r in report.records if r.invoke.name == "castcore::grouped_topk"]
    assert len(routers) == LAYERS - 1  # the first layer is dense (first_k_dense_replace 1)
    assert not any(
        r.invoke.name in ("aten::scatter_.value", "aten::masked_fill.Scalar") for r in report.records
    )


def test_a_decode_step_runs_the_kernels_engines_launch_for_latent_attention(session):
    """One GEMM for the query's and the latent entry's down-projections (vLLM's fused_qkv_a_proj), the entry
    written by the cache write alone (concat_and_cache_mla: no concatenation kernel before it), and the router one
    GEMM on the model's dtype (no fp32 copy of the hidden states, nor an fp32 weight)."""
    report = session.estimate(
        castcore.build_workload(DEEPSEEK, phase="decode", batch=2, kv_len=63), device="h100-sxm"
    )

    def attention_calls(name):
        return [r for r in report.records if r.invoke.name == name and ".self_attn" in r.invoke.module]

    down = [r for r in attention_calls("aten::mm") if r.invoke.module.endswith("qkv_a_proj")]
    assert len(down) == LAYERS and tuple(down[0].invoke.outputs()[0].shape) == (2, 16 + RANK + ROPE)
    assert not [r for r in attention_calls("aten::mm") if r.invoke.module.endswith(("q_a_proj", "mqa"))]
    entries = attention_calls("castcore::latent_entry")
    assert len(entries) == LAYERS and all(r.estimate.time_s == 0 for r in entries)
    # one kernel a layer reads the entry's parts and writes it (the empty values slot adds nothing)
    assert not attention_calls("aten::index_copy_")
    writes = [
        r
        for r in attention_calls("castcore::kv_cache_write")
        if r.invoke.module.endswith("layers.0.self_attn")
    ]
    assert len(writes) == 1 and writes[0].bytes >= 2 * 2 * (RANK + ROPE) * BF16
    routers = [r for r in report.records if r.invoke.module.endswith("mlp.gate") and r.estimate.time_s > 0]
    assert "aten::_to_copy" not in {r.invoke.name for r in routers}
    gemms = [r for r in routers if r.invoke.name == "aten::mm"]
    assert len(gemms) == LAYERS - 1  # the first layer is dense
    assert all(t.dtype == torch.bfloat16 for r in gemms for t in r.invoke.inputs())
    eager = session.estimate(
        castcore.build_workload(DEEPSEEK, phase="decode", batch=2, kv_len=63, fuse=False), device="h100-sxm"
    )
    # the routers' weights held in bf16 (transformers 5.24 keeps them fp32; 5.5 already made them bf16)
    assert report.memory.weight_bytes <= eager.memory.weight_bytes
