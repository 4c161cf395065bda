"""DeepSeek-V3 as engines run it: multi-head latent attention (decompressed heads for prompts, the absorbed form
over a latent cache for decode steps; the cache's size; tensor parallelism) and its grouped top-k router; and the
multi-query cache of Falcon.
Worked by hand on the tiny configs in tests/data (4 heads, kv_lora_rank 16, qk_rope_head_dim 8, 4 layers)."""

from __future__ import annotations

import json

import pytest
import torch

import castcore
from castcore.hf.cache import cache_argument
from castcore.builtin.formulas.attention import SOFTMAX_OPS_PER_SCORE
from castcore.cli.main import main
from castcore.deploy.kernels.fusing import rewrite
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


def test_simulate_says_it_cannot_price_latent_attention_yet(h100_file, capsys):
    assert (
        main(
            [
                "simulate",
                "--model",
                DEEPSEEK,
                "--device-file",
                str(h100_file),
                "--no-packs",
                "--requests",
                "4",
                "--input",
                "32",
                "--output",
                "4",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "latent attention (MLA)" in err[0], err


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
