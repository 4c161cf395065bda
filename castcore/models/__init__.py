"""Model sources: shipped presets (config facts, no weights) and config.json files."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import torch

from .hf import build_causal_lm

DEFAULT_MODEL = "llama-3-8b"
DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16,
          "fp32": torch.float32, "float32": torch.float32}


class ModelError(ValueError):
    """A model spec castcore cannot build; the message says what is accepted."""


@dataclass
class Workload:
    """A model and the inputs of one call to it, with a line saying what it is."""

    model: torch.nn.Module
    args: tuple = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    description: str = ""


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
    raise ModelError(f"unknown model {spec!r}; use a preset ({', '.join(preset_names())}) or a path to a config.json")


def parse_dtype(name: str) -> torch.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise ModelError(f"unknown dtype {name!r}; use one of {', '.join(DTYPES)}") from None


def build_workload(model: str = DEFAULT_MODEL, batch: int = 1, seq: int = 2048, dtype: str = "bf16") -> Workload:
    """A causal LM prefill of ``batch`` sequences of ``seq`` tokens, built on the meta device."""
    if batch < 1 or seq < 1:
        raise ModelError(f"--batch and --seq must be at least 1 (got batch={batch}, seq={seq})")
    config = load_model_config(model)
    module = build_causal_lm(config, parse_dtype(dtype))
    input_ids = torch.zeros((batch, seq), dtype=torch.long, device="meta")
    return Workload(model=module, kwargs={"input_ids": input_ids, "use_cache": False},
                    description=f"{model} prefill, batch {batch}, {seq} tokens, {dtype}")
