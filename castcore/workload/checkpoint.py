"""A checkpoint's own quantization: a model is priced as it ships, with no flags.

A config.json that carries ``quantization_config`` (transformers' field), or NVIDIA ModelOpt's
``hf_quant_config.json`` or msModelSlim's ``quant_model_description.json`` (Ascend) beside it, says how its
weights (and activations, and KV cache) are stored. ``shipped``
turns that into castcore's options; ``apply`` makes them the workload's defaults and refuses an option given
against them, naming both; ``unquantized`` names the modules the checkpoint leaves unquantized. Torch-free, like
castcore.workload.spec.

gpt-oss's config.json says ``"quant_method": "mxfp4"`` with ``modules_to_not_convert`` listing attention, the
routers, the embedding and the LM head: its experts alone are MXFP4 (the quantization_config transformers'
converter writes, src/transformers/models/gpt_oss/convert_gpt_oss_weights_to_hf.py,
https://github.com/huggingface/transformers, read 2026-11-27). ModelOpt's ``quant_algo`` "NVFP4" stores NVFP4
weights and activations (W4A4) and "W4A8_AWQ" int4 AWQ weights with fp8 activations (TensorRT-LLM's QuantAlgo,
tensorrt_llm/quantization/mode.py, https://github.com/NVIDIA/TensorRT-LLM, read 2026-11-27).
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

from castcore.errors import ModelError
from castcore.options.catalog import say
from castcore.tomlfiles import read_json
from castcore.options.parts import BLOCK_FP8
from castcore.workload import compressed_tensors, modelslim

PRICED = (
    "fp8 (per-tensor or per-channel, or in 128x128 blocks), gptq and awq (4 or 8 bits), mxfp4, "
    "compressed-tensors, ModelOpt's FP8, NVFP4 and W4A8_AWQ, and msModelSlim's W8A8 and W8A8_DYNAMIC"
)
MODELOPT = {
    "FP8": {"weights": "fp8", "activations": "fp8"},
    "NVFP4": {"weights": "nvfp4"},
    "W4A8_AWQ": {"weights": "int4", "activations": "fp8"},
}


def shipped(model: str, config: dict[str, Any]) -> tuple[dict[str, str], str] | None:
    """The options the checkpoint's quantization stands for and where they were read; None when it has none."""
    found = _quantization_config(model, config)
    if found is not None:
        return _from_quantization_config(model, found), "its quantization_config"
    beside = _modelopt_file(model)
    if beside is not None:
        return _from_modelopt(model, beside), str(Path(model).with_name("hf_quant_config.json"))
    described = modelslim.beside(model)
    if described is not None:
        return modelslim.options(model, described), str(Path(model).with_name(modelslim.FILE))
    return None


def _quantization_config(model: str, config: dict[str, Any]) -> dict[str, Any] | None:
    """The config's quantization_config; ModelError when it is there but not an object."""
    found = config.get("quantization_config")
    if found is not None and not isinstance(found, dict):
        raise ModelError(
            f"{model}: its quantization_config is a JSON {_kind(found)}, not an object: it must be an "
            'object such as {"quant_method": "fp8"}'
        )
    return found


def _modelopt_file(model: str) -> dict[str, Any] | None:
    """ModelOpt's hf_quant_config.json beside the config's file, read and its quantization checked; None when there
    is none."""
    beside = Path(model).with_name("hf_quant_config.json") if model.endswith(".json") else None
    if beside is None or not beside.is_file():
        return None
    found = read_json(beside, ModelError, "quantization config")
    quantization = found.get("quantization", {}) if isinstance(found, dict) else found
    if not isinstance(quantization, dict):
        raise ModelError(
            f"{beside}: {'its quantization' if isinstance(found, dict) else 'it'} is a JSON "
            f"{_kind(quantization)}, not an object: ModelOpt's file is an object whose quantization is "
            'an object such as {"quant_algo": "FP8"}'
        )
    return {"quantization": quantization}


def _kind(value: Any) -> str:
    return {str: "string", list: "array", bool: "boolean", int: "number", float: "number"}.get(
        type(value), "null"
    )


def _from_quantization_config(model: str, found: dict[str, Any]) -> dict[str, str]:
    method = str(found.get("quant_method", "")).lower()
    if method == "fp8":
        block = found.get("weight_block_size")
        if block is not None and list(block) != [128, 128]:
            raise ModelError(
                f"{model}: its quantization_config's fp8 weight_block_size {list(block)} is not one "
                "castcore prices (128x128 blocks, or per-tensor and per-channel scales)"
            )
        if block is not None:
            return {"weights": BLOCK_FP8}
        # A dynamic activation scheme quantizes activations as they come (W8A8); a static one was calibrated.
        return {"weights": "fp8", "activations": "fp8"}
    if method in ("gptq", "awq"):
        bits = found.get("bits", found.get("w_bit"))
        if bits in (4, 8):
            return {"weights": f"int{bits}"}
        raise ModelError(
            f"{model}: its quantization_config's {method} with {bits} bits is not one castcore prices "
            "(4 or 8 bits)"
        )
    if method == "mxfp4":
        return {"weights": "mxfp4"}
    if method == compressed_tensors.METHOD:
        return compressed_tensors.options(model, found)
    if method == "modelopt":  # ModelOpt's hf_quant_config.json fields, in config.json
        return _from_modelopt(model, {"quantization": found})
    raise ModelError(
        f"{model}: its quantization_config's quant_method {method or '(none)'!r} is not one castcore "
        f"prices; castcore prices {PRICED}"
    )


def _from_modelopt(model: str, found: dict[str, Any]) -> dict[str, str]:
    quantization = found.get("quantization", {})
    algo = str(quantization.get("quant_algo", "")).upper()
    if algo not in MODELOPT:
        raise ModelError(
            f"{model}: its hf_quant_config.json's quant_algo {algo or '(none)'!r} is not one castcore "
            f"prices; castcore prices {PRICED}"
        )
    options = dict(MODELOPT[algo])
    if str(quantization.get("kv_cache_quant_algo", "")).upper() == "FP8":
        options["kv_cache"] = "fp8"
    return options


def apply(model: str, config: dict[str, Any], given: dict[str, Any], values: dict[str, Any]) -> None:
    """Make the checkpoint's quantization the default of ``values`` (the workload's options, in place); an
    option in ``given`` (what the caller passed) that says otherwise is refused."""
    found = shipped(model, config)
    if found is None:
        return
    options, where = found
    for name, value in options.items():
        if given.get(name) not in (None, value):
            stands = ", ".join(say(n, v) for n, v in options.items())
            raise ModelError(
                f"{say(name, given[name])} contradicts {model}'s own quantization ({where}: "
                f"{stands}); drop {say(name)} to price the checkpoint as it ships"
            )
        values[name] = value


def unquantized(model: str, config: dict[str, Any]) -> tuple[str, ...]:
    """The module names a quantized checkpoint leaves in the model dtype: its quantization_config's
    ``modules_to_not_convert`` (compressed-tensors' ``ignore``), or the ``exclude_modules`` of ModelOpt's file; ()
    when it names none."""
    found = _quantization_config(model, config)
    if found is None:
        found = (_modelopt_file(model) or {}).get("quantization")
    if found is None:
        return modelslim.unquantized(modelslim.beside(model) or {})
    if str(found.get("quant_method", "")).lower() == compressed_tensors.METHOD:
        return compressed_tensors.ignored(found)
    names = found.get("modules_to_not_convert") or found.get("exclude_modules") or ()
    return tuple(str(name) for name in names)


def weight_group(model: str, config: dict[str, Any]) -> int | None:
    """The input columns a 4-bit checkpoint keeps one scale for (gptq's and awq's group_size, compressed-tensors'
    weights.group_size); None when it says none or scales whole channels."""
    found = _quantization_config(model, config) or {}
    if str(found.get("quant_method", "")).lower() == compressed_tensors.METHOD:
        return compressed_tensors.group_size(found)
    size = found.get("group_size", found.get("q_group_size"))
    return size if isinstance(size, int) and size > 0 else None


def listed(path: str, names: tuple[str, ...]) -> bool:
    """Whether module ``path`` is one of ``names`` as transformers reads modules_to_not_convert: a name (a regular
    expression, "model.layers.*.self_attn") matching from the start up to a module boundary, or ending the path."""
    return bool(names) and (_pattern(names).match(path) is not None or path.endswith(names))


@functools.lru_cache(maxsize=8)
def _pattern(names: tuple[str, ...]) -> re.Pattern[str]:
    """Every name in one expression, compiled once: a checkpoint may list a name per layer, and every module of
    the model is checked against them."""
    return re.compile("(?:" + "|".join(f"(?:{name})" for name in names) + r")(?:(?<=\.)|(?=\.|$))")
