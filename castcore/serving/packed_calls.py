"""An iteration's call of a packed attention kernel, rebuilt from a template: a simulation prices one call per
layer kind per iteration (castcore.serving.step_time), each with its own chunks, without capturing it.

A template is a captured call without its chunk lengths (``attention_kind``); ``attention_call`` gives it the
tensors and lengths of an iteration's chunks, as the packed forward (castcore.deploy.kernels.packing) would have
made them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch

from castcore.builtin.attention_ops import latent_widths
from castcore.recording.invoke import OpInvoke, TensorMeta
from castcore.simulation.chunks import Chunk

LATENT = "castcore::varlen_latent_attention"
DELTA_RULE = "castcore::varlen_gated_delta_rule"
SSD = "castcore::varlen_ssd_scan"
INDEXER = "castcore::varlen_lightning_indexer"
SPARSE = "castcore::varlen_sparse_latent_attention"
SPLIT = (
    LATENT,
    DELTA_RULE,
    SSD,
    INDEXER,
    SPARSE,
)  # two kernels an iteration: its decodes and its prompt chunks
# the recurrent kernels: how many of the first arguments are the packed row's [1, tokens, ...] (the rest up to the
# state are the layer's parameters), and which of them the output is shaped like
RECURRENT = {DELTA_RULE: (5, 2), SSD: (4, 0)}


def _lengths_at(name: str) -> int:
    """Where a packed kernel's ``new`` and ``cached`` lists are in its arguments (``cached`` the next)."""
    return 8 if name in RECURRENT else 3


def attention_kind(invoke: OpInvoke) -> OpInvoke:
    """The kernel without its lengths: the template an iteration's call is made from."""
    at = _lengths_at(invoke.name)
    return replace(
        invoke,
        args=(*invoke.args[:at], (), (), *invoke.args[at + 2 :]),
        out=None,
        module="",
        index=0,
        _key=None,
    )


def attention_call(template: OpInvoke, chunks: Sequence[Chunk]) -> OpInvoke:
    """The iteration's call of a layer kind's kernel over ``chunks``: the template's shapes at their token and
    sequence counts."""
    if template.name in RECURRENT:
        return _recurrent_call(template, chunks)
    if template.name in (INDEXER, SPARSE):
        return _sparse_call(template, chunks)
    q, k, v = template.args[:3]
    tokens, keys = sum(c.new for c in chunks), sum(c.cached + c.new for c in chunks)
    query = TensorMeta((1, q.shape[1], tokens, q.shape[3]), q.dtype)
    key = TensorMeta((1, k.shape[1], keys, k.shape[3]), k.dtype)
    if template.name == LATENT:  # v is kv_b [heads, nope + v_dim, rank], the same for every iteration
        value, v_dim = v, latent_widths(q, k, v)[2]
    else:
        value, v_dim = TensorMeta((1, v.shape[1], keys, v.shape[3]), v.dtype), v.shape[3]
    out = TensorMeta((1, tokens, q.shape[1], v_dim), q.dtype)
    return replace(
        template,
        args=(
            query,
            key,
            value,
            tuple(c.new for c in chunks),
            tuple(c.cached for c in chunks),
            *template.args[5:],
        ),
        out=out,
        _key=None,
    )  # the template's key is not this call's


def _recurrent_call(template: OpInvoke, chunks: Sequence[Chunk]) -> OpInvoke:
    """castcore::varlen_gated_delta_rule or castcore::varlen_ssd_scan over ``chunks``: the packed row's inputs
    (q, k, v, a, b; x, dt, b, c) at their tokens, a state a sequence."""
    tokens = sum(c.new for c in chunks)
    count, like = RECURRENT[template.name]
    rows = [TensorMeta((1, tokens, *x.shape[2:]), x.dtype) for x in template.args[:count]]
    state = template.args[7]
    states = TensorMeta((len(chunks), *state.shape[1:]), state.dtype)
    return replace(
        template,
        args=(
            *rows,
            *template.args[count:7],
            states,
            tuple(c.new for c in chunks),
            tuple(c.cached for c in chunks),
            *template.args[10:],
        ),
        out=(rows[like], states),
        _key=None,
    )


def _sparse_call(template: OpInvoke, chunks: Sequence[Chunk]) -> OpInvoke:
    """DeepSeek-V3.2's packed indexer or sparse attention over ``chunks``: queries at their tokens, keys (the
    index keys, the latent entries) at their sequences' cached and new tokens."""
    new, cached = tuple(c.new for c in chunks), tuple(c.cached for c in chunks)
    tokens, keys = sum(new), sum(new) + sum(cached)
    q, second, third = template.args[:3]
    if template.name == INDEXER:  # q [1, T, heads, dim], weights [1, T, heads], keys [1, K, dim]
        args = (
            TensorMeta((1, tokens, *q.shape[2:]), q.dtype),
            TensorMeta((1, tokens, second.shape[-1]), second.dtype),
            TensorMeta((1, keys, third.shape[-1]), third.dtype),
        )
        out = TensorMeta((1, tokens, template.argument("topk")), torch.int32)
    else:  # q [1, heads, T, width], latent [1, 1, K, width], indices [1, T, topk]
        args = (
            TensorMeta((1, q.shape[1], tokens, q.shape[3]), q.dtype),
            TensorMeta((1, 1, keys, second.shape[3]), second.dtype),
            TensorMeta((1, tokens, third.shape[2]), third.dtype),
        )
        out = TensorMeta((1, tokens, q.shape[1], template.argument("rank")), q.dtype)
    return replace(template, args=(*args, new, cached, *template.args[5:]), out=out, _key=None)
