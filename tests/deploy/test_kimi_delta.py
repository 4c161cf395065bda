"""Kimi Linear's delta attention (KDA) as engines run it: the rewritten layers compute transformers' numbers (a
prompt, then decode steps over the recurrent state) and their kernels' work worked by hand. Tiny config in
tests/data (3 KDA layers, then multi-head latent attention: 4 heads of 16, convolution width 4). Needs the newest
transformers castcore is tested on (kimi_linear is not in 5.5.0; not a ``models`` test). The packed row's delta rule
computes each sequence's own, and a mixed batch runs its latent attention layer packed, never rotated (NoPE)."""

from __future__ import annotations

import json

import pytest
import torch

import castcore
from castcore.builtin.formulas.pointwise import SIGMOID, TRANSCENDENTAL
from castcore.builtin.formulas.recurrent import CHUNK, DECAY, FOLD, GATES

from castcore.serving.mixed_batch import Chunk, capture_mixed
from castcore.serving.step_time import StepTimes

from tests.deploy.test_fusing import DATA, logits_eager_and_rewritten

KIMI = str(DATA / "tiny-kimi-linear.json")
HEADS, DIM, WIDTH, LINEAR_LAYERS = 4, 16, 4, 3
BF16 = 2


def test_the_rewrite_computes_what_transformers_does_over_a_prompt_and_decode_steps():
    eager, fused, done = logits_eager_and_rewritten("tiny-kimi-linear.json", 70)
    assert any("Kimi delta attention" in line for line in done), done
    assert any("latent attention" in line for line in done), done  # its one layer, never rotated
    for want, got in zip(eager, fused):  # a prompt longer than one 64-token chunk, then the state carried
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_a_per_channel_decay_equal_across_a_heads_channels_is_the_per_head_rule():
    """castcore::gated_delta_rule generalised: a gate per key channel (KDA) that is the same on every channel of a
    head gives the per-head rule (Gated DeltaNet's)."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 5, 3, 8) for _ in range(3))
    a, b, a_log, dt_bias = torch.randn(2, 5, 3), torch.randn(2, 5, 3), torch.randn(3), torch.randn(3)
    state = torch.randn(2, 3, 8, 8)
    ops = torch.ops.castcore
    per_head = ops.gated_delta_rule(q, k, v, a, b, a_log, dt_bias, state)
    spread = (a[..., None].expand(2, 5, 3, 8), dt_bias[:, None].expand(3, 8))
    per_channel = ops.gated_delta_rule(q, k, v, spread[0], b, a_log, spread[1], state)
    for want, got in zip(per_head, per_channel):
        torch.testing.assert_close(got, want)
    varied = ops.gated_delta_rule(q, k, v, torch.randn(2, 5, 3, 8), b, a_log, spread[1], state)
    assert not torch.allclose(varied[1], per_head[1])  # each channel decays by its own gate


def test_a_decode_step_reads_and_writes_each_sequences_state_once(session):
    report = session.estimate(
        castcore.build_workload(KIMI, phase="decode", batch=2, kv_len=63), device="h100-sxm"
    )
    rule = [r for r in report.records if r.invoke.name == "castcore::gated_delta_rule"]
    conv = [r for r in report.records if r.invoke.name == "castcore::causal_conv1d"]
    assert len(rule) == len(conv) == LINEAR_LAYERS
    # Recurrent form, per token and head: decay, read along k, update, read along q (7 x 16 x 16), the norms of q
    # and k (6 x 16), the decay's exponential per key channel (16 x 4), beta's sigmoid and each channel's gate.
    assert rule[0].flops == 2 * HEADS * (
        7 * DIM * DIM + 6 * DIM + DIM * TRANSCENDENTAL + SIGMOID + DIM * DECAY
    )
    assert GATES == SIGMOID + DECAY
    # Bytes: q, k, v (3 x 4 heads x 16), a (a gate per channel: 4 x 16), b (4), out (4 x 16), the state read and
    # written (2 x 4 x 16 x 16), per sequence, and A_log (4), bf16; dt_bias (4 x 16) in the fp32 it is kept in.
    per_sequence = 3 * 4 * 16 + 4 * 16 + 4 + 4 * 16 + 2 * 4 * 16 * 16
    assert rule[0].bytes == (2 * per_sequence + 4) * BF16 + 4 * 16 * 4
    assert tuple(conv[0].invoke.args[2].shape) == (2, 3 * HEADS * DIM, WIDTH - 1)  # the last 3 of q, k and v
    norm = next(r for r in report.records if r.invoke.name == "castcore::gated_rms_norm")
    assert norm.invoke.argument("sigmoid") is True  # Kimi Linear's output gate is a sigmoid


def test_a_prefill_runs_the_chunked_rule_with_the_decay_folded_per_channel(session):
    report = session.estimate(castcore.build_workload(KIMI, batch=1, seq=64), device="h100-sxm")
    rule = next(r for r in report.records if r.invoke.name == "castcore::gated_delta_rule")
    # One 64-token chunk per head on the matrix unit, as the per-head rule: the key-key and query-key products,
    # the writes and outputs, the state read and updated once
    tokens = 64
    mma = tokens * HEADS * (2 * CHUNK * (3 * DIM + 2 * DIM) + 6 * DIM * DIM)
    gp = tokens * HEADS * (SIGMOID + DIM * DECAY + CHUNK * CHUNK / 3 + 6 * DIM + 4 * CHUNK + DIM * FOLD)
    assert rule.flops == mma + gp


def test_serve_prices_kimi_linear_on_one_device(session):
    served = session.serve(KIMI, input_tokens=64, output_tokens=8, batch=2)
    assert served.ttft_s > 0 and served.tpot_s > 0


def test_a_packed_row_with_per_channel_decay_is_each_sequences_own_rule():
    torch.manual_seed(0)
    new, heads, dim = [3, 1, 5], 2, 8
    q, k, v, a = (torch.randn(1, sum(new), heads, dim) for _ in range(4))
    b, a_log, dt_bias = torch.randn(1, sum(new), heads), torch.randn(heads), torch.randn(heads, dim)
    states = torch.randn(len(new), heads, dim, dim)
    ops = torch.ops.castcore
    out, after = ops.varlen_gated_delta_rule(q, k, v, a, b, a_log, dt_bias, states, new, [4, 9, 0])
    at = 0
    for i, n in enumerate(new):
        part = slice(at, at + n)
        want, state = ops.gated_delta_rule(
            q[:, part], k[:, part], v[:, part], a[:, part], b[:, part], a_log, dt_bias, states[i : i + 1]
        )
        torch.testing.assert_close(out[:, part], want)
        torch.testing.assert_close(after[i : i + 1], state)
        at += n


def test_a_decode_step_runs_its_latent_attention_absorbed_without_rotary(session):
    report = session.estimate(
        castcore.build_workload(KIMI, phase="decode", batch=2, kv_len=63), device="h100-sxm"
    )
    names = [r.invoke.name for r in report.records]
    assert names.count("castcore::latent_attention") == 1 and "castcore::rotary_embedding" not in names
    (latent,) = [r for r in report.records if r.invoke.name == "castcore::latent_attention"]
    assert tuple(latent.invoke.args[1].shape) == (2, 1, 64, 16 + 8)  # rank 16 + the unrotated 8 columns
    assert not [r for r in report.records if r.invoke.name == "aten::_safe_softmax"]  # not its own sdpa


def test_a_mixed_batch_runs_the_delta_rule_and_the_latent_attention_packed(session):
    report = capture_mixed(
        session.pipeline, castcore.build_workload(KIMI), [Chunk(1, 63), Chunk(16, 0)], "h100-sxm"
    )
    names = [r.invoke.name for r in report.records]
    assert (
        names.count("castcore::varlen_latent_attention") == 2
    )  # the decode absorbed, the prompt decompressed
    assert names.count("castcore::varlen_gated_delta_rule") == 2 * LINEAR_LAYERS  # the same two sets
    steps = StepTimes(session.pipeline, castcore.build_workload(KIMI), "h100-sxm", 512, 64)
    static = session.estimate(
        castcore.build_workload(KIMI, phase="decode", batch=4, kv_len=100), device="h100-sxm"
    )
    assert steps([Chunk(1, 100)] * 4) == pytest.approx(static.time_s, rel=0.1)


def test_simulate_serves_kimi_linear_with_each_requests_state_in_the_pool(h100_file, capsys):
    from castcore.cli.main import main

    argv = ["simulate", "--model", KIMI, "--device-file", str(h100_file), "--no-packs", "--requests", "8"]
    assert main([*argv, "--input", "48", "--output", "8", "--concurrency", "4", "--json"]) == 0
    done = json.loads(capsys.readouterr().out)
    assert done["completed"] == 8 and done["median_tpot_ms"] > 0 and done["median_ttft_ms"] > 0


def test_tensor_parallelism_splits_the_delta_attention_by_heads_and_keeps_the_latent_cache_whole(session):
    def decode(tp):
        workload = castcore.build_workload(KIMI, phase="decode", batch=2, kv_len=63, tp=tp)
        return session.estimate(workload, device="h100-sxm")

    one, two = decode(1), decode(2)
    rule = next(r for r in two.records if r.invoke.name == "castcore::gated_delta_rule")
    q, _, _, a, b = rule.invoke.args[:5]
    assert q.shape[2] == a.shape[2] == b.shape[2] == HEADS // 2 and a.shape[3] == DIM  # per-channel gates too
    # the latent layer's 64 entries (rank 16 + 8) whole on each device; each KDA layer's state and convolution
    # inputs halved
    latent = 2 * 64 * (16 + 8) * BF16
    kda = LINEAR_LAYERS * 2 * (HEADS * DIM * DIM + 3 * HEADS * DIM * (WIDTH - 1)) * BF16
    assert one.memory.kv_cache_bytes - latent == pytest.approx(kda, abs=64)  # and a length counter
    assert two.memory.kv_cache_bytes - latent == pytest.approx(kda / 2, abs=64)
    assert (
        sum(r.invoke.name.endswith("all_reduce") for r in two.records) >= 2 * 4
    )  # attention and MLP each layer
