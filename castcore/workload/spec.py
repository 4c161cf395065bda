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
from castcore.errors import ModelError

DEFAULT_MODEL = "llama-3-8b"
PHASES = ("prefill", "decode")
WEIGHT_DTYPES = ("bf16", "fp16", "fp8", "int8", "int4")  # --weights
ACTIVATION_DTYPES = ("int8", "fp8")  # --activations: W8A8 with --weights of the same kind
KV_CACHE_DTYPES = ("bf16", "fp16", "fp8", "int8")  # --kv-cache
KV_READS = ("group", "head")  # --kv-reads: a fused attention kernel reads each grouped K/V head once, or per query head
# How a model is deployed, as serve passes them on to every step's Workload.
DEPLOYMENT = ("dtype", "fuse", "weights", "activations", "kv_cache", "kv_reads", "tp", "sp", "ep", "pp", "micro_batches",
              "dp")


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
    fuse: bool = True  # deployed kernels (the core's fused ops and the packs' rewrites); False: the eager HF graph
    weights: str | None = None  # weight dtype when quantized (None: ``dtype``)
    activations: str | None = None  # matmul input dtype under W8A8 / FP8 (None: ``dtype``)
    kv_cache: str | None = None  # KV cache dtype (None: ``dtype``)
    kv_reads: str = "group"  # "head": the fused attention reads grouped K/V once per query head (no GQA sharing)
    tp: int = 1  # tensor parallel devices
    sp: bool = False  # sequence parallelism for norms and elementwise ops, over the tp devices
    ep: int = 1  # expert parallel devices (MoE): experts split across them
    pp: int = 1  # pipeline stages
    micro_batches: int = 1  # a pipelined prefill's micro-batches
    dp: int = 1  # data-parallel replicas
    reuse: bool = True
    args: tuple = ()
    kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def cached_tokens(self) -> int:
        return self.seq if self.kv_len is None else self.kv_len

    @property
    def devices(self) -> int:
        """Devices of one replica (tensor or expert parallel x pipeline stages) and of all of them."""
        return max(self.tp, self.ep) * self.pp

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
                   fuse: bool = True, weights: str | None = None, activations: str | None = None,
                   kv_cache: str | None = None, kv_reads: str = "group", tp: int = 1, sp: bool = False, ep: int = 1,
                   pp: int = 1, micro_batches: int = 1, dp: int = 1, reuse: bool = True,
                   kwargs: dict[str, Any] | None = None) -> Workload:
    """A checked Workload; raises ModelError naming the option at fault and what it accepts.

    ``build_workload("llama-3-70b", phase="decode", batch=32, tp=8, weights="int8")``, or for a model you
    built yourself, ``build_workload(model, input_ids)`` (positional inputs after the model).
    """
    for name, value in (("batch", batch), ("seq", seq), ("tp", tp), ("ep", ep), ("pp", pp),
                        ("micro-batches", micro_batches), ("dp", dp)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ModelError(f"--{name} must be a whole number of at least 1 (got {value!r})")
    if kv_len is not None and (isinstance(kv_len, bool) or not isinstance(kv_len, int) or kv_len < 1):
        raise ModelError(f"--kv-len must be a whole number of at least 1 (got {kv_len!r})")
    if phase not in PHASES:
        raise ModelError(f"unknown phase {phase!r}; use prefill or decode")
    if phase == "decode" and train:
        raise ModelError("--train goes with --phase prefill: training has no decode step")
    _check_dtypes(dtype, weights, activations, kv_cache)
    if kv_reads not in KV_READS:
        raise ModelError(f"--kv-reads {kv_reads!r} is not supported; use one of {', '.join(KV_READS)}")
    if kv_reads == "head" and not fuse:
        raise ModelError("--kv-reads head describes castcore's fused attention kernel: drop --eager (the eager graph "
                         "repeats K/V for every query head itself)")
    if isinstance(model, str):
        if args or kwargs:
            raise ModelError(f"{model!r} names a model, so castcore makes its inputs: pass no inputs with it")
        if not is_factory(model):  # a bad name, file or split fails here, before anything is built
            check_model_split(model, load_model_config(model), tp=tp, ep=ep, pp=pp)
    elif not callable(model):
        raise ModelError(f"model must be a preset name, a config.json path, package.module:factory, an nn.Module "
                         f"or a function (got {type(model).__name__})")
    elif all_logits:
        raise ModelError("--all-logits applies to a model castcore builds (preset, config.json, factory); for your "
                         "own module, pass logits_to_keep (or not) in its inputs")
    _check_parallel(batch, train, tp, sp, ep, pp, micro_batches)  # after the model's own checks, which say more
    return Workload(model=model, batch=batch, seq=seq, phase=phase, kv_len=kv_len, dtype=dtype, train=train,
                    all_logits=all_logits, fuse=fuse, weights=weights, activations=activations, kv_cache=kv_cache,
                    kv_reads=kv_reads, tp=tp, sp=sp, ep=ep, pp=pp, micro_batches=micro_batches, dp=dp, reuse=reuse,
                    args=tuple(args), kwargs=dict(kwargs or {}))


def _check_dtypes(dtype: str, weights: str | None, activations: str | None, kv_cache: str | None) -> None:
    if dtype not in MODEL_DTYPES:
        raise ModelError(f"unknown dtype {dtype!r}; use one of {', '.join(MODEL_DTYPES)}")
    for option, value, accepted in (("--weights", weights, WEIGHT_DTYPES),
                                    ("--activations", activations, ACTIVATION_DTYPES),
                                    ("--kv-cache", kv_cache, KV_CACHE_DTYPES)):
        if value is not None and value not in accepted:
            raise ModelError(f"{option} {value!r} is not supported; use one of {', '.join(accepted)}")
    if activations is not None and weights != activations:
        raise ModelError(f"--activations {activations} multiplies {activations} activations by {activations} weights: "
                         f"add --weights {activations} (W8A8), or drop --activations for weight-only quantization")


def _check_parallel(batch: int, train: bool, tp: int, sp: bool, ep: int, pp: int, micro_batches: int) -> None:
    if sp and tp == 1:
        raise ModelError("--sp splits norms and elementwise ops across the tensor-parallel devices: add --tp N "
                         "(N > 1), or drop --sp")
    if ep > 1 and max(tp, ep) % min(tp, ep):
        raise ModelError(f"--ep {ep} and --tp {tp}: one must divide the other (experts are split over the "
                         "tensor-parallel devices, or attention runs data-parallel across the expert-parallel ones)")
    if ep > tp and batch % (ep // tp):
        raise ModelError(f"--ep {ep} over --tp {tp} runs attention on {ep // tp} data-parallel groups, each a share "
                         f"of the batch: use a --batch that divides by {ep // tp}")
    if micro_batches > 1 and pp == 1:
        raise ModelError("--micro-batches splits a batch through pipeline stages: add --pp N (N > 1), or drop it")
    if batch % micro_batches:
        raise ModelError(f"--micro-batches {micro_batches} splits the batch of {batch} evenly: use a --batch that "
                         f"divides by it, or fewer micro-batches")
    if train and (ep > 1 or pp > 1 or sp):
        raise ModelError("--train estimates one device's training step with --tp only; drop --ep, --pp and --sp")


def check_model_split(name: str, config: dict[str, Any], *, tp: int = 1, ep: int = 1, pp: int = 1) -> None:
    """Refuse a parallel split the model's shape does not allow, naming the option and a value that works."""
    text = config.get("text_config") or config
    layers = text.get("num_hidden_layers") or text.get("n_layer") or text.get("num_layers")
    if pp > 1 and isinstance(layers, int) and pp > layers:
        raise ModelError(f"--pp {pp} is more pipeline stages than {name}'s {layers} layers: use --pp {layers} or less")
    experts = next((text[k] for k in ("num_local_experts", "num_experts", "n_routed_experts") if text.get(k)), None)
    if ep > 1:
        if not isinstance(experts, int):
            raise ModelError(f"--ep {ep}: {name} has no mixture-of-experts layers to split (no num_local_experts "
                             "in its config); drop --ep")
        if experts % ep:
            raise ModelError(f"--ep {ep}: {name}'s {experts} experts do not divide by {ep}; use an --ep that divides "
                             f"{experts}")
    heads = text.get("num_attention_heads") or text.get("n_head")
    if tp > 1 and isinstance(heads, int) and heads % tp:
        raise ModelError(f"--tp {tp}: {name}'s num_attention_heads = {heads} does not divide by {tp}; tensor "
                         f"parallelism splits the heads evenly (use a --tp that divides {heads})")


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
