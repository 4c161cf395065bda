"""Built-in draft heads for speculative decoding, named as ``--draft-model``:

- ``mtp``: the model's own multi-token-prediction layers, as DeepSeek-V3 and GLM-4.5 ship them
  (``num_nextn_predict_layers`` in the config): each a decoder layer of the model's kind, a mixture-of-experts
  one where the model's are;
- ``eagle``: one decoder layer of the model's own shape over its features, as EAGLE's draft heads are (Li et al.,
  "EAGLE: Speculative Sampling Requires Rethinking Feature Uncertainty", ICML 2024).

Either is the model cut to those layers, whose embedding and LM head are the model's own: the engine holds them
once, so ``shared_weight_bytes`` are not counted twice. A draft head runs once per draft token, as engines run
them (SGLang's and vLLM's EAGLE and MTP workers). The small projection joining a head's two inputs (EAGLE's and
MTP's ``2h x h``) is left out: under 1% of a layer of these models.
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Any

from castcore.errors import ModelError
from castcore.options.catalog import say
from castcore.plugins.custom_op_dirs import unsafe_reason
from castcore.plugins.packs import cache_dir, write_cache_file

HEADS = ("mtp", "eagle")
FOLDER = "draft-heads"  # in castcore's cache folder
DENSE_FIRST = "first_k_dense_replace"  # DeepSeek's count of dense layers first: an MTP layer is a MoE one


def head_config(config: dict[str, Any], head: str, model: str) -> dict[str, Any]:
    """``config`` cut to the head's layers (a nested text config is cut in place); ModelError when the model ships
    no MTP layers and ``head`` is ``mtp``."""
    found = copy.deepcopy(config)
    text = found["text_config"] if "num_hidden_layers" not in found and "text_config" in found else found
    layers = text.get("num_hidden_layers")
    if not isinstance(layers, int):
        raise ModelError(
            f"{say('draft_model', head)}: {model}'s config gives no num_hidden_layers to take a layer from"
        )
    keep = 1
    if head == "mtp":
        keep = text.get("num_nextn_predict_layers") or 0
        if keep < 1:
            raise ModelError(
                f"{say('draft_model', 'mtp')}: {model} ships no multi-token-prediction layers "
                f"(num_nextn_predict_layers in its config); give {say('draft_model', 'eagle')} or a "
                "draft model"
            )
        if DENSE_FIRST in text:
            text[DENSE_FIRST] = 0
    for key, value in list(text.items()):  # per-layer lists (layer types, windows) keep their first entries
        if isinstance(value, list) and len(value) == layers:
            text[key] = value[:keep]
    text["num_hidden_layers"] = keep
    text.pop("num_nextn_predict_layers", None)
    return found


def draft_source(model: str, config: dict[str, Any], head: str) -> str:
    """A config.json of the head (``head_config``) in the user's own cache folder, named by its content, so the same
    head is the same file and its captures are cached as a model's. Never in the shared temporary folder: there
    another user could plant a file by that name, or a link that makes castcore write over theirs."""
    text = json.dumps(head_config(config, head, model), sort_keys=True).encode()
    digest = hashlib.sha256(text).hexdigest()[:16]
    folder = cache_dir() / FOLDER
    path = folder / f"{head}-{digest}.json"
    if not (_mine(folder) and _mine(path) and _holds(path, text)):
        if not write_cache_file(path, text) or not _mine(folder):
            raise ModelError(
                f"{say('draft_model', head)}: the head's config cannot be kept in {folder} (a folder of "
                "your own that only you may write): set XDG_CACHE_HOME to such a folder"
            )
    return str(path)


def _mine(path: Path) -> bool:
    try:
        return not path.is_symlink() and unsafe_reason(path) is None
    except OSError:
        return False


def _holds(path: Path, text: bytes) -> bool:
    try:
        with path.open("rb") as handle:
            return handle.read(len(text) + 1) == text
    except OSError:
        return False


def is_head(source: Any) -> bool:
    """Whether a draft's model source is a head ``draft_source`` wrote."""
    return isinstance(source, str) and Path(source).parent == cache_dir() / FOLDER


def shared_weight_bytes(config: dict[str, Any], dtype_bytes: float, tp: int) -> int:
    """The bytes of the embedding and the LM head one device holds (split over ``tp``, one matrix when tied): a
    draft head's, which are the model's."""
    text = config.get("text_config") if "num_hidden_layers" not in config else config
    text = text or config
    vocab, hidden = text.get("vocab_size") or 0, text.get("hidden_size") or 0
    matrices = 1 if text.get("tie_word_embeddings") else 2
    return int(matrices * vocab * hidden * dtype_bytes / tp)
