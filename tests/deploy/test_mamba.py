"""Nemotron-H's Mamba-2 mixers as engines run them: the rewritten layers compute transformers' numbers (a prompt
chunked, then decode steps over the recurrent state), the scan's work worked by hand, tensor parallelism splitting
the heads and groups, and mixed batches under traffic with each request's state in the KV pool. Tiny config in
tests/data (one Mamba-2 layer of 8 heads of 16, 2 groups, state 16, convolution width 4, chunks of 16; one
attention layer; two MLPs). Needs the newest transformers castcore is tested on (not a ``models`` test)."""

from __future__ import annotations

import json

import pytest
import torch

import castcore
from castcore.builtin.formulas.ssm import STEPS, ssd_work
from castcore.cli.main import main
from castcore.serving.mixed_batch import Chunk
from castcore.serving.step_time import StepTimes, agreement, random_batches

from tests.deploy.test_fusing import DATA, logits_eager_and_rewritten

NEMOTRON_H = str(DATA / "tiny-nemotron-h.json")
ops = torch.ops.castcore


def test_the_rewrite_computes_what_transformers_does_over_a_prompt_and_decode_steps():
    eager, fused, done = logits_eager_and_rewritten("tiny-nemotron-h.json", 40)
    assert any("Mamba-2" in line for line in done), done
    for want, got in zip(eager, fused):  # a prompt of two and a half 16-token chunks, then the state carried
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


HEADS, DIM, GROUPS, STATE, CHUNK = 8, 16, 2, 16, 16
BF16, FP32 = 2, 4


def test_a_decode_step_reads_and_writes_each_sequences_state_once(session):
    report = session.estimate(
        castcore.build_workload(NEMOTRON_H, phase="decode", batch=2, kv_len=63), device="h100-sxm"
    )
    (scan,) = [r for r in report.records if r.invoke.name == "castcore::ssd_scan"]
    (conv,) = [r for r in report.records if r.invoke.name == "castcore::causal_conv1d"]
    # selective_state_update, per token and head: the step and decays, the skip (2 x 16), the state decayed and
    # written (3 x 16 x 16) and read along c (2 x 16 x 16), on the vector unit.
    assert scan.flops == 2 * HEADS * (STEPS + 2 * DIM + 5 * DIM * STATE)
    # Bytes: x and out (8 x 16 each), dt (8), b, c (2 x 16 each) in bf16 and the fp32 state read and written
    # (2 x 8 x 16 x 16), per sequence; A_log, D, dt_bias (8 each, bf16).
    per_sequence = (2 * HEADS * DIM + HEADS + 2 * GROUPS * STATE) * BF16 + 2 * HEADS * DIM * STATE * FP32
    assert scan.bytes == 2 * per_sequence + 3 * HEADS * BF16
    channels = HEADS * DIM + 2 * GROUPS * STATE  # x, B and C convolved, the last 3 inputs kept
    assert tuple(conv.invoke.args[2].shape) == (2, channels, 3)
    assert conv.invoke.args[3] is not None  # Nemotron-H's convolution has a bias


def test_a_prompt_runs_the_chunked_scan_worked_by_hand():
    # 40 tokens in 16-token chunks: two whole chunks and one of 8; per group C B^T over each chunk's square
    # (2 x 16 x (256 + 256 + 64)), per head the masked product with x over half of it (16 x 576) and the chunk
    # states and the outputs read from them (4 x 16 x 16 a token).
    mma, gp, between = ssd_work([(40, False)], HEADS, GROUPS, DIM, STATE, CHUNK)
    assert mma == 2 * 576 * GROUPS * STATE + 576 * HEADS * DIM + 40 * HEADS * 4 * DIM * STATE == 438272
    # the steps and the skip, the decay mask (576 exponentials), the states passed (2 x 16 x 16 a chunk), x dt
    # and the decays (3 x 16 a token), per head
    assert gp == 40 * HEADS * (STEPS + 2 * DIM) + HEADS * (576 + 3 * 2 * DIM * STATE + 40 * 3 * DIM)
    # three chunks' states written and read twice between the kernels (fp32, then in the state's dtype: bf16
    # here), and C B^T per group and chunk
    between = ssd_work([(40, False)], HEADS, GROUPS, DIM, STATE, CHUNK, BF16)[2]
    assert between == 3 * HEADS * DIM * STATE * (FP32 + BF16) + 3 * GROUPS * CHUNK * CHUNK * FP32
    assert ssd_work([(1, True)], HEADS, GROUPS, DIM, STATE, CHUNK)[0] == 0  # a decode: no matrix unit


def test_a_packed_row_computes_each_sequence_as_it_would_alone():
    torch.manual_seed(0)
    new, cached = [5, 1, 19], [0, 7, 3]
    tokens = sum(new)
    x, dt = torch.randn(1, tokens, HEADS, DIM), torch.randn(1, tokens, HEADS)
    b, c = torch.randn(1, tokens, GROUPS, STATE), torch.randn(1, tokens, GROUPS, STATE)
    params = (torch.randn(HEADS) * 0.2, torch.randn(HEADS), torch.randn(HEADS))
    states = torch.randn(len(new), HEADS, DIM, STATE)
    out, after = ops.varlen_ssd_scan(x, dt, b, c, *params, states, new, cached, CHUNK, 1e-3)
    at = 0
    for i, n in enumerate(new):
        part = slice(at, at + n)
        alone, state = ops.ssd_scan(
            x[:, part], dt[:, part], b[:, part], c[:, part], *params, states[i : i + 1], CHUNK, 1e-3
        )
        torch.testing.assert_close(out[:, part], alone)
        torch.testing.assert_close(after[i : i + 1], state)
        at += n


def test_tensor_parallel_splits_the_heads_groups_and_each_devices_state(session):
    one, two = (
        session.estimate(
            castcore.build_workload(NEMOTRON_H, phase="decode", batch=2, kv_len=63, tp=tp), device="h100-sxm"
        )
        for tp in (1, 2)
    )
    x, dt, b = next(r for r in two.records if r.invoke.name == "castcore::ssd_scan").invoke.args[:3]
    assert (x.shape[2], dt.shape[2], b.shape[2]) == (HEADS // 2, HEADS // 2, GROUPS // 2)
    assert any("all_reduce" in r.invoke.name for r in two.records)
    assert two.memory.kv_cache_bytes < one.memory.kv_cache_bytes  # each device holds its heads' states


def test_a_tp_that_does_not_divide_the_groups_is_refused_in_one_line(session):
    with pytest.raises(castcore.CastcoreError, match=r"n_groups = 2 does not divide by 4"):
        session.estimate(castcore.build_workload(NEMOTRON_H, seq=16, tp=4), device="h100-sxm")


@pytest.mark.parametrize("options", [{}, {"tp": 2}])
def test_under_traffic_each_iteration_agrees_with_a_direct_capture(session, options):
    """The decodes by state updates and the prompt chunks chunked, each on its own fitted line."""
    steps = StepTimes(session.pipeline, castcore.build_workload(NEMOTRON_H, **options), "h100-sxm", 512, 64)
    kinds = {template.name: counts for counts, template in steps.attention}
    assert kinds["castcore::varlen_ssd_scan"] == [1]
    verifying = [[Chunk(3, 40), Chunk(1, 30), Chunk(20, 0)]]
    rows = agreement(steps, random_batches(20) + verifying)
    assert len(rows) == 21 and all(abs(row["error"]) <= 0.03 for row in rows), rows


def test_simulate_runs_nemotron_h_with_each_requests_state_in_the_kv_cache(h100_file, capsys):
    argv = ["simulate", "--model", NEMOTRON_H, "--device-file", str(h100_file), "--device", "h100-sxm"]
    argv += ["--no-packs", "--requests", "6", "--input", "64", "--output", "4", "--json"]
    assert main(argv) == 0
    kv = json.loads(capsys.readouterr().out)["kv_capacity"]
    # one Mamba-2 layer: the convolution's last 3 inputs of x, B and C (128 + 64) in bf16, the state 8 x 16 x 16
    # in fp32
    assert kv["state_bytes_per_request"] == 3 * 192 * BF16 + HEADS * DIM * STATE * FP32 == 9344
