"""Ascend checkpoints quantized by msModelSlim: the ``quant_model_description.json`` beside config.json, which
vllm-ascend and MindIE read. Torch-free.

The file names the checkpoint's scheme (``"model_quant_type": "W8A8_DYNAMIC"``) and each stored tensor's
(``"model.layers.0.mlp.gate.weight": "FLOAT"`` for one left unquantized). What the schemes are: vllm-ascend's
quantization design document, table "Currently Supported Quantization Algorithms" (W8A8: int8 weights per
channel, int8 activations per tensor, static; W8A8_DYNAMIC: the activations per token, dynamic),
docs/source/developer_guide/Design_Documents/quantization.md, https://github.com/vllm-project/vllm-ascend,
read 2026-11-29.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from castcore.errors import ModelError
from castcore.tomlfiles import read_json

FILE = "quant_model_description.json"
LIMIT = 64 * 2**20  # one entry per stored tensor: a 671B MoE's file is a few MiB
# castcore prices static per-tensor activation scales as it prices per-token ones: the same int8 product, and a
# quantize that reads the row either way
SCHEMES = {
    "W8A8_DYNAMIC": {"weights": "int8", "activations": "int8"},
    "W8A8": {"weights": "int8", "activations": "int8"},
}


def beside(model: str) -> dict[str, Any] | None:
    """The description file beside the config's file, read and checked; None when there is none."""
    path = Path(model).with_name(FILE) if model.endswith(".json") else None
    if path is None or not path.is_file():
        return None
    found = read_json(path, ModelError, "quantization description", limit=LIMIT)
    if not isinstance(found, dict):
        raise ModelError(
            f"{path}: it is not a JSON object: msModelSlim's {FILE} is an object such as "
            '{"model_quant_type": "W8A8_DYNAMIC", "model.layers.0.self_attn.q_proj.weight": "W8A8_DYNAMIC"}'
        )
    return found


def options(model: str, found: dict[str, Any]) -> dict[str, str]:
    scheme = str(found.get("model_quant_type", "")).upper()
    if scheme not in SCHEMES:
        raise ModelError(
            f"{Path(model).with_name(FILE)}: its model_quant_type {scheme or '(none)'!r} is not one castcore "
            f"prices; castcore prices {', '.join(SCHEMES)}"
        )
    return dict(SCHEMES[scheme])


def unquantized(found: dict[str, Any]) -> tuple[str, ...]:
    """The linear layers whose weight the file stores as FLOAT, as castcore.workload.checkpoint.listed reads names."""
    return tuple(
        re.escape(name.removesuffix(".weight"))
        for name, kind in found.items()
        if name.endswith(".weight") and str(kind).upper() == "FLOAT"
    )
