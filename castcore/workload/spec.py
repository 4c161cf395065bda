"""What to estimate: the Workload, checked when it is made, and the model sources it can name.

Torch-free on purpose: the command line builds its help and checks its options before torch loads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from importlib import resources
from pathlib import Path
from typing import Any

from castcore.errors import ModelError, did_you_mean
from castcore.tomlfiles import read_json
from castcore.options.catalog import DEPLOYMENT_NAMES, WORKLOAD_OPTIONS, any_value, say
from castcore.options.parts import (
    ACTIVATION_DTYPES,
    BLOCK_FP8,
    DEFAULT_MODEL,
    KV_CACHE_DTYPES,
    KV_READS,
    PHASES,
    WEIGHT_DTYPES,
)
from castcore.workload import checkpoint

__all__ = [
    "ACTIVATION_DTYPES",
    "DEFAULT_MODEL",
    "DEPLOYMENT",
    "KV_CACHE_DTYPES",
    "KV_READS",
    "PHASES",
    "WEIGHT_DTYPES",
    "ModelError",
    "Workload",
    "build_workload",
]
DEPLOYMENT = DEPLOYMENT_NAMES  # how serve passes a deployment on to every step's Workload


@dataclass(frozen=True)
class Workload:
    """One job, fully described: which model, which step of it, and how it is deployed.

    ``model`` is a preset name, a transformers ``config.json`` path, ``package.module:factory``,
    an ``nn.Module`` or a plain function. For a module or function, ``args``/``kwargs`` are its
    inputs; for the others castcore makes the inputs from ``batch``, ``seq``, ``phase`` and ``kv_len``.
    Make one with ``castcore.build_workload``, which checks every option. The fields between ``model`` and
    ``args`` are the options of castcore.options.catalog.WORKLOAD_OPTIONS, in its order (checked on import).
    """

    model: Any = DEFAULT_MODEL
    batch: int = 1
    seq: int = 2048
    dtype: str = "bf16"
    phase: str = "prefill"
    kv_len: int | None = None  # tokens already cached before a decode step; None: ``seq``
    train: bool = False
    all_logits: bool = False  # a prefill's LM head over every position, not only the last (scoring)
    reuse: bool = True
    fuse: bool = (
        True  # deployed kernels (the core's fused ops and the packs' rewrites); False: the eager HF graph
    )
    weights: str | None = None  # weight dtype when quantized (None: ``dtype``)
    activations: str | None = None  # matmul input dtype under W8A8 / FP8 (None: ``dtype``)
    kv_cache: str | None = None  # KV cache dtype (None: ``dtype``)
    kv_reads: str = (
        "group"  # "head": the fused attention reads grouped K/V once per query head (no GQA sharing)
    )
    tp: int = 1  # tensor parallel devices
    sp: bool = False  # sequence parallelism for norms and elementwise ops, over the tp devices
    ep: int = 1  # expert parallel devices (MoE): experts split across them
    attention_dp: int = 1  # attention data-parallel groups of tp devices: ep // tp whenever ep > tp
    ep_kernels: str = (
        "normal"  # expert dispatch and combine: "normal", "low-latency" or "auto" (decode: low-latency)
    )
    expert_skew: float | None = (
        None  # MoE routing skew, a power-law exponent (castcore.recording.routing); None: even
    )
    pp: int = 1  # pipeline stages
    micro_batches: int = 1  # a pipelined prefill's micro-batches
    lora_rank: int | None = None  # multi-LoRA adapters' rank (castcore.deploy.lora)
    adapters: int | None = None  # and how many are resident
    adapter_skew: float | None = (
        None  # how unevenly requests spread over them, a power-law exponent; None: even
    )
    dp: int = 1  # data-parallel replicas
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
        data = {
            f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("args", "kwargs", "model")
        }
        data["model"] = self.model if self.named else type(self.model).__name__
        return data


def _same_fields() -> None:
    """The Workload's fields are the catalog's workload options, with the same defaults: they cannot drift."""
    declared = [(o.name, o.default) for o in WORKLOAD_OPTIONS]
    written = [(f.name, f.default) for f in fields(Workload) if f.name not in ("args", "kwargs")]
    if declared != written:
        raise AssertionError(
            f"Workload's fields {written} differ from the catalog's workload options {declared}"
        )


_same_fields()
_OPTIONS = {o.name: o for o in WORKLOAD_OPTIONS if o.name != "model"}


def build_workload(
    model: Any = DEFAULT_MODEL, *args: Any, kwargs: dict[str, Any] | None = None, **options: Any
) -> Workload:
    """A checked Workload; raises ModelError naming the option at fault and what it accepts.

    ``build_workload("llama-3-70b", phase="decode", batch=32, tp=8, weights="int8")``, or for a model you
    built yourself, ``build_workload(model, input_ids)`` (positional inputs after the model). The options are
    the Workload's fields (castcore.options.catalog.WORKLOAD_OPTIONS; the documentation lists them).
    """
    unknown = [name for name in options if name not in _OPTIONS]
    if unknown:
        raise ModelError(
            f"build_workload has no option {unknown[0]!r}{did_you_mean(unknown[0], _OPTIONS)}; its "
            f"options: {', '.join(_OPTIONS)}"
        )
    values = {name: option.check(options.get(name, option.default)) for name, option in _OPTIONS.items()}
    if isinstance(model, str) and not is_factory(model):  # a checkpoint that ships quantized is priced so
        checkpoint.apply(model, load_model_config(model), options, values)
    _attention_groups(values, given_ep=options.get("ep"))
    work = Workload(model=model, args=tuple(args), kwargs=dict(kwargs or {}), **values)
    _check_together(work, by_groups=options.get("ep") in (None, 1) and work.attention_dp > 1)
    return work


def _attention_groups(values: dict[str, Any], given_ep: Any) -> None:
    """Attention data parallelism is expert parallelism wider than tensor parallelism: ``attention_dp`` groups of
    ``tp`` devices make ``ep`` = attention_dp x tp, and an ``ep`` above ``tp`` makes ep / tp groups."""
    groups, tp, ep = values["attention_dp"], values["tp"], values["ep"]
    if groups > 1:
        if given_ep not in (None, 1, groups * tp):
            raise ModelError(
                f"{say('attention_dp', groups)} groups of {say('tp', tp)} spread the experts over "
                f"{groups * tp} devices: use {say('ep', groups * tp)}, or leave {say('ep')} out"
            )
        values["ep"] = groups * tp
    elif ep > tp and ep % tp == 0:
        values["attention_dp"] = ep // tp


def _check_together(work: Workload, by_groups: bool = False) -> None:
    """The checks of options given together (each value alone passed its option's own check); ``by_groups``: the
    experts' split was given as attention_dp, not ep."""
    if work.phase == "decode" and work.train:
        raise ModelError(
            f"{say('train', True)} goes with {say('phase', 'prefill')}: training has no decode step"
        )
    fault = activation_fault(work.weights, work.activations)
    if fault:
        raise ModelError(fault)
    if work.kv_reads == "head" and not work.fuse:
        raise ModelError(
            f"{say('kv_reads', 'head')} describes castcore's fused attention kernel: drop "
            f"{say('fuse', False)} (the eager graph repeats K/V for every query head itself)"
        )
    model = work.model
    if isinstance(model, str):
        if work.args or work.kwargs:
            raise ModelError(f"{model!r} names a model, so castcore makes its inputs: pass no inputs with it")
        if not is_factory(model):  # a bad name, file or split fails here, before anything is built
            check_model_split(
                model,
                load_model_config(model),
                tp=work.tp,
                ep=work.ep,
                pp=work.pp,
                groups=work.attention_dp if by_groups else 0,
            )
    elif not callable(model):
        raise ModelError(
            f"model must be a preset name, a config.json path, package.module:factory, an nn.Module "
            f"or a function (got {type(model).__name__})"
        )
    elif work.all_logits:
        raise ModelError(
            f"{say('all_logits', True)} applies to a model castcore builds (preset, config.json, "
            "factory); for your own module, pass logits_to_keep (or not) in its inputs"
        )
    _check_parallel(work)  # after the model's own checks, which say more


def activation_fault(weights: str | None, activations: str | None) -> str | None:
    """Why quantized ``activations`` cannot go with ``weights`` (None: the model dtype), with the fix; None when
    engines pair them (plan skips such a pair before running it)."""
    if activations is None:
        return None
    if (weights, activations) == ("mxfp4", "mxfp4"):
        return None  # W4A4 MXFP4 (AMD's Quark checkpoints on MI355X)
    if weights in ("nvfp4", "mxfp4"):
        return (
            f"{say('weights', weights)} quantizes its activations as engines pair them (NVFP4, or "
            f"MXFP8 where the device has an fp4 rate): drop {say('activations')}"
            + (f", or give {say('activations', 'mxfp4')} for W4A4" if weights == "mxfp4" else "")
        )
    if weights != activations and (weights, activations) not in ((BLOCK_FP8, "fp8"), ("int4", "fp8")):
        return (
            f"{say('activations', activations)} multiplies {activations} activations by {activations} weights"
            + (" (or int4 ones: W4A8)" if activations == "fp8" else "")
            + f": add {say('weights', activations)} "
            f"({'W4A4' if activations == 'mxfp4' else 'W8A8'}), or drop {say('activations')} for weight-only "
            "quantization"
        )
    return None


def _check_parallel(work: Workload) -> None:
    tp, ep, batch, n = work.tp, work.ep, work.batch, any_value("N")
    if work.sp and tp == 1:
        raise ModelError(
            f"{say('sp', True)} splits norms and elementwise ops across the tensor-parallel devices: add "
            f"{say('tp', n)} (N > 1), or drop {say('sp')}"
        )
    if ep > 1 and max(tp, ep) % min(tp, ep):
        raise ModelError(
            f"{say('ep', ep)} and {say('tp', tp)}: one must divide the other (experts are split over "
            "the tensor-parallel devices, or attention runs data-parallel across the expert-parallel "
            "ones)"
        )
    if work.micro_batches > 1 and work.pp == 1:
        raise ModelError(
            f"{say('micro_batches')} splits a batch through pipeline stages: add {say('pp', n)} "
            "(N > 1), or drop it"
        )
    if batch % work.micro_batches:
        raise ModelError(
            f"{say('micro_batches', work.micro_batches)} splits the batch of {batch} evenly: use a "
            f"{say('batch')} that divides by it, or fewer micro-batches"
        )
    if work.train and (ep > 1 or work.pp > 1 or work.sp):
        raise ModelError(
            f"{say('train', True)} estimates one device's training step with {say('tp')} only; drop "
            f"{say('ep')}, {say('pp')} and {say('sp')}"
        )


def routed_experts(config: Any) -> int | None:
    """How many routed experts a mixture-of-experts layer of a config (a config.json dict or a transformers config)
    holds; None for a dense model."""
    if not isinstance(config, dict):
        config = config.to_dict() if hasattr(config, "to_dict") else {}
    text = config.get("text_config") or config
    return next(
        (text[k] for k in ("num_local_experts", "num_experts", "n_routed_experts") if text.get(k)), None
    )


def check_model_split(
    name: str, config: dict[str, Any], *, tp: int = 1, ep: int = 1, pp: int = 1, groups: int = 0
) -> None:
    """Refuse a parallel split the model's shape does not allow, naming the option and a value that works (the
    attention_dp ``groups`` that made ``ep`` when they, not ep, were given)."""
    text = config.get("text_config") or config
    layers = text.get("num_hidden_layers") or text.get("n_layer") or text.get("num_layers")
    if pp > 1 and isinstance(layers, int) and pp > layers:
        raise ModelError(
            f"{say('pp', pp)} is more pipeline stages than {name}'s {layers} layers: use "
            f"{say('pp', layers)} or less"
        )
    experts = routed_experts(config)
    if ep > 1:
        given, option = (
            (say("attention_dp", groups), say("attention_dp")) if groups else (say("ep", ep), say("ep"))
        )
        if not isinstance(experts, int):
            raise ModelError(
                f"{given}: {name} has no mixture-of-experts layers to split (no num_local_experts in its "
                f"config); drop {option}"
            )
        if experts % ep:
            over = (
                f" spreads the experts over {groups} groups of {say('tp', tp)}, {ep} devices"
                if groups
                else ""
            )
            fix = f"whose groups times {say('tp')} divide {experts}" if groups else f"that divides {experts}"
            raise ModelError(
                f"{given}{over}: {name}'s {experts} experts do not divide by {ep}; use an {option} {fix}"
            )
    heads = text.get("num_attention_heads") or text.get("n_head")
    if tp > 1 and isinstance(heads, int) and heads % tp:
        raise ModelError(
            f"{say('tp', tp)}: {name}'s num_attention_heads = {heads} does not divide by {tp}; tensor "
            f"parallelism splits the heads evenly (use a {say('tp')} that divides {heads})"
        )


def is_factory(spec: str) -> bool:
    return ":" in spec and not spec.endswith(".json")


def preset_names() -> list[str]:
    folder = resources.files(__package__) / "presets"
    return sorted(p.name.removesuffix(".json") for p in folder.iterdir() if p.name.endswith(".json"))


def load_model_config(spec: str) -> dict[str, Any]:
    """A preset name, or the path of a transformers config.json."""
    if spec in preset_names():
        return json.loads(
            (resources.files(__package__) / "presets" / f"{spec}.json").read_text(encoding="utf-8")
        )
    path = Path(spec)
    if path.suffix == ".json":
        data = read_json(path, ModelError, "model config")
        if not isinstance(data, dict):
            raise ModelError(
                f"model config {path} holds a JSON {type(data).__name__}, not an object: a transformers "
                "config.json is one object with a 'model_type'"
            )
        if not isinstance(data.get("model_type"), str):
            raise ModelError(
                f"model config {path} has no 'model_type'; a transformers config.json names its model "
                "type (llama, qwen2, gpt2, ...)"
            )
        return data
    raise ModelError(
        f"unknown model {spec!r}{did_you_mean(spec, preset_names())}; use a preset "
        f"({', '.join(preset_names())}), a path to a config.json, or package.module:factory"
    )
