"""Which layers of a model are interchangeable, and the picture of a call's inputs: what layer reuse
(castcore.recording.reuse) matches before it replays one layer's records for another.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from castcore.hf.cache import cache_layers

# Attribute and argument values that are compared and replayed as they are.
PLAIN = (int, float, bool, str, type(None), torch.dtype, torch.device)


def call_signature(value: Any, cache_index: int, tensors: list, parts: list) -> Any:
    """A hashable picture of a call's inputs, or None when an input is an object reuse cannot copy.

    Appends the tensors it passes (a cache layer's among them) to ``tensors`` and each KV cache's
    (cache, cache layer) to ``parts``, in an order fixed by the picture, so equal pictures pair up."""
    if isinstance(value, torch.Tensor):
        if is_traceable_wrapper_subclass(value):
            return None  # a DTensor: replay maps plain storages, not shards
        tensors.append(value)
        return (
            "t",
            tuple(value.shape),
            value.dtype,
            tuple(value.stride()) if value.layout == torch.strided else (),
        )
    if isinstance(value, PLAIN):
        return value
    if isinstance(value, dict):
        value = tuple((k, value[k]) for k in sorted(value))
    if isinstance(value, (list, tuple)):
        items = tuple(call_signature(v, cache_index, tensors, parts) for v in value)
        return None if any(i is None and v is not None for i, v in zip(items, value)) else items
    part = _cache_layer(value, cache_index)
    if part is None:
        return None
    parts.append((value, part))
    state = call_signature(vars(part), cache_index, tensors, parts)
    return None if state is None else ("cache", type(value), type(part), state)


def owned_cache_index(layer: torch.nn.Module, path: str) -> int:
    """Which layer of a KV cache a model layer owns: the ``layer_idx`` a transformers layer hands to
    ``cache.update``, else its index in its ModuleList."""
    for sub in layer.modules():
        index = vars(sub).get("layer_idx")
        if isinstance(index, int):
            return index
    return int(path.rpartition(".")[2])


def _cache_layer(value: Any, index: int) -> Any:
    """``value.layers[index]`` when value is a transformers Cache that has it, else None."""
    layers = cache_layers(value)
    part = layers[index] if layers is not None and index < len(layers) else None
    return part if hasattr(part, "__dict__") else None  # its state is read through vars()


def _layer_identity(module: torch.nn.Module) -> tuple:
    """What must match for two layers to run the same ops: for the layer and every submodule, its
    class, its tensors' shapes and dtypes, and its plain attributes (a sliding window, a flag), the
    layer's index aside."""
    return tuple(
        (
            path,
            type(sub),
            tuple(
                (n, tuple(t.shape), t.dtype)
                for n, t in (*sub._parameters.items(), *sub._buffers.items())
                if t is not None
            ),
            tuple(
                sorted(
                    (k, v)
                    for k, v in vars(sub).items()
                    if isinstance(v, PLAIN) and "idx" not in k and "index" not in k
                )
            ),
        )
        for path, sub in module.named_modules()
    )


def repeated_layers(model: torch.nn.Module) -> list[list[torch.nn.Module]]:
    """Groups of at least two interchangeable modules, each group from one ModuleList."""
    return [[layer for _, layer in group] for group in repeated_layers_by_path(model)]


def repeated_layers_by_path(model: torch.nn.Module) -> list[list[tuple[str, torch.nn.Module]]]:
    groups = []
    seen: set[int] = set()  # a module listed twice (shared layers) is patched once
    for path, container in model.named_modules():
        if not isinstance(container, torch.nn.ModuleList):
            continue
        by_identity: dict[tuple, list[tuple[str, torch.nn.Module]]] = {}
        for index, child in enumerate(container):
            if id(child) in seen:
                continue
            seen.add(id(child))
            by_identity.setdefault(_layer_identity(child), []).append(
                (f"{path}.{index}" if path else str(index), child)
            )
        groups += [members for members in by_identity.values() if len(members) > 1]
    return groups
