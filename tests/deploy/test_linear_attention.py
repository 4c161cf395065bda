"""Qwen3-Next's Gated DeltaNet as engines run it: the rewritten layers compute transformers' numbers (a prompt
chunked, then decode steps over the recurrent state), their kernels' work worked by hand, tensor parallelism
splitting the heads, and mixed batches under traffic with each request's state in the KV pool. Tiny config in tests/data (3 Gated DeltaNet layers, then full attention: key heads 2, value
heads 4, head dims 16, convolution width 4). Needs the newest transformers castcore is tested on (not a
``models`` test)."""

from __future__ import annotations

import json

import pytest
import torch

import castcore
from castcore.builtin.formulas.recurrent import GATES
from castcore.cli.main import main
from castcore.serving.mixed_batch import Chunk
from castcore.serving.step_time import StepTimes, agreement, random_batches

from tests.deploy.test_fusing import DATA, logits_eager_and_rewritten

QWEN3_NEXT = str(DATA / "tiny-qwen3-next.json")
K_HEADS, V_HEADS, DIM, WIDTH, LINEAR_LAYERS = 2, 4, 16, 4, 3
BF16 = 2


def test_the_rewrite_computes_what_transformers_does_over_a_prompt_and_decode_steps():
    eager, fused, done = logits_eager_and_rewritten("tiny-qwen3-next.json", 70)
    assert any("Gated DeltaNet" in line for line in done), done
    for want, got in zip(eager, fused):  # a prompt longer than one 64-token chunk, then the state carried
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_a_decode_step_reads_and_writes_each_sequences_state_once(session):
    report = session.estimate(
        castcore.build_workload(QWEN3_NEXT, phase="decode", batch=2, kv_len=63), device="h100-sxm"
    )
    rule = [r for r in report.records if r.invoke.name == "castcore::gated_delta_rule"]
    conv = [r for r in report.records if r.invoke.name == "castcore::causal_conv1d"]
    assert len(rule) == len(conv) == LINEAR_LAYERS
    # Recurrent form, per token and value head: decay, read along k, update, read along q (7 x 16 x 16), the
    # norms of q and k (6 x 16) and the gates, on the vector unit.
    assert rule[0].flops == 2 * V_HEADS * (7 * DIM * DIM + 6 * DIM + GATES)
    # Bytes: q and k (2 x 2 heads x 16), v (4 x 16), a, b (4 each), out (4 x 16),
    # the state read and written (2 x 4 x 16 x 16), per sequence, and A_log, dt_bias (4 each), all bf16.
    per_sequence = 2 * 2 * 16 + 4 * 16 + 2 * 4 + 4 * 16 + 2 * 4 * 16 * 16
    assert rule[0].bytes == (2 * per_sequence + 2 * 4) * BF16
    channels = 2 * K_HEADS * DIM + V_HEADS * DIM
    assert tuple(conv[0].invoke.args[2].shape) == (2, channels, WIDTH - 1)  # the last 3 inputs of q, k and v


def test_tensor_parallel_splits_the_heads_and_each_devices_state(session):
    one, two = (
        session.estimate(
            castcore.build_workload(QWEN3_NEXT, phase="decode", batch=2, kv_len=63, tp=tp), device="h100-sxm"
        )
        for tp in (1, 2)
    )
    q, _, v = next(r for r in two.records if r.invoke.name == "castcore::gated_delta_rule").invoke.args[:3]
    assert q.shape[2] == K_HEADS // 2 and v.shape[2] == V_HEADS // 2
    assert any("all_reduce" in r.invoke.name for r in two.records)
    assert two.memory.kv_cache_bytes < one.memory.kv_cache_bytes  # each device holds its heads' states
    prefills = [
        session.estimate(castcore.build_workload(QWEN3_NEXT, batch=2, seq=16, tp=tp), device="h100-sxm")
        for tp in (1, 2)
    ]
    # 2 KV heads and the linear-attention heads split over 2 devices: each holds half the keys and states
    assert prefills[1].memory.kv_cache_bytes * 2 == prefills[0].memory.kv_cache_bytes


@pytest.mark.parametrize("tp", [1, 2])
def test_serve_prices_qwen3_next(session, tp):
    served = session.serve(QWEN3_NEXT, input_tokens=64, output_tokens=8, batch=2, tp=tp)
    assert served.ttft_s > 0 and served.tpot_s > 0


@pytest.mark.parametrize("options", [{}, {"tp": 2}])
def test_under_traffic_each_iteration_agrees_with_a_direct_capture(session, options):
    """The decodes recurrent and the prompt chunks chunked, each on its own fitted line (castcore.serving.step_time)."""
    steps = StepTimes(session.pipeline, castcore.build_workload(QWEN3_NEXT, **options), "h100-sxm", 512, 64)
    (counts, template), _ = steps.attention  # three Gated DeltaNet layers and one of full attention
    assert (template.name, counts) == ("castcore::varlen_gated_delta_rule", [3])
    verifying = [[Chunk(3, 40), Chunk(1, 30), Chunk(20, 0)]]
    rows = agreement(steps, random_batches(20) + verifying)
    assert len(rows) == 21 and all(abs(row["error"]) <= 0.03 for row in rows), rows


def test_a_hybrid_models_requests_hold_their_recurrent_state_in_the_kv_cache(h100_file, capsys):
    argv = [
        "simulate",
        "--model",
        QWEN3_NEXT,
        "--device-file",
        str(h100_file),
        "--no-packs",
        "--requests",
        "20",
    ]
    assert main([*argv, "--input", "64", "--output", "8", "--json"]) == 0
    kv = json.loads(capsys.readouterr().out)["kv_capacity"]
    # Three Gated DeltaNet layers, each 4 value heads x 16 x 16 and 3 x (2 x 32 + 64) convolution inputs, bf16;
    # the one attention layer's token: 2 KV heads x 16 x (K, V) x 2 bytes, 16 a block.
    assert kv["state_bytes_per_request"] == 3 * (4 * 16 * 16 + 3 * 128) * 2 == 8448
    assert (kv["bytes_per_token"], kv["state_blocks_per_request"]) == (
        128,
        5,
    )  # 8448 / (16 x 128), rounded up
