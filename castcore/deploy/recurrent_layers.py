"""Linear-attention and state-space layers (Qwen3-Next's Gated DeltaNet, Kimi Linear's delta attention, the Mamba-2
mixers of Nemotron-H and other hybrids): each keeps a fixed-size recurrent state per sequence instead of a KV cache.

Qwen3-Next's Gated DeltaNet, Kimi Linear's delta attention and Nemotron-H's Mamba-2 mixers run as engines run them
in the deployed view (castcore.deploy.kernels.linear_attention, castcore.deploy.kernels.kimi_delta,
castcore.deploy.kernels.mamba): prefill and decode steps and mixed batches, on one device or several (Kimi Linear's
latent attention layers run as DeepSeek's, castcore.deploy.kernels.latent). The other kinds, and those eager
(``--eager``), are priced only as a prefill on one device, running transformers' own reference forward op by op. What castcore cannot price yet is
refused in one line before anything is captured, not left to fail inside transformers: their decode steps (which
read and write that state), tensor parallelism (which must split their heads as engines do) and mixed batches;
and a tensor-parallel size that does not divide a Mamba-2 layer's heads and groups."""

from __future__ import annotations

from torch import nn

from castcore.deploy.kernels.kimi_delta import is_kimi_delta_attention
from castcore.deploy.kernels.latent import is_latent_attention
from castcore.deploy.kernels.linear_attention import is_gated_delta_net
from castcore.deploy.kernels.mamba import is_mamba2_mixer
from castcore.errors import ModelError
from castcore.hf.versions import installed, release
from castcore.options.catalog import say

# The transformers release whose linear-attention cache castcore's Gated DeltaNet and Mamba-2 kernels are checked
# against (castcore.hf.cache.recurrent_state); older releases keep that state in other classes.
LINEAR_CACHE_SINCE = (5, 24)

_KINDS = (  # a class-name part and what the layer is
    ("GatedDeltaNet", "Gated DeltaNet linear-attention layers"),
    ("DeltaAttention", "delta-rule linear-attention layers"),
    ("Mamba", "Mamba state-space layers"),
)


def recurrent_layers(model: nn.Module, deployed: bool = False) -> str | None:
    """What the model's recurrent layers are, as a user reads it, or None when it has none: a kind named by its
    class, or any module holding ``A_log``, the per-head decay each of these kinds learns. ``deployed``: Gated
    DeltaNet layers, Kimi Linear's delta attention and Nemotron-H's Mamba-2 mixers, which the deployed kernels run,
    are not counted."""
    runs = {id(part) for m in model.modules() if deployed and _runs_deployed(m) for part in m.modules()}
    modules = [m for m in model.modules() if id(m) not in runs]
    for module in modules:
        kind = next((kind for part, kind in _KINDS if part in type(module).__name__), None)
        if kind is not None:
            return kind
    decaying = next((m for m in modules if hasattr(m, "A_log")), None)
    return None if decaying is None else f"state-space layers ({type(decaying).__name__})"


def refuse_unpriced(model: nn.Module, name: str, phase: str, tp: int, packed: bool, deployed: bool) -> None:
    """ModelError where castcore cannot yet price the model's recurrent layers as asked (see the module)."""
    if not isinstance(model, nn.Module):  # a function the user captures: nothing of transformers' to refuse
        return
    found_version = installed("transformers") or "0"
    old = release(found_version) < LINEAR_CACHE_SINCE
    checks = (is_gated_delta_net, is_mamba2_mixer, is_kimi_delta_attention)
    gated, mamba, kimi = (any(map(check, model.modules())) for check in checks)
    if deployed and kimi:
        _kimi_refusal(model, name, packed)
    if deployed and old and (gated or (mamba and (phase == "decode" or packed))):
        layers = "Gated DeltaNet layers run" if gated else "Mamba-2 layers' decode steps run"
        raise ModelError(
            f"{name}: its {layers} as engines run them with transformers "
            f"{'.'.join(map(str, LINEAR_CACHE_SINCE))} or newer, and {found_version} is installed: "
            "pip install -U transformers"
        )
    if deployed and mamba and tp > 1:
        _refuse_mamba_split(model, name, tp)
    found = recurrent_layers(model, deployed)
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
    if asked is not None and (gated or mamba or (kimi and asked == say("phase", "decode"))):  # eager
        raise ModelError(
            f"{name}: {asked} is not supported with {say('fuse', False)}: its {found} keep a recurrent state per "
            f"sequence, which castcore's deployed kernels run; drop {say('fuse', False)}"
        )
    if asked is not None:
        raise ModelError(
            f"{name}: {asked} is not supported for this model yet: its {found} keep a recurrent state per "
            f"sequence, which castcore prices only in a prefill on one device; use castcore estimate "
            f"{say('phase', 'prefill')} {say('tp', 1)}"
        )


def _runs_deployed(module: nn.Module) -> bool:
    return is_gated_delta_net(module) or is_mamba2_mixer(module) or is_kimi_delta_attention(module)


def _kimi_refusal(model: nn.Module, name: str, packed: bool) -> None:
    """ModelError for a mixed batch of a Kimi Linear whose attention layers are not latent attention castcore
    runs packed (its delta attention runs packed, castcore.deploy.kernels.kimi_delta)."""
    own_attention = any(
        type(m).__name__.endswith("Attention") and not (is_latent_attention(m) or is_kimi_delta_attention(m))
        for m in model.modules()
    )
    if packed and own_attention:
        raise ModelError(
            f"{name}: a mixed batch (castcore simulate, plan --rate) is not supported for this model yet: its "
            "delta-rule linear-attention layers run packed, but its attention layers run the model's own "
            f"attention, which castcore cannot split per sequence; use castcore estimate {say('tp', 1)} or castcore serve"
        )


def _refuse_mamba_split(model: nn.Module, name: str, tp: int) -> None:
    """ModelError where ``tp`` devices cannot split a Mamba-2 layer's heads and groups evenly, as vLLM's
    MambaMixer2 splits them (it replicates a single group instead; castcore does not yet)."""
    mixer = next(m for m in model.modules() if is_mamba2_mixer(m))
    for field, value in (("mamba_num_heads", mixer.num_heads), ("n_groups", mixer.n_groups)):
        if value % tp:
            raise ModelError(
                f"{name}: {say('tp', tp)} is not supported for this model: its Mamba-2 layers' {field} = {value} "
                f"does not divide by {tp}, and each device holds an even share of them (choose a {say('tp')} that "
                "divides it)"
            )
