"""One iteration of a continuous-batching engine captured as the engine runs it: a mixed batch of prefill chunks
and decode tokens, each sequence at its own KV length.

The tokens of every sequence are packed into one row (as vLLM and SGLang flatten a batch), so every linear layer,
norm and collective runs over all of them at once; attention runs per sequence, its chunk of queries against its
own cached keys and values plus the chunk's, in one kernel (``castcore::varlen_attention``; multi-head latent
attention in two, its decodes absorbed and its prompts decompressed: ``castcore::varlen_latent_attention``); the LM head
runs over the sequences that sample a token this iteration. Under ``--pp`` the whole model is captured and split
into stages afterwards (castcore.serving.step_time). Only the deployed kernels' attention can be split this
way, so a mixed batch needs ``fuse`` (not ``--eager``), and it runs castcore's own deployed kernels: a pack's
``fuse_model`` rewrite is not applied (its estimators still price every op they claim).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from castcore.devices.dtypes import torch_dtype
from castcore.errors import ModelError
from castcore.options.catalog import say
from castcore.deploy.kernels.packing import Chunk, packed
from castcore.deploy.pipeline import capture_workload

if TYPE_CHECKING:
    from castcore.devices.profile import DeviceProfile
    from castcore.report.records import Report
    from castcore.deploy.pipeline import Pipeline
    from castcore.workload.spec import Workload

__all__ = ["Chunk", "PACKED_ATTENTION", "capture_mixed", "packed_workload"]

# The kernels a packed row's attention runs as (castcore.deploy.kernels.packing).
PACKED_ATTENTION = (
    "castcore::varlen_attention",
    "castcore::varlen_latent_attention",
    "castcore::varlen_gated_delta_rule",
    "castcore::varlen_ssd_scan",
    "castcore::varlen_lightning_indexer",
    "castcore::varlen_sparse_latent_attention",
)


def packed_workload(base: Workload, chunks: Sequence[Chunk]) -> Workload:
    """The Workload whose prefill runs the packed row: batch 1, the chunks' tokens; the deployment is ``base``'s."""
    if not base.fuse:
        raise ModelError(
            f"a mixed batch splits castcore's fused attention per sequence: drop {say('fuse', False)}"
        )
    if base.micro_batches > 1:
        raise ModelError(
            f"a mixed batch of one packed row does not split into prefill micro-batches: drop "
            f"{say('micro_batches')}"
        )
    if not chunks or any(c.new < 1 or c.cached < 0 for c in chunks):
        raise ModelError("a mixed batch needs at least one sequence, each with at least one new token")
    # Pipeline stages are split from the whole model's ops afterwards (castcore.serving.step_time.Stages).
    return replace(
        base,
        batch=1,
        seq=sum(c.new for c in chunks),
        phase="prefill",
        kv_len=None,
        train=False,
        all_logits=False,
        pp=1,
    )


def capture_mixed(
    pipeline: Pipeline,
    base: Workload,
    chunks: Sequence[Chunk],
    device: str | DeviceProfile | None = None,
    memory: bool = True,
) -> Report:
    """The Report of one engine iteration over ``chunks`` of ``base``'s model and deployment (see the module
    docstring), through the pipeline's capture step when that keeps mixed batches (castcore.sweeps.capture);
    without its memory footprint when ``memory`` is False."""
    workload = packed_workload(base, chunks)
    profile = pipeline.host.device(device)
    sampled = sum(1 for c in chunks if c.samples)

    def sample_rows(built) -> None:  # the LM head over the rows that sample, as vLLM gathers logits_indices
        if "logits_to_keep" in built.kwargs:
            built.kwargs["logits_to_keep"] = torch.zeros((max(sampled, 1),), dtype=torch.long, device="meta")

    kv_dtype = torch_dtype(base.kv_cache or base.dtype)

    def capture():
        with packed(chunks, kv_dtype):
            return capture_workload(pipeline.host, workload, profile, adjust=sample_rows)

    cached = getattr(pipeline.capture_step, "mixed", None)  # a capture cache keeps mixed batches too
    built, captured = (
        cached(
            pipeline.host,
            workload,
            profile,
            tuple((c.new, c.cached, bool(c.samples)) for c in chunks),
            capture,
        )
        if cached is not None
        else capture()
    )
    if not any(invoke.name in PACKED_ATTENTION for invoke in captured.invokes):
        # Its attention never reached castcore's: the row would be priced as one prompt with no cached keys.
        raise ModelError(
            f"{base.model if base.named else type(base.model).__name__}: its attention does not run "
            "through castcore's fused attention (the model keeps its own), so a mixed batch cannot be "
            "split per sequence; simulate needs a model on transformers' attention interface"
        )
    return pipeline.estimate_capture(
        captured,
        profile,
        description=f"{built.description}: a mixed batch of {len(chunks)} sequences, {workload.seq} tokens",
        memory=memory,
        deployed=True,
    )
