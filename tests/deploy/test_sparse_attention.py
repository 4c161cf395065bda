"""DeepSeek-V3.2's sparse attention as its kernels run it: the indexer picks each query's keys, latent attention runs
absorbed over those alone; the rewrite gives transformers' logits, the work is worked by hand on the tiny config
(4 heads, kv_lora_rank 16, qk_rope_head_dim 8, 4 index heads of 16, index_topk 8, 4 layers), and what is not
priced yet is one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import castcore
from castcore.builtin.attention_ops import kept_keys
from castcore.builtin.formulas.attention import SOFTMAX_OPS_PER_SCORE
from castcore.builtin.sparse_attention_ops import picked_keys
from castcore.cli.main import main
from castcore.deploy.kernels.fusing import rewrite
from castcore.hf.cache import cache_argument
from castcore.workload.models import BuiltModel

DATA = Path(__file__).parents[1] / "data"
V32, H100 = str(DATA / "tiny-deepseek-v32.json"), str(DATA / "h100-sxm.toml")
LAYERS, HEADS, RANK, ROPE, TOPK, INDEX_HEADS, INDEX_DIM = 4, 4, 16, 8, 8, 4, 16
BF16 = 2


def _records(report, name: str) -> list:
    return [r for r in report.records if r.invoke.name == name]


def test_the_rewrite_computes_what_transformers_does_over_a_prompt_and_a_decode_step():
    """20 prompt tokens, so the later queries see more keys than the 8 the indexer keeps, then one decode step."""
    from transformers import AutoConfig, AutoModelForCausalLM, DynamicCache

    fields = json.loads(Path(V32).read_text())
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0, 0.2)
    prompt, step = torch.randint(3, 200, (2, 20)), torch.randint(3, 200, (2, 1))

    def run():
        cache = {cache_argument(model): DynamicCache(config=model.config)}
        with torch.no_grad():
            return model(prompt, **cache).logits, model(step, **cache).logits

    eager = run()
    built = BuiltModel(model=model)
    done, _ = rewrite(built)
    assert any("castcore::sparse_latent_attention" in line for line in done)
    with built.while_capturing():
        rewritten = run()
    for want, got in zip(eager, rewritten):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_a_decode_step_scores_every_key_once_and_attends_to_the_top_k(session):
    report = session.estimate(
        castcore.build_workload(V32, phase="decode", batch=2, kv_len=63), device="h100-sxm"
    )
    (indexer,) = _records(report, "castcore::lightning_indexer")[:1]
    q, weights, keys = indexer.invoke.args[:3]
    assert tuple(q.shape) == (2, 1, INDEX_HEADS, INDEX_DIM) and tuple(keys.shape) == (2, 64, INDEX_DIM)
    # 64 keys a query, each scored by 4 heads of 16 (fp8 products on the H100), relu and a weighted sum per head
    pairs = 2 * 64
    assert indexer.flops == 2 * pairs * INDEX_HEADS * INDEX_DIM + pairs * (2 * INDEX_HEADS + 1)
    # the keys as the fp8 cache holds them (1 byte an element, an fp32 scale per 128), q and weights, the indices
    key_bytes = round(keys.numel() * (1 + 4 / 128))
    assert indexer.bytes == q.numel() * BF16 + weights.numel() * BF16 + key_bytes + 2 * 1 * TOPK * 4
    (attention,) = _records(report, "castcore::sparse_latent_attention")[:1]
    q, latent = attention.invoke.args[:2]
    assert tuple(q.shape) == (2, HEADS, 1, RANK + ROPE) and tuple(latent.shape) == (2, 1, 64, RANK + ROPE)
    # 8 of the 64 keys for each head: scores over rank + rope columns, values over rank columns
    pairs = 2 * HEADS * TOPK
    assert attention.flops == 2 * pairs * (RANK + ROPE + RANK) + SOFTMAX_OPS_PER_SCORE * pairs
    # the picked entries gathered, not the whole cache; the query, the indices and the output
    picked = 2 * TOPK * (RANK + ROPE) * BF16
    assert attention.bytes == q.numel() * BF16 + picked + 2 * TOPK * 4 + 2 * HEADS * RANK * BF16
    assert not _records(report, "castcore::latent_attention") and not _records(report, "castcore::attention")
    # each token's latent entry and its indexer key, per layer (and each layer's two int64 length counters)
    assert report.memory.kv_cache_bytes == LAYERS * 2 * 64 * (RANK + ROPE + INDEX_DIM) * BF16 + LAYERS * 16


def test_a_prompt_attends_to_at_most_top_k_keys_a_query(session):
    report = session.estimate(castcore.build_workload(V32, seq=64), device="h100-sxm")
    (attention,) = _records(report, "castcore::sparse_latent_attention")[:1]
    assert picked_keys(64, 64, TOPK) == sum(min(TOPK, n) for n in range(1, 65))  # 36 + 56 x 8
    pairs = HEADS * picked_keys(64, 64, TOPK)
    assert attention.flops == 2 * pairs * (RANK + ROPE + RANK) + SOFTMAX_OPS_PER_SCORE * pairs
    (indexer,) = _records(report, "castcore::lightning_indexer")[:1]
    assert indexer.flops == 2 * kept_keys(64, 64, True, 0) * INDEX_HEADS * INDEX_DIM + kept_keys(
        64, 64, True, 0
    ) * (2 * INDEX_HEADS + 1)
    assert report.memory.kv_cache_bytes == LAYERS * 64 * (RANK + ROPE + INDEX_DIM) * BF16


def test_tensor_parallel_splits_the_heads_and_keeps_the_indexer_whole(session):
    two = session.estimate(
        castcore.build_workload(V32, phase="decode", batch=2, kv_len=63, tp=2), device="h100-sxm"
    )
    q = _records(two, "castcore::sparse_latent_attention")[0].invoke.args[0]
    index_q = _records(two, "castcore::lightning_indexer")[0].invoke.args[0]
    assert q.shape[1] == HEADS // 2 and index_q.shape[2] == INDEX_HEADS  # vLLM replicates the indexer


def test_a_packed_row_picks_and_attends_per_sequence_as_one_sequence_alone_does():
    torch.manual_seed(0)
    new, cached = (
        [1, 3, 12],
        [20, 2, 0],
    )  # a decode past the top-k, a short decode verifying 2 drafts, a prompt
    keys = [n + c for n, c in zip(new, cached)]
    q = torch.randn(1, sum(new), INDEX_HEADS, INDEX_DIM)
    weights = torch.randn(1, sum(new), INDEX_HEADS)
    index_keys = torch.randn(1, sum(keys), INDEX_DIM)
    query = torch.randn(1, HEADS, sum(new), RANK + ROPE)
    latent = torch.randn(1, 1, sum(keys), RANK + ROPE)
    ops = torch.ops.castcore
    picks = ops.varlen_lightning_indexer(q, weights, index_keys, new, cached, 0.5, TOPK)
    out = ops.varlen_sparse_latent_attention(query, latent, picks, new, cached, RANK, 0.3)
    q_at = kv_at = 0
    for n, k in zip(new, keys):
        alone = ops.lightning_indexer(
            q[:, q_at : q_at + n], weights[:, q_at : q_at + n], index_keys[:, kv_at : kv_at + k], 0.5, TOPK
        )
        assert torch.equal(picks[:, q_at : q_at + n, : alone.shape[-1]], alone)
        assert bool((picks[:, q_at : q_at + n, alone.shape[-1] :] == -1).all())  # past its keys: none
        want = ops.sparse_latent_attention(
            query[:, :, q_at : q_at + n], latent[:, :, kv_at : kv_at + k], alone, RANK, 0.3
        )
        torch.testing.assert_close(out[:, q_at : q_at + n], want)
        q_at, kv_at = q_at + n, kv_at + k


def test_a_mixed_batch_runs_its_decodes_and_its_prompt_each_in_one_call(session):
    from castcore.serving.mixed_batch import Chunk, capture_mixed

    report = capture_mixed(
        session.pipeline, castcore.build_workload(V32), [Chunk(1, 63), Chunk(16, 0)], "h100-sxm"
    )
    indexers = _records(report, "castcore::varlen_lightning_indexer")
    sparse = _records(report, "castcore::varlen_sparse_latent_attention")
    assert len(indexers) == len(sparse) == 2 * LAYERS
    assert not _records(report, "castcore::lightning_indexer") and not _records(report, "castcore::attention")
    decode, prompt = sparse[:2]
    assert (decode.invoke.argument("new"), prompt.invoke.argument("new")) == ((1,), (16,))
    # Worked by hand as the one-sequence kernels are: the decode's query picks 8 of its 64 keys, the prompt's 16
    # queries min(8, i + 1) each; scores over rank + rope, values over rank, per head.
    for record, pairs in ((decode, TOPK), (prompt, picked_keys(16, 16, TOPK))):
        assert record.flops == 2 * HEADS * pairs * (2 * RANK + ROPE) + SOFTMAX_OPS_PER_SCORE * HEADS * pairs
    index_decode, index_prompt = indexers[:2]
    for record, pairs in ((index_decode, 64), (index_prompt, kept_keys(16, 16, True, 0))):
        assert record.flops == 2 * pairs * INDEX_HEADS * INDEX_DIM + pairs * (2 * INDEX_HEADS + 1)


def test_a_decode_iteration_agrees_with_serves_decode_step(session):
    from castcore.serving.mixed_batch import Chunk
    from castcore.serving.step_time import StepTimes

    steps = StepTimes(session.pipeline, castcore.build_workload(V32), "h100-sxm", 512, 64)
    static = session.estimate(
        castcore.build_workload(V32, phase="decode", batch=4, kv_len=100), device="h100-sxm"
    )
    # The same kernels but the glue a Hugging Face cache runs and an engine does not (its copies and index writes)
    assert steps([Chunk(1, 100)] * 4) == pytest.approx(static.time_s, rel=0.1)


def test_simulate_serves_it(capsys):
    argv = ["simulate", "--requests", "6", "--input", "64", "--output", "4", "--model", V32, "--json"]
    assert main([*argv, "--device-file", H100, "--device", "h100-sxm", "--no-packs"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["completed"] == 6 and result["median_ttft_ms"] > 0 and not result["failed"]


def test_what_is_not_priced_is_one_line_naming_the_indexer(capsys):
    argv = [
        "estimate",
        "--eager",
        "--model",
        V32,
        "--device-file",
        H100,
        "--device",
        "h100-sxm",
        "--no-packs",
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    said = "--eager and --train are not priced for its sparse attention"
    assert err[-1].startswith(f"castcore: error: {V32}: {said} (an indexer picks 8 keys for each query, ")
    assert "DeepseekV32Indexer)" in err[-1]
