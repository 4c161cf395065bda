"""Speculative decoding under traffic: a draft model proposes K tokens, the model verifies them in one pass.

Each decode step of a request then runs K + 1 new tokens through the model (its last token and the K drafts) and
keeps 1 + the accepted drafts. Engines report acceptance per position: the share of steps whose i-th draft was
accepted (vLLM's per-position acceptance rate), which already counts that every earlier one was; a single rate r
is read as r^i at position i (each draft accepted with r once the ones before were). The tokens a step keeps on
average are 1 + the sum of those (Leviathan et al., "Fast Inference from Transformers via Speculative Decoding",
ICML 2023, the expected accepted length).

The draft runs too: a prompt's chunk prefills it as it does the model, and a decode step drafts K tokens one after
another, each a decode step of the draft over the same requests (the first one alongside any prompt chunks).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from castcore.errors import ModelError
from castcore.options.catalog import say
from castcore.simulation.chunks import Chunk, StepTime


def acceptance_rates(text: Any, drafts: int) -> list[float]:
    """Per-position acceptance from ``--acceptance`` (a rate, or one per position for ``drafts`` positions)."""
    where = say("acceptance", text)
    try:
        values = [float(part) for part in str(text).split(",")]
    except ValueError:
        raise ModelError(f"{where}: give a rate (0.7) or one per draft position (0.9,0.7,0.5)") from None
    if any(not 0 <= v <= 1 for v in values):
        raise ModelError(f"{where}: an acceptance rate is a share of the steps, from 0 to 1")
    if len(values) == 1:
        return [values[0] ** (i + 1) for i in range(drafts)]
    if len(values) != drafts:
        raise ModelError(
            f"{where}: {len(values)} positions for {say('spec_tokens', drafts)}; give one rate per draft "
            "token, or a single rate"
        )
    if any(later > earlier for earlier, later in zip(values, values[1:])):
        raise ModelError(
            f"{where}: a position is accepted only when the ones before it were, so the rates cannot "
            "rise along the positions"
        )
    return values


def tokens_per_step(rates: list[float]) -> float:
    """The tokens a verification step keeps on average: its own and the accepted drafts."""
    return 1.0 + sum(rates)


def check_vocabulary(model_vocab: Any, draft: str, draft_vocab: Any) -> None:
    if model_vocab != draft_vocab:
        raise ModelError(
            f"{say('draft_model', draft)}: its vocabulary has {draft_vocab} tokens and the model's "
            f"{model_vocab}; a draft must propose the model's own tokens: give a draft of the same "
            "family"
        )


def speculative_step(model_step: StepTime, draft_step: StepTime, drafts: int) -> StepTime:
    """An iteration's seconds with the draft's work added: the model over the batch as scheduled (a decode entry
    carrying its K drafts), then the draft's K decode steps over the decoding requests, the first with the prompt
    chunks."""

    def step(batch: Sequence[Chunk]) -> float:
        prompts = [chunk for chunk in batch if not _decoding(chunk, drafts)]
        decodes = [Chunk(1, chunk[1]) for chunk in batch if _decoding(chunk, drafts)]
        seconds = model_step(batch)
        if decodes or prompts:
            seconds += draft_step(prompts + decodes)
        if decodes and drafts > 1:
            seconds += (drafts - 1) * draft_step(decodes)
        return seconds

    return step


def _decoding(chunk: Chunk, drafts: int) -> bool:
    """A verification pass: K + 1 new tokens that sample (a prompt's last chunk of the same size is rare and
    priced the same way)."""
    new, _, sampled = chunk
    return sampled and new == drafts + 1
