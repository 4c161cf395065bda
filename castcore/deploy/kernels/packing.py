"""A mixed batch's tokens packed into one row, as an engine runs an iteration: the chunks it holds, and castcore's
fused attention split per chunk while ``packed`` is on (castcore.serving.mixed_batch captures such a batch)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import torch

from castcore.builtin import recurrent_ops, sparse_attention_ops, ssm_ops  # noqa: F401  (define the varlen ops)
from castcore.builtin.attention_ops import decodes_and_prompts  # (its module defines castcore's attention)
from castcore.errors import ModelError
from castcore.simulation.chunks import Chunk


@dataclass(frozen=True)
class _Plan:
    chunks: tuple[Chunk, ...]
    kv_dtype: torch.dtype


ops = torch.ops.castcore
_plan: ContextVar[_Plan | None] = ContextVar("castcore_mixed_batch", default=None)


def packing_on() -> bool:
    return _plan.get() is not None


@contextmanager
def packed(chunks: Sequence[Chunk], kv_dtype: torch.dtype) -> Iterator[None]:
    """Inside, castcore's fused attention splits the packed row into ``chunks`` (see the module docstring)."""
    token = _plan.set(_Plan(tuple(chunks), kv_dtype))
    try:
        yield
    finally:
        _plan.reset(token)


def packed_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    scale: float,
    causal: bool,
    window: int,
    softcap: float,
    kv_per_query_head: bool,
    sinks: torch.Tensor | None = None,
    chunk: int = 0,
) -> torch.Tensor | None:
    """Under ``packed``: the packed row's attention as one ``castcore::varlen_attention`` kernel, each chunk's
    queries against its cached keys and values (in the cache's dtype) plus its own; None outside ``packed``.
    ``query`` is [1, heads, tokens, dim] of the packed row."""
    plan = _plan.get()
    if plan is None:
        return None
    if query.shape[0] != 1 or query.shape[2] != sum(c.new for c in plan.chunks):
        raise ModelError(
            "a mixed batch runs its tokens packed in one row; this attention call has "
            f"{tuple(query.shape)} queries"
        )
    keys = sum(c.cached + c.new for c in plan.chunks)
    k = key.new_empty((1, key.shape[1], keys, key.shape[-1]), dtype=plan.kv_dtype)
    v = value.new_empty((1, value.shape[1], keys, value.shape[-1]), dtype=plan.kv_dtype)
    return ops.varlen_attention(
        query,
        k,
        v,
        [c.new for c in plan.chunks],
        [c.cached for c in plan.chunks],
        scale,
        causal,
        window,
        softcap,
        kv_per_query_head,
        sinks,
        chunk,
    )


def packed_latent_attention(
    queries: torch.Tensor, kv_b: torch.Tensor, latent_width: int, scale: float
) -> torch.Tensor:
    """Under ``packed``: a multi-head latent attention layer's attention over the packed row, as engines run an
    iteration: the decode sequences in one absorbed ``castcore::varlen_latent_attention`` call, the prompt chunks in
    a decompressed one (vLLM's MLA backends order a batch so, decodes first). ``queries`` [1, heads, tokens,
    nope + rope] of the packed row; ``kv_b`` [heads, nope + v_dim, rank]; ``latent_width`` rank + rope. Only shapes
    are read: a mixed batch is captured on fake tensors -> [1, tokens, heads, v_dim]."""
    heads, width = queries.shape[1], queries.shape[-1]
    outputs = [
        ops.varlen_latent_attention(
            queries.new_empty((1, heads, sum(new), width)),
            queries.new_empty((1, 1, sum(new) + sum(cached), latent_width), dtype=_kv_dtype()),
            kv_b,
            new,
            cached,
            scale,
        )
        for new, cached in _row_sets()
    ]
    return _one(outputs, lambda: queries.new_empty((1, queries.shape[2], heads, outputs[0].shape[-1])))


def packed_sparse_latent(
    query: torch.Tensor,
    index_q: torch.Tensor,
    weights: torch.Tensor,
    rank: int,
    scale: float,
    index_scale: float,
    topk: int,
) -> torch.Tensor:
    """Under ``packed``: DeepSeek-V3.2's sparse attention over the packed row, as engines run an iteration: for
    its decodes and for its prompt chunks, the indexer scoring each sequence's cached and new index keys
    (``castcore::varlen_lightning_indexer``) and the absorbed attention over the latent entries it picked
    (``castcore::varlen_sparse_latent_attention``). ``query`` [1, heads, tokens, rank + rope] (absorbed), ``index_q``
    [1, tokens, index heads, dim], ``weights`` [1, tokens, index heads]; only shapes are read ->
    [1, tokens, heads, rank]."""
    heads, width = query.shape[1], query.shape[-1]
    outputs = []
    for new, cached in _row_sets():
        tokens, keys = sum(new), sum(new) + sum(cached)
        picks = ops.varlen_lightning_indexer(
            index_q.new_empty((1, tokens, *index_q.shape[2:])),
            weights.new_empty((1, tokens, weights.shape[-1])),
            index_q.new_empty((1, keys, index_q.shape[-1])),
            new,
            cached,
            index_scale,
            topk,
        )
        latent = query.new_empty((1, 1, keys, width), dtype=_kv_dtype())
        q = query.new_empty((1, heads, tokens, width))
        outputs.append(ops.varlen_sparse_latent_attention(q, latent, picks, new, cached, rank, scale))
    return _one(outputs, lambda: query.new_empty((1, query.shape[2], heads, rank)))


def packed_chunks() -> tuple[Chunk, ...]:
    """The chunks of the packed row (under ``packed``)."""
    plan = _plan.get()
    assert plan is not None, "packed_chunks runs under packed()"
    return plan.chunks


def packed_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    a_log: torch.Tensor,
    dt_bias: torch.Tensor,
    state: tuple[int, int, int],
) -> torch.Tensor:
    """Under ``packed``: a Gated DeltaNet layer's delta rule over the packed row, as engines run an iteration: the
    decode sequences in one recurrent ``castcore::varlen_gated_delta_rule`` call, the prompt chunks in a chunked
    one, each with its sequences' states (``state``: value_heads, key_dim, value_dim). q, k, v, a, b are the
    packed row's [1, tokens, ...]; only shapes are read -> [1, tokens, value_heads, value_dim]."""
    outputs = []
    for new, cached in _row_sets():
        part = [x.new_empty((1, sum(new), *x.shape[2:])) for x in (q, k, v, a, b)]
        states = v.new_empty((len(new), *state))
        outputs.append(ops.varlen_gated_delta_rule(*part, a_log, dt_bias, states, new, cached)[0])
    return _one(outputs, lambda: v.new_empty(v.shape))


def _row_sets() -> Iterator[tuple[list[int], list[int]]]:
    """The packed row's decodes, then its prompt chunks, each set as its (new, cached) lengths: the two sets latent,
    sparse and linear attention each run one kernel over (under ``packed``)."""
    for chunks in decodes_and_prompts(packed_chunks()):
        if chunks:
            yield [c.new for c in chunks], [c.cached for c in chunks]


def _kv_dtype() -> torch.dtype:
    plan = _plan.get()
    assert plan is not None, "runs under packed()"
    return plan.kv_dtype


def _one(outputs: list[torch.Tensor], empty: Callable[[], torch.Tensor]) -> torch.Tensor:
    """The one kernel's output, or, when both sets ran, the buffer both kernels wrote into (no kernel joins them)."""
    return outputs[0] if len(outputs) == 1 else empty()


def packed_ssd_scan(
    x: torch.Tensor,
    dt: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    params: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    state: torch.Tensor,
    chunk: int,
    dt_min: float,
) -> torch.Tensor:
    """Under ``packed``: a Mamba-2 layer's scan over the packed row, as engines run an iteration: the decode
    sequences in one ``castcore::varlen_ssd_scan`` call (selective_state_update), the prompt chunks in a chunked
    one, each with its sequences' states (``state``: one sequence's, [1, heads, head_dim, state_size]).
    ``params``: a_log, d, dt_bias. x, dt, b, c are the packed row's [1, tokens, ...]; only shapes are read ->
    [1, tokens, heads, head_dim]."""
    outputs = []
    for new, cached in _row_sets():
        part = [t.new_empty((1, sum(new), *t.shape[2:])) for t in (x, dt, b, c)]
        states = state.new_empty((len(new), *state.shape[1:]))
        outputs.append(ops.varlen_ssd_scan(*part, *params, states, new, cached, chunk, dt_min)[0])
    return _one(outputs, lambda: x.new_empty(x.shape))
