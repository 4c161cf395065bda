"""Model sources: shipped presets (config facts, no weights), config.json files and factories, built on meta."""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch

from castcore.devices.dtypes import MODEL_DTYPES, torch_dtype
from castcore.hf.cache import decode_inputs
from castcore.hf.causal_lm import build_causal_lm
from castcore.workload.spec import ModelError, Workload, load_model_config


@dataclass
class BuiltModel:
    """A built model and the inputs of one call to it, with a line saying what it is.

    ``inputs_fn`` builds inputs that must be made inside the fake mode (a pre-filled KV cache);
    ``config`` is the model's transformers config (a built one, or a config.json dict) when it has one. ``while_capturing()`` is
    entered around the capture: settings castcore changes on a user's own model for that run only.
    """

    model: torch.nn.Module
    args: tuple = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    description: str = ""
    inputs_fn: Callable[[], tuple[tuple, dict]] | None = None
    config: Any = None
    notes: list[str] = field(default_factory=list)  # what a user should know about how it was built
    while_capturing: Callable[[], AbstractContextManager] = nullcontext
    # Batch, tokens and dtype of the KV cache a prefill fills, when they are not the workload's batch, seq and
    # dtype: a user's own model with its own input_ids, or a cache in the --kv-cache dtype (set by quantize).
    kv_cache_shape: tuple[int, int, torch.dtype] | None = None


def parse_dtype(name: str) -> torch.dtype:
    if name not in MODEL_DTYPES:
        raise ModelError(f"unknown dtype {name!r}; use one of {', '.join(MODEL_DTYPES)}")
    return torch_dtype(name)


def build_preset(
    spec: str,
    batch: int,
    seq: int,
    dtype: str,
    phase: str,
    kv_len: int,
    train: bool,
    all_logits: bool = False,
) -> BuiltModel:
    """One step of a causal LM from a preset or config.json: a prefill of ``batch`` x ``seq`` tokens, or a
    decode of one token per sequence over a KV cache of ``kv_len`` tokens.

    A prefill computes the LM head for the last position only (``logits_to_keep``), as inference servers do;
    ``all_logits`` computes it for every position (scoring). Training always needs every position."""
    module, notes = build_causal_lm(load_model_config(spec), parse_dtype(dtype), origin=spec)
    config = module.config
    if phase == "decode":
        return BuiltModel(
            model=module,
            inputs_fn=decode_inputs(module, batch, kv_len, parse_dtype(dtype)),
            description=f"{spec} decode, batch {batch}, 1 token over {kv_len} cached, {dtype}",
            config=config,
            notes=notes,
        )
    input_ids = torch.zeros((batch, seq), dtype=torch.long, device="meta")
    kwargs: dict[str, Any] = {"input_ids": input_ids, "use_cache": False}
    what, logits = "prefill", ""
    if train:
        kwargs["labels"] = input_ids
        what = "training step (forward + backward)"
    elif all_logits:
        logits = ", logits for every token"
    elif "logits_to_keep" in inspect.signature(module.forward).parameters:
        # The last position's index, gathered as vLLM's logits_indices are. (logits_to_keep=1 slices a
        # non-contiguous view, which DTensor's matmul under --tp turns into a bmm reading the LM head per sequence.)
        kwargs["logits_to_keep"] = torch.full((1,), seq - 1, dtype=torch.long, device="meta")
        logits = ", last-token logits"
    else:
        logits = ", logits for every token"
        notes.append(
            f"{type(module).__name__} takes no logits_to_keep, so its prefill computes the LM head "
            "for every token, not only the last one a server samples from"
        )
    return BuiltModel(
        model=module,
        kwargs=kwargs,
        config=config,
        notes=notes,
        description=f"{spec} {what}, batch {batch}, {seq} tokens, {dtype}{logits}",
    )


def load_factory(spec: str) -> Callable[..., Any]:
    """The function ``package.module:factory`` names; ModelError when it cannot be imported or is not callable."""
    module_name, _, attr = spec.partition(":")
    if os.getcwd() not in sys.path:  # the castcore script does not put the working directory on the path
        sys.path.insert(0, os.getcwd())
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ModelError(f"cannot load model factory {spec!r}: {exc}") from None
    if not callable(factory):
        raise ModelError(f"model factory {spec!r} is a {type(factory).__name__}, not a function")
    return factory


def from_factory(spec: str, **options: Any) -> BuiltModel:
    """Call ``package.module:factory`` with the options it accepts (batch, seq, dtype, phase, kv_len, train).

    It returns a BuiltModel, an nn.Module and its example inputs as ``(module, args)`` or
    ``(module, args, kwargs)``.
    """
    factory = load_factory(spec)
    accepted = inspect.signature(factory).parameters
    takes_all = any(p.kind is p.VAR_KEYWORD for p in accepted.values())
    try:
        made = factory(**{k: v for k, v in options.items() if takes_all or k in accepted})
    except Exception as exc:  # the user's code: say whose, in one line
        raise ModelError(f"model factory {spec!r} raised {type(exc).__name__}: {exc}") from None
    if isinstance(made, BuiltModel):
        return made
    if isinstance(made, Workload) and not made.named:  # castcore.build_workload(module, *inputs)
        return BuiltModel(model=made.model, args=made.args, kwargs=dict(made.kwargs), description=spec)
    if isinstance(made, tuple) and made and isinstance(made[0], torch.nn.Module) and len(made) in (2, 3):
        args = made[1] if isinstance(made[1], tuple) else (made[1],)
        return BuiltModel(
            model=made[0], args=args, kwargs=made[2] if len(made) == 3 else {}, description=spec
        )
    raise ModelError(
        f"model factory {spec!r} returned {type(made).__name__}; return castcore.build_workload(module, "
        "*inputs), (module, args) or (module, args, kwargs)"
    )
