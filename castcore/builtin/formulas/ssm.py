"""Work of the core's Mamba-2 operators (castcore.builtin.ssm_ops), as vLLM's Mamba-2 kernels (from mamba_ssm)
run them: every input read once and every output written once (a sequence's state read at its start and written
at its end), and the scan's arithmetic by how the kernel runs it.

A prompt runs the chunked SSD algorithm of Dao & Gu, "Transformers are SSMs: Generalized Models and Efficient
Algorithms Through Structured State Space Duality" (ICML 2024, arXiv 2405.21060, section 6, "Hardware-Efficient
Algorithm for SSD Models"), as ``mamba_chunk_scan_combined``'s five kernels run it, per chunk of Q tokens
(the config's chunk_size) with P = head_dim and N = state_size, on the matrix unit: the diagonal blocks, C B^T per
group (2 Q^2 N; ``_bmm_chunk_fwd`` computes the whole square) and its decay-masked product with x per head (the
lower triangle's tiles, about Q^2 P / 2 multiply-adds: Q^2 P); each chunk's state, B^T x per head (2 Q N P);
the outputs read from the states passed between chunks, C times the state per head (2 Q N P). A chunk shorter
than Q (a prompt's last) does its own length's square. On the vector unit: the steps' softplus and decays, the
decay mask (Q exponentials a token), the states passed between chunks (2 N P a chunk) and the skip d x. Between
the kernels each chunk's state is written and read twice, in fp32 by ``_chunk_state_fwd`` and then in the state's
dtype by ``_state_passing_fwd`` (vLLM's ``mamba_ssm_cache_dtype``), and C B^T (fp32) once. A decode step (a few tokens over a state) runs ``selective_state_update``, one kernel, token by token on
the vector unit: per head the state decays and takes the step's x b (3 P N), is read along c (2 P N), plus the
skip."""

from __future__ import annotations

import torch

from castcore.builtin import ssm_ops  # noqa: F401  (defines the ops)
from castcore.builtin.attention_ops import VERIFY_QUERIES, is_decode
from castcore.builtin.formulas.fused import RMS_NORM
from castcore.builtin.formulas.pointwise import SIGMOID, TRANSCENDENTAL
from castcore.devices.costs import PerformanceProperties
from castcore.plugins.claims import register_op_properties
from castcore.recording.invoke import OpInvoke

SILU = SIGMOID + 1  # x * sigmoid(x)
# the step softplus(dt + dt_bias) = log(1 + exp(.)), its clamp, A = -exp(A_log) and the decay exp(step x A)
STEPS = 4 * TRANSCENDENTAL + 4
FP32 = 4
ops = torch.ops.castcore


def ssd_work(
    runs: list[tuple[int, bool]],
    heads: int,
    groups: int,
    head_dim: int,
    state: int,
    chunk: int,
    passed: int = FP32,
) -> tuple[float, float, float]:
    """(matrix-unit flops, vector-unit flops, bytes of chunk states and C B^T written and read again between
    kernels) of the scan over ``runs``: (tokens, recurrent) per sequence; ``passed``: the bytes of an element of
    the states passed between chunks (the state's dtype)."""
    p, n = head_dim, state
    mma = gp = between = 0.0
    for tokens, recurrent in runs:
        gp += tokens * heads * (STEPS + 2 * p)  # the steps and decays, the skip d x
        if recurrent:  # selective_state_update: decay, write, read along c
            gp += tokens * heads * 5 * p * n
            continue
        full, last = divmod(tokens, chunk)
        chunks = full + (last > 0)
        squares = full * chunk * chunk + last * last  # each chunk's own length, squared
        mma += 2 * squares * (groups * n + heads * p / 2) + tokens * heads * 4 * n * p
        gp += heads * (squares + 2 * chunks * n * p + tokens * 3 * p)  # mask, states passed, x dt, decays
        between += chunks * heads * p * n * (FP32 + passed) + chunks * groups * chunk * chunk * FP32
    return mma, gp, between


def _scan(props: PerformanceProperties, x, b, state, runs, chunk: int) -> PerformanceProperties:
    heads, head_dim, groups, size = x.shape[2], x.shape[3], b.shape[2], b.shape[3]
    mma, gp, between = ssd_work(runs, heads, groups, head_dim, size, chunk, state.dtype.itemsize)
    props.kernel = "attention"
    props.memory_write_bytes += between
    props.memory_read_bytes += between
    # mamba_chunk_scan_combined is five kernels (the steps' cumulative sums, the chunk states, the states
    # passed, C B^T, the outputs); selective_state_update one
    props.launches = 5 if mma else 1
    if mma:
        props.add(x.dtype, mma=mma)
    return props.add(torch.float32, gp=gp)


@register_op_properties(ops.ssd_scan.default)
def _ssd_scan(invoke: OpInvoke, device) -> PerformanceProperties:
    x, b = invoke.args[0], invoke.args[2]
    batch, seq = x.shape[:2]
    runs = [(seq, seq <= VERIFY_QUERIES)] * batch  # a few tokens over a state: a decode step
    return _scan(invoke.memory_access_properties(), x, b, invoke.args[7], runs, invoke.argument("chunk"))


@register_op_properties(ops.varlen_ssd_scan.default)
def _varlen_ssd_scan(invoke: OpInvoke, device) -> PerformanceProperties:
    x, b = invoke.args[0], invoke.args[2]
    runs = [(n, is_decode(n, c)) for n, c in zip(invoke.argument("new"), invoke.argument("cached"))]
    return _scan(invoke.memory_access_properties(), x, b, invoke.args[7], runs, invoke.argument("chunk"))


@register_op_properties(ops.gated_group_rms_norm.default)
def _gated_group_rms_norm(invoke: OpInvoke, device) -> PerformanceProperties:
    x = invoke.args[0]
    return invoke.memory_access_properties().add(x.dtype, gp=(RMS_NORM + SILU + 1) * x.numel())
