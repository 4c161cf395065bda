"""Model sources: shipped presets (config facts, no weights) and config.json files."""

from __future__ import annotations

import json
import importlib
import inspect
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import torch

from .hf import build_causal_lm, decode_inputs

DEFAULT_MODEL = "llama-3-8b"
PHASES = ("prefill", "decode")
DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16,
          "fp32": torch.float32, "float32": torch.float32}


class ModelError(ValueError):
    """A model spec castcore cannot build; the message says what is accepted."""


@dataclass
class Workload:
    """A model and the inputs of one call to it, with a line saying what it is.

    ``inputs_fn`` builds inputs that must be made inside the fake mode (a pre-filled KV cache);
    ``config`` is the transformers config dict when the model came from one.
    """

    model: torch.nn.Module
    args: tuple = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    description: str = ""
    inputs_fn: Callable[[], tuple[tuple, dict]] | None = None
    config: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)  # what a user should know about how it was built


def preset_names() -> list[str]:
    folder = resources.files(__package__) / "presets"
    return sorted(p.name.removesuffix(".json") for p in folder.iterdir() if p.name.endswith(".json"))


def load_model_config(spec: str) -> dict[str, Any]:
    """A preset name, or the path of a transformers config.json."""
    if spec in preset_names():
        return json.loads((resources.files(__package__) / "presets" / f"{spec}.json").read_text(encoding="utf-8"))
    path = Path(spec)
    if path.suffix == ".json":
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ModelError(f"model config {path} does not exist") from None
        except json.JSONDecodeError as exc:
            raise ModelError(f"model config {path} is not valid JSON: {exc}") from None
    raise ModelError(f"unknown model {spec!r}; use a preset ({', '.join(preset_names())}), a path to a "
                     "config.json, or package.module:factory")


def parse_dtype(name: str) -> torch.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise ModelError(f"unknown dtype {name!r}; use one of {', '.join(DTYPES)}") from None


def build_workload(model: str = DEFAULT_MODEL, batch: int = 1, seq: int = 2048, dtype: str = "bf16",
                   phase: str = "prefill", kv_len: int | None = None, train: bool = False) -> Workload:
    """One step of a causal LM: a prefill of ``batch`` x ``seq`` tokens, or a decode of one token per
    sequence over a KV cache of ``kv_len`` tokens. ``model`` may also be ``package.module:factory``."""
    if batch < 1 or seq < 1:
        raise ModelError(f"--batch and --seq must be at least 1 (got batch={batch}, seq={seq})")
    if phase not in PHASES:
        raise ModelError(f"unknown phase {phase!r}; use prefill or decode")
    if phase == "decode" and train:
        raise ModelError("--train goes with --phase prefill: training has no decode step")
    kv_len = seq if kv_len is None else kv_len
    if kv_len < 1:
        raise ModelError(f"--kv-len must be at least 1 (got {kv_len})")
    if _is_factory(model):
        return from_factory(model, batch=batch, seq=seq, dtype=parse_dtype(dtype), phase=phase, kv_len=kv_len,
                            train=train)
    config = load_model_config(model)
    module, note = build_causal_lm(config, parse_dtype(dtype))
    notes = [note] if note else []
    if phase == "decode":
        return Workload(model=module, inputs_fn=decode_inputs(module, batch, kv_len, parse_dtype(dtype)),
                        description=f"{model} decode, batch {batch}, 1 token over {kv_len} cached, {dtype}",
                        config=config, notes=notes)
    input_ids = torch.zeros((batch, seq), dtype=torch.long, device="meta")
    kwargs: dict[str, Any] = {"input_ids": input_ids, "use_cache": False}
    if train:
        kwargs["labels"] = input_ids
    what = "training step (forward + backward)" if train else "prefill"
    return Workload(model=module, kwargs=kwargs, config=config, notes=notes,
                    description=f"{model} {what}, batch {batch}, {seq} tokens, {dtype}")


def _is_factory(spec: str) -> bool:
    return ":" in spec and not spec.endswith(".json")


def from_factory(spec: str, **options: Any) -> Workload:
    """Call ``package.module:factory`` with the options it accepts (batch, seq, dtype, phase, kv_len, train).

    It returns a Workload, an nn.Module and its example inputs as ``(module, args)`` or
    ``(module, args, kwargs)``.
    """
    module_name, _, attr = spec.partition(":")
    if os.getcwd() not in sys.path:  # the castcore script does not put the working directory on the path
        sys.path.insert(0, os.getcwd())
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ModelError(f"cannot load model factory {spec!r}: {exc}") from None
    accepted = inspect.signature(factory).parameters
    takes_all = any(p.kind is p.VAR_KEYWORD for p in accepted.values())
    made = factory(**{k: v for k, v in options.items() if takes_all or k in accepted})
    if isinstance(made, Workload):
        return made
    if isinstance(made, tuple) and made and isinstance(made[0], torch.nn.Module) and len(made) in (2, 3):
        args = made[1] if isinstance(made[1], tuple) else (made[1],)
        return Workload(model=made[0], args=args, kwargs=made[2] if len(made) == 3 else {}, description=spec)
    raise ModelError(f"model factory {spec!r} returned {type(made).__name__}; return a castcore Workload or "
                     "(module, args) or (module, args, kwargs)")
