"""A decode step's new keys and values written into the static cache by one kernel, as serving engines write them.

transformers' ``StaticLayer.update`` writes keys and values with two ``index_copy_`` calls; vLLM writes both with
one kernel (``reshape_and_cache_flash``, and ``concat_and_cache_mla`` for a latent cache). A plain static layer
(one whose ``update`` is ``StaticLayer``'s, the same in 5.5.0-5.24.0) takes a class whose ``update`` does what that
one does with ``castcore::kv_cache_write`` for the two copies. A sliding-window layer keeps its own ``update``,
which rolls its window.
"""

from __future__ import annotations

import torch

from castcore.builtin import fused_ops  # noqa: F401  (defines the torch.ops.castcore ops)
from castcore.hf.cache import cache_layer_classes, static_update, writes_whole
from castcore.workload.models import BuiltModel

ops = torch.ops.castcore
_WRITTEN_ONCE: dict[type, type] = {}


def write_once(built: BuiltModel) -> int:
    """Make a decode step's static cache layers write keys and values with one kernel; how many layers do (0
    where the step's inputs hold no cache castcore builds: a prefill, a user's own inputs)."""
    inputs = built.inputs_fn
    if getattr(inputs, "with_writes", None) is None:
        return 0
    classes = cache_layer_classes(inputs.config)  # type: ignore[union-attr]
    count = sum(written_once(layer_class) is not layer_class for layer_class in classes)
    if count:
        built.inputs_fn = inputs.with_writes(written_once)  # type: ignore[union-attr]
    return count


def written_once(layer_class: type) -> type:
    """``layer_class`` with an ``update`` that writes both with one kernel, or itself where its update is its own."""
    if layer_class in _WRITTEN_ONCE.values() or not writes_whole(layer_class):
        return layer_class
    if layer_class not in _WRITTEN_ONCE:
        _WRITTEN_ONCE[layer_class] = type(
            f"OneWrite{layer_class.__name__}", (layer_class,), {"update": _update}
        )
    return _WRITTEN_ONCE[layer_class]


def _update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
    return static_update(self, key_states, value_states, ops.kv_cache_write)
