"""Repeated-layer reuse: capture one of a model's identical layers and replay its records for the rest.

A 70B model runs 80 identical decoder layers on identical input shapes; running each on fake
tensors costs the same dispatch work for the same answer. Layers are candidates when they sit in
one ``nn.ModuleList`` and share classes, parameter shapes and the plain attributes of every
submodule (the layer index aside). The first call of a candidate with a given input signature
is captured for real; later calls with the same signature return fake outputs of the recorded
shapes and append the recorded calls, renamed to their own module and with storages renumbered
(their own weights, their own inputs, fresh activations), so memory liveness stays right and
totals equal a full capture.

Calls with inputs that are neither tensors nor plain values (a KV cache object) and training
(autograd needs the real forward) are always captured in full.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.utils import _pytree as pytree

from castcore.recording.invoke import OpInvoke, TensorMeta

_PLAIN = (int, float, bool, str, type(None), torch.dtype, torch.device)


def _signature(value: Any) -> Any:
    """A hashable picture of a call's inputs, or None when an input is an object reuse cannot copy."""
    if isinstance(value, torch.Tensor):
        return ("t", tuple(value.shape), value.dtype, tuple(value.stride()) if value.layout == torch.strided else ())
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, (list, tuple)):
        items = [_signature(v) for v in value]
        return None if any(i is None and v is not None for i, v in zip(items, value)) else tuple(items)
    if isinstance(value, dict):
        items = {k: _signature(v) for k, v in value.items()}
        if any(items[k] is None and value[k] is not None for k in value):
            return None
        return tuple(sorted(items.items()))
    return None


def _layer_identity(module: torch.nn.Module) -> tuple:
    """What must match for two layers to run the same ops: for the layer and every submodule, its
    class, its tensors' shapes and dtypes, and its plain attributes (a sliding window, a flag), the
    layer's index aside."""
    return tuple(
        (path, type(sub),
         tuple((n, tuple(t.shape), t.dtype) for n, t in (*sub._parameters.items(), *sub._buffers.items())
               if t is not None),
         tuple(sorted((k, v) for k, v in vars(sub).items()
                      if isinstance(v, _PLAIN) and "idx" not in k and "index" not in k)))
        for path, sub in module.named_modules())


def repeated_layers(model: torch.nn.Module) -> list[list[torch.nn.Module]]:
    """Groups of at least two interchangeable modules, each group from one ModuleList."""
    return [[layer for _, layer in group] for group in _repeated_layers_by_path(model)]


def _repeated_layers_by_path(model: torch.nn.Module) -> list[list[tuple[str, torch.nn.Module]]]:
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
            by_identity.setdefault(_layer_identity(child), []).append((f"{path}.{index}" if path else str(index), child))
        groups += [members for members in by_identity.values() if len(members) > 1]
    return groups


@dataclasses.dataclass
class _Template:
    invokes: list[OpInvoke]
    module: str  # the recorded layer's module path
    first_new_storage: int  # storages numbered from here on were born inside the layer
    weights: dict[str, int]  # parameter name -> storage
    inputs: list[int]  # storages of the input tensors, in flattening order
    outputs: list[TensorMeta]
    out_spec: Any


class LayerReuse:
    """Patches the forward of repeated layers for the duration of one capture.

    ``state`` is the capture's name -> parameter or buffer table, and ``weights`` its fake weights
    (``fake(t)``, ``storage(t)``): the weights of layers after the first in a group are left out of
    the capture's functional_call (``deferred_names``), as replay needs only their storage ids; a
    layer that has to run after all gets its fakes then.
    """

    def __init__(self, recorder, model: torch.nn.Module, state: dict[str, torch.Tensor], weights):
        self.recorder = recorder
        self.weights = weights
        self.templates: dict[tuple, _Template] = {}
        self.groups = _repeated_layers_by_path(model)
        # Each member layer's own tensors, by name inside the layer.
        members_by_path = {path: layer for members in self.groups for path, layer in members}
        self.layer_state: dict[int, dict[str, torch.Tensor]] = {id(layer): {} for layer in members_by_path.values()}
        for name, t in state.items():
            for end in (i for i, c in enumerate(name) if c == "."):
                layer = members_by_path.get(name[:end])
                if layer is not None:
                    self.layer_state[id(layer)][name[end + 1:]] = t
                    break

        # Layers after the first in a group whose weights are all on the meta device: their fakes
        # are made only if they run. Meta only, so code that uses such a weight outside its layer
        # fails loudly (and capture then runs in full) instead of silently computing on a real one.
        self.deferred = {id(layer) for members in self.groups for _, layer in members[1:]
                         if all(t.device.type == "meta" for t in self.layer_state[id(layer)].values())}

    def deferred_names(self) -> set[str]:
        """Names in ``state`` whose fakes are made only if their layer runs."""
        return {f"{path}.{local}" for members in self.groups for path, layer in members
                if id(layer) in self.deferred for local in self.layer_state[id(layer)]}

    @contextmanager
    def active(self) -> Iterator[None]:
        patched = []
        for group_id, members in enumerate(self.groups):
            for _, layer in members:
                layer.forward = self._wrap(layer, layer.forward, group_id, deferred=id(layer) in self.deferred)
                patched.append(layer)
        try:
            yield
        finally:
            for layer in patched:
                del layer.forward  # back to the class's forward

    def _wrap(self, layer: torch.nn.Module, forward: Callable, group_id: int, deferred: bool) -> Callable:
        weight_storages = None

        def reusing_forward(*args, **kwargs):
            nonlocal weight_storages
            if weight_storages is None:
                weight_storages = {name: self.weights.storage(t) for name, t in self.layer_state[id(layer)].items()}
            signature = _signature((args, kwargs))
            key = (group_id, signature)
            template = self.templates.get(key) if signature is not None else None
            if template is not None:
                return self._replay(template, weight_storages, args, kwargs)
            start, first_new = len(self.recorder.invokes), self.recorder.storage_count()
            if deferred:  # its weights were left out of the capture's functional_call: swap fakes in now
                with self.recorder.paused():
                    fakes = {name: self.weights.fake(t) for name, t in self.layer_state[id(layer)].items()}
                with _swapped(layer, fakes):
                    out = forward(*args, **kwargs)
            else:
                out = forward(*args, **kwargs)
            flat_out, spec = pytree.tree_flatten(out)
            if signature is not None and all(isinstance(t, torch.Tensor) for t in flat_out):
                _share_equal_keys(self.recorder.invokes[start:])
                self.templates[key] = _Template(
                    invokes=self.recorder.invokes[start:], module=self.recorder.current_module(),
                    first_new_storage=first_new, weights=weight_storages,
                    inputs=[self.recorder.storage_of(t) for t in _tensors(args, kwargs)],
                    outputs=[TensorMeta.of(t, self.recorder.storage_of(t)) for t in flat_out], out_spec=spec)
            return out

        return reusing_forward

    def _replay(self, template: _Template, weights: dict[str, int], args, kwargs):
        recorder = self.recorder
        with recorder.paused():
            outputs = [torch.empty_strided(m.shape, m.stride, dtype=m.dtype, device="cpu") for m in template.outputs]
        mapping: dict[int, int] = {}
        for name, storage in template.weights.items():
            mapping[storage] = weights[name]
        for old, tensor in zip(template.inputs, _tensors(args, kwargs)):
            mapping[old] = recorder.storage_of(tensor)
        for meta, tensor in zip(template.outputs, outputs):
            mapping[meta.storage] = recorder.storage_of(tensor)

        def renumber(storage: int) -> int:
            if storage not in mapping:
                born_inside = storage >= template.first_new_storage
                mapping[storage] = recorder.new_storage_id() if born_inside else storage
            return mapping[storage]

        remapped: dict[int, TensorMeta] = {}  # id(a template TensorMeta) -> this replay's

        def meta(value: TensorMeta) -> TensorMeta:
            new = remapped.get(id(value))
            if new is None:
                # Positional construction: several times faster than dataclasses.replace here.
                new = remapped[id(value)] = value if value.storage < 0 else TensorMeta(
                    value.shape, value.dtype, value.stride, value.storage_offset, value.device,
                    renumber(value.storage), value.storage_nbytes)
            return new

        def remap(value: Any) -> Any:
            kind = type(value)
            if kind is TensorMeta:
                return meta(value)
            if kind is tuple:  # most leaves are plain values: test them here rather than call per leaf
                return tuple([meta(v) if type(v) is TensorMeta else remap(v) if type(v) in (tuple, dict) else v
                              for v in value])
            if kind is dict:
                return {k: remap(v) for k, v in value.items()}
            return value

        module = recorder.current_module()
        for invoke in template.invokes:
            recorder.invokes.append(OpInvoke(
                op=invoke.op, args=remap(invoke.args), kwargs=remap(invoke.kwargs), out=remap(invoke.out),
                module=module + invoke.module[len(template.module):], index=len(recorder.invokes),
                attrs=invoke.attrs, _key=invoke.key))
        return pytree.tree_unflatten(outputs, template.out_spec)


def _share_equal_keys(invokes: list[OpInvoke]) -> None:
    """Give invokes with equal keys one key object: replays copy them, and estimate caches then
    find every replayed call by identity instead of comparing its key field by field."""
    first: dict = {}
    for invoke in invokes:
        invoke._key = first.setdefault(invoke.key, invoke.key)


def _tensors(args, kwargs) -> list[torch.Tensor]:
    return [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]


@contextmanager
def _swapped(layer: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> Iterator[None]:
    """Put ``tensors`` in place of the layer's parameters and buffers of those names, then put them back."""
    saved = []
    for name, t in tensors.items():
        owner_path, _, leaf = name.rpartition(".")
        owner = layer.get_submodule(owner_path)
        table = owner._parameters if leaf in owner._parameters else owner._buffers
        saved.append((table, leaf, table[leaf]))
        table[leaf] = t
    try:
        yield
    finally:
        for table, leaf, original in reversed(saved):
            table[leaf] = original
