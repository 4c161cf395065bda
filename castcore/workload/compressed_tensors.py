"""compressed-tensors checkpoints (``"quant_method": "compressed-tensors"``, as llm-compressor writes them): their
scheme as castcore's options, and the modules they leave unquantized. Torch-free.

A quantization_config holds ``config_groups``, each a scheme (``weights``, ``input_activations``) applied to the
modules its ``targets`` name; ``ignore`` lists the modules left in the model dtype, by name or as a regular
expression after ``re:``; ``kv_cache_scheme`` quantizes the KV cache. Field names and meanings: the
compressed-tensors library's QuantizationConfig, QuantizationScheme and QuantizationArgs
(src/compressed_tensors/quantization/quant_config.py, quant_scheme.py, quant_args.py,
https://github.com/neuralmagic/compressed-tensors, read 2026-11-29).
"""

from __future__ import annotations

import re
from typing import Any

from castcore.errors import ModelError
from castcore.options.parts import BLOCK_FP8

METHOD = "compressed-tensors"
PRICED = (
    "int4 or int8 weights (weight-only), int8 or fp8 W8A8, int4 weights with fp8 activations, fp8 in 128x128 "
    "blocks and nvfp4, each targeting Linear"
)


def options(model: str, found: dict[str, Any]) -> dict[str, str]:
    """castcore's --weights, --activations and --kv-cache for the checkpoint's scheme."""
    groups = found.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise ModelError(
            f"{model}: its compressed-tensors quantization_config has no config_groups object: castcore reads "
            'the scheme from it, as in {"config_groups": {"group_0": {"targets": ["Linear"], "weights": ...}}}'
        )
    schemes = {_scheme(model, name, group) for name, group in groups.items()}
    if len(schemes) > 1:
        raise ModelError(
            f"{model}: its compressed-tensors config_groups quantize with {len(schemes)} different schemes; "
            f"castcore prices one scheme for every quantized linear layer ({PRICED})"
        )
    chosen = dict(schemes.pop())
    cache = _kv_cache(model, found.get("kv_cache_scheme"))
    if cache is not None:
        chosen["kv_cache"] = cache
    return chosen


def ignored(found: dict[str, Any]) -> tuple[str, ...]:
    """The ``ignore`` list as castcore.workload.checkpoint.listed reads names: ``re:`` expressions as they are,
    module names matched literally."""
    names = found.get("ignore") or ()
    return tuple(str(n)[3:] if str(n).startswith("re:") else re.escape(str(n)) for n in names)


def group_size(found: dict[str, Any]) -> int | None:
    """The weights' columns per scale under the group strategy; None for any other."""
    for group in (found.get("config_groups") or {}).values():
        weights = group.get("weights") if isinstance(group, dict) else None
        size = weights.get("group_size") if isinstance(weights, dict) else None
        if isinstance(size, int) and size > 0:
            return size
    return None


def _scheme(model: str, name: str, group: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(group, dict):
        raise ModelError(f"{model}: its compressed-tensors config group {name!r} is not an object")
    targets = group.get("targets") or []
    if list(targets) != ["Linear"]:
        raise ModelError(
            f"{model}: its compressed-tensors config group {name!r} targets {list(targets)}; castcore prices "
            'groups that target ["Linear"], the modules left out named in the ignore list'
        )
    weights = _args(model, name, "weights", group.get("weights"))
    if weights is None:
        raise ModelError(f"{model}: its compressed-tensors config group {name!r} quantizes no weights")
    activations = _args(model, name, "input_activations", group.get("input_activations"))
    pair = _pair(weights, activations)
    if pair is None:
        raise ModelError(
            f"{model}: its compressed-tensors config group {name!r} stores {_words(weights)} weights with "
            f"{_words(activations) if activations else 'unquantized'} activations, not a scheme castcore prices "
            f"({PRICED})"
        )
    return tuple(pair.items())


def _args(model: str, group: str, field: str, args: Any) -> dict[str, Any] | None:
    if args is None:
        return None
    if (
        not isinstance(args, dict)
        or str(args.get("type")).lower() not in ("int", "float")
        or not isinstance(args.get("num_bits"), int)
    ):
        raise ModelError(
            f"{model}: its compressed-tensors config group {group!r} has {field} {args!r}: castcore needs an "
            'object with "num_bits" and a "type" of "int" or "float"'
        )
    return args


def _words(args: dict[str, Any] | None) -> str:
    return f"{args['num_bits']}-bit {args['type']}" if args else "unquantized"


def _pair(weights: dict[str, Any], activations: dict[str, Any] | None) -> dict[str, str] | None:
    """The options for a weights/activations pair; None when castcore has no kernel for it."""
    kind = (str(weights["type"]).lower(), weights["num_bits"])
    acts = (str(activations["type"]).lower(), activations["num_bits"]) if activations else None
    if kind == ("float", 4) and acts in (None, ("float", 4)):
        return {"weights": "nvfp4"}  # castcore's nvfp4 runs W4A4 where the device has an fp4 rate
    if kind == ("float", 8) and weights.get("strategy") == "block":
        block = weights.get(
            "block_structure"
        )  # [128, 128], or "128x128" as the library's first releases wrote it
        if (block.split("x") if isinstance(block, str) else list(block or [])) not in (
            ["128", "128"],
            [128, 128],
        ):
            return None
        return {"weights": BLOCK_FP8}
    if kind == ("float", 8):
        return {"weights": "fp8", "activations": "fp8"} if acts == ("float", 8) else {"weights": "fp8"}
    if kind == ("int", 8):
        if acts == ("int", 8):  # W8A8 int8, activations per token as vLLM's dynamic scheme runs them
            return {"weights": "int8", "activations": "int8"}
        return {"weights": "int8"} if acts is None else None
    if kind == ("int", 4):
        if acts == ("float", 8):
            return {"weights": "int4", "activations": "fp8"}
        return {"weights": "int4"} if acts is None else None
    return None


def _kv_cache(model: str, scheme: Any) -> str | None:
    if scheme is None:
        return None
    kind = (str(scheme.get("type")).lower(), scheme.get("num_bits")) if isinstance(scheme, dict) else None
    if kind == ("float", 8):
        return "fp8"
    if kind == ("int", 8):
        return "int8"
    raise ModelError(
        f"{model}: its compressed-tensors kv_cache_scheme {scheme!r} is not one castcore prices (8-bit float or "
        "int)"
    )
