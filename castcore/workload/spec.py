"""What to estimate: the Workload, checked when it is made, and the model sources it can name.

Torch-free on purpose: the command line builds its help and checks its options before torch loads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from importlib import resources
from pathlib import Path
from typing import Any

from castcore.devices.dtypes import MODEL_DTYPES
from castcore.errors import CastcoreError

DEFAULT_MODEL = "llama-3-8b"
PHASES = ("prefill", "decode")


class ModelError(CastcoreError, ValueError):
    """A model or workload castcore cannot build; the message says what is accepted."""


@dataclass(frozen=True)
class Workload:
    """One job, fully described: which model, which step of it, and how it is deployed.

    ``model`` is a preset name, a transformers ``config.json`` path, ``package.module:factory``,
    an ``nn.Module`` or a plain function. For a module or function, ``args``/``kwargs`` are its
    inputs; for the others castcore makes the inputs from ``batch``, ``seq``, ``phase`` and ``kv_len``.
    Make one with ``castcore.build_workload``, which checks every option.
    """

    model: Any = DEFAULT_MODEL
    batch: int = 1
    seq: int = 2048
    phase: str = "prefill"
    kv_len: int | None = None  # tokens already cached before a decode step; None: ``seq``
    dtype: str = "bf16"
    train: bool = False
    all_logits: bool = False  # a prefill's LM head over every position, not only the last (scoring)
    tp: int = 1
    fuse: bool = False
    reuse: bool = True
    args: tuple = ()
    kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def cached_tokens(self) -> int:
        return self.seq if self.kv_len is None else self.kv_len

    @property
    def named(self) -> bool:
        """True when ``model`` names a model (preset, config, factory) rather than being one."""
        return isinstance(self.model, str)

    def options(self) -> dict[str, Any]:
        """The options as plain data (what ``--json`` reports and a sweep row holds)."""
        # Not asdict: it would deep-copy the model and its inputs (every weight of a real model).
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("args", "kwargs", "model")}
        data["model"] = self.model if self.named else type(self.model).__name__
        return data


def build_workload(model: Any = DEFAULT_MODEL, *args: Any, batch: int = 1, seq: int = 2048, phase: str = "prefill",
                   kv_len: int | None = None, dtype: str = "bf16", train: bool = False, all_logits: bool = False,
                   tp: int = 1, fuse: bool = False, reuse: bool = True,
                   kwargs: dict[str, Any] | None = None) -> Workload:
    """A checked Workload; raises ModelError naming the option at fault and what it accepts.

    ``build_workload("llama-3-70b", phase="decode", batch=32, tp=8, fuse=True)``, or for a model you
    built yourself, ``build_workload(model, input_ids)`` (positional inputs after the model).
    """
    for name, value in (("batch", batch), ("seq", seq), ("tp", tp)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ModelError(f"--{name} must be a whole number of at least 1 (got {value!r})")
    if kv_len is not None and (isinstance(kv_len, bool) or not isinstance(kv_len, int) or kv_len < 1):
        raise ModelError(f"--kv-len must be a whole number of at least 1 (got {kv_len!r})")
    if phase not in PHASES:
        raise ModelError(f"unknown phase {phase!r}; use prefill or decode")
    if phase == "decode" and train:
        raise ModelError("--train goes with --phase prefill: training has no decode step")
    if dtype not in MODEL_DTYPES:
        raise ModelError(f"unknown dtype {dtype!r}; use one of {', '.join(MODEL_DTYPES)}")
    if isinstance(model, str):
        if args or kwargs:
            raise ModelError(f"{model!r} names a model, so castcore makes its inputs: pass no inputs with it")
        if not is_factory(model):
            load_model_config(model)  # a bad name or file fails here, before anything is built
    elif not callable(model):
        raise ModelError(f"model must be a preset name, a config.json path, package.module:factory, an nn.Module "
                         f"or a function (got {type(model).__name__})")
    elif all_logits:
        raise ModelError("--all-logits applies to a model castcore builds (preset, config.json, factory); for your "
                         "own module, pass logits_to_keep (or not) in its inputs")
    return Workload(model=model, batch=batch, seq=seq, phase=phase, kv_len=kv_len, dtype=dtype, train=train,
                    all_logits=all_logits, tp=tp, fuse=fuse, reuse=reuse, args=tuple(args), kwargs=dict(kwargs or {}))


def is_factory(spec: str) -> bool:
    return ":" in spec and not spec.endswith(".json")


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
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ModelError(f"model config {path} does not exist") from None
        except IsADirectoryError:
            raise ModelError(f"model config {path} is a directory; name its config.json") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ModelError(f"model config {path} is not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ModelError(f"model config {path} holds a JSON {type(data).__name__}, not an object: a transformers "
                             "config.json is one object with a 'model_type'")
        if not isinstance(data.get("model_type"), str):
            raise ModelError(f"model config {path} has no 'model_type'; a transformers config.json names its model "
                             "type (llama, qwen2, gpt2, ...)")
        return data
    raise ModelError(f"unknown model {spec!r}; use a preset ({', '.join(preset_names())}), a path to a "
                     "config.json, or package.module:factory")
