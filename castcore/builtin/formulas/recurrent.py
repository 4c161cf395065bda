"""Work of the core's linear-attention operators (castcore.builtin.recurrent_ops), as flash-linear-attention's
kernels run them: every input read once and every output written once (a sequence's state read at its start and
written at its end), and the delta rule's arithmetic by how the kernel runs it.

A prompt runs the chunked form of Yang et al., "Gated Delta Networks: Improving Mamba2 with Delta Rule" (arXiv
2412.06464, section 3.2; flash-linear-attention's ``chunk_gated_delta_rule``, 64-token chunks): per chunk and
value head, the key-key and query-key products, the triangular solve that turns them into the chunk's writes
(the WY representation), its keys and values through it, its outputs, and the state read by queries and keys and
updated once, on the matrix unit; each chunk's state is written and read back between the kernel's passes. A
decode step (a few tokens over a state) runs the recurrent form token by token on the vector unit
(``fused_recurrent_gated_delta_rule``): the state decays, is read along the key, takes the update and is read
along the query. The gates (decay and write strength) are computed in the same kernel, as vLLM's
``fused_gdn_gating`` feeds them.

Kimi Linear's delta attention (KDA) decays each key channel by its own gate (Kimi Team, "Kimi Linear: An
Expressive, Efficient Attention Architecture", arXiv 2510.26692, its chunkwise algorithm; flash-linear-attention's
``chunk_kda`` and ``fused_recurrent_kda``). The decay folds into the keys and queries before the same products, so
its matrix-unit work is the delta rule's; what it adds is on the vector unit, per key channel instead of per head:
the gate itself (and, recurrent, its exponential), and chunked the gate's cumulative sum, its three exponentials
(the queries', the keys' and the keys' to the chunk's end) and the five products that fold them in."""

from __future__ import annotations

import torch

from castcore.builtin import recurrent_ops  # noqa: F401  (defines the ops)
from castcore.builtin.attention_ops import VERIFY_QUERIES, is_decode
from castcore.builtin.formulas.fused import RMS_NORM
from castcore.builtin.formulas.pointwise import SIGMOID, TRANSCENDENTAL
from castcore.devices.costs import PerformanceProperties
from castcore.plugins.claims import register_op_properties
from castcore.recording.invoke import OpInvoke

CHUNK = 64  # tokens a chunk of the chunked delta rule (flash-linear-attention's default)
SILU = SIGMOID + 1  # x * sigmoid(x)
DECAY = 2 * TRANSCENDENTAL + 4  # g = -exp(A_log) x log(1 + exp(a + dt_bias))
GATES = SIGMOID + DECAY  # and beta = sigmoid(b)
FOLD = 1 + 3 * TRANSCENDENTAL + 5  # KDA chunked, per key channel and token: the decay folded into q and k
ops = torch.ops.castcore


@register_op_properties(ops.causal_conv1d.default)
def _causal_conv1d(invoke: OpInvoke, device) -> PerformanceProperties:
    x, weight = invoke.args[:2]
    # a multiply-add per tap, the bias where there is one (Mamba-2's), then SiLU
    per_output = 2 * weight.shape[-1] + SILU + (invoke.argument("bias") is not None)
    return invoke.memory_access_properties().add(x.dtype, gp=per_output * x.numel())


@register_op_properties(ops.gated_rms_norm.default)
def _gated_rms_norm(invoke: OpInvoke, device) -> PerformanceProperties:
    x = invoke.args[0]
    gate = SIGMOID if invoke.argument("sigmoid") else SILU  # Kimi Linear's sigmoid, else SiLU
    return invoke.memory_access_properties().add(x.dtype, gp=(RMS_NORM + gate + 1) * x.numel())


def _delta_rule(
    props: PerformanceProperties, q, v, a, state, runs: list[tuple[int, bool]]
) -> PerformanceProperties:
    """``props`` with the work of the delta rule over ``runs``: (tokens, recurrent) per sequence; ``a`` one gate
    per head, or (KDA) per key channel."""
    heads, dv, dk = v.shape[2], v.shape[3], q.shape[-1]
    per_channel = a.dim() == 4
    props.kernel = "attention"
    mma = gp = chunk_states = 0.0
    for tokens, recurrent in runs:
        gp += tokens * heads * (SIGMOID + DECAY * (dk if per_channel else 1))
        if recurrent:  # decay, read along k, update, read along q; the L2 norms of q and k
            gp += tokens * heads * (7 * dk * dv + 6 * dk + (dk * TRANSCENDENTAL if per_channel else 0))
        else:
            gp += tokens * heads * dk * FOLD if per_channel else 0
            mma += tokens * heads * (2 * CHUNK * (3 * dk + 2 * dv) + 6 * dk * dv)
            # the solve is CHUNK^3 / 3 a chunk (CHUNK^2 / 3 a token); the gates' exponentials and the norms
            gp += tokens * heads * (CHUNK * CHUNK / 3 + 6 * dk + 4 * CHUNK)
            chunk_states += heads * tokens / CHUNK * dk * dv * state.dtype.itemsize
    props.memory_write_bytes += chunk_states
    props.memory_read_bytes += chunk_states
    # flash-linear-attention's chunked form is six kernels (the gates' cumulative sum, the key-key products, the
    # solve, the writes, the chunk states, the outputs); the recurrent form one
    props.launches = 6 if any(not recurrent for _, recurrent in runs) else 1
    if mma:
        props.add(q.dtype, mma=mma)
    return props.add(torch.float32, gp=gp)


@register_op_properties(ops.gated_delta_rule.default)
def _gated_delta_rule(invoke: OpInvoke, device) -> PerformanceProperties:
    q, _, v = invoke.args[:3]
    batch, seq = v.shape[:2]
    runs = [(seq, seq <= VERIFY_QUERIES)] * batch  # a few tokens over a state: a decode step
    return _delta_rule(invoke.memory_access_properties(), q, v, invoke.args[3], invoke.args[7], runs)


@register_op_properties(ops.varlen_gated_delta_rule.default)
def _varlen_gated_delta_rule(invoke: OpInvoke, device) -> PerformanceProperties:
    q, _, v = invoke.args[:3]
    runs = [(n, is_decode(n, c)) for n, c in zip(invoke.argument("new"), invoke.argument("cached"))]
    return _delta_rule(invoke.memory_access_properties(), q, v, invoke.args[3], invoke.args[7], runs)
