"""Linear-attention and state-space layers (Qwen3-Next's Gated DeltaNet, Kimi Linear's delta attention, the Mamba-2
mixers of Nemotron-H and other hybrids): each keeps a fixed-size recurrent state per sequence instead of a KV cache.

castcore prices them only as a prefill on one device for now, running transformers' own reference forward op by
op. Decode steps (which read and write that state), tensor parallelism (which must split their heads as engines do)
and mixed batches are refused in one line before anything is captured, not left to fail inside transformers."""

from __future__ import annotations

from torch import nn

from castcore.errors import ModelError
from castcore.options.catalog import say

_KINDS = (  # a class-name part and what the layer is
    ("GatedDeltaNet", "Gated DeltaNet linear-attention layers"),
    ("DeltaAttention", "delta-rule linear-attention layers"),
    ("Mamba", "Mamba state-space layers"),
)


def recurrent_layers(model: nn.Module) -> str | None:
    """What the model's recurrent layers are, as a user reads it, or None when it has none: a kind named by its
    class, or any module holding ``A_log``, the per-head decay each of these kinds learns."""
    modules = list(model.modules())
    for module in modules:
        kind = next((kind for part, kind in _KINDS if part in type(module).__name__), None)
        if kind is not None:
            return kind
    decaying = next((m for m in modules if hasattr(m, "A_log")), None)
    return None if decaying is None else f"state-space layers ({type(decaying).__name__})"


def refuse_unpriced(model: nn.Module, name: str, phase: str, tp: int, packed: bool) -> None:
    """ModelError where castcore cannot yet price the model's recurrent layers as asked (see the module)."""
    found = recurrent_layers(model)
    if found is None:
        return
    asked = (
        "a mixed batch (castcore simulate, plan --rate)"
        if packed
        else say("phase", "decode")
        if phase == "decode"
        else say("tp", tp)
        if tp > 1
        else None
    )
    if asked is not None:
        raise ModelError(
            f"{name}: {asked} is not supported for this model yet: its {found} keep a recurrent state per "
            f"sequence, which castcore prices only in a prefill on one device; use castcore estimate "
            f"{say('phase', 'prefill')} {say('tp', 1)}"
        )
