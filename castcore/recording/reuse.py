"""Repeated-layer reuse: capture one of a model's identical layers and replay its records for the rest.

A 70B model runs 80 identical decoder layers on identical input shapes; running each on fake
tensors costs the same dispatch work for the same answer. Layers are candidates when they sit in
one ``nn.ModuleList`` and share classes, parameter shapes and the plain attributes of every
submodule (the layer index aside). The first call of a candidate with a given input signature
is captured for real; later calls with the same signature return fake outputs of the recorded
shapes and append the recorded calls, renamed to their own module and with storages renumbered
(their own weights, their own inputs, fresh activations), so memory liveness stays right and
totals equal a full capture.

A transformers KV cache among the inputs (a decode step's, or one made for use_cache=True) takes
part too: a layer owns ``cache.layers[layer_idx]``, whose state joins the signature; a replay maps
the recorded layer's cache tensors to its own and makes the same changes to its own cache layer (a
grown DynamicCache tensor, a counter). A recorded call that touched any other cache state is not
replayed. Tensor-parallel layers replay too: their records are the local-shard ops and collectives
DTensor issued, and their inputs and outputs are plain tensors. Other objects among the inputs,
DTensor inputs or outputs, and training (autograd needs the real forward) are always run in full.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from castcore.recording.invoke import OpInvoke, TensorMeta
from castcore.recording.repeated_layers import (
    PLAIN,
    call_signature,
    owned_cache_index,
    repeated_layers_by_path,
)


@dataclasses.dataclass
class _Template:
    invokes: list[OpInvoke]
    module: str  # the recorded layer's module path
    first_new_storage: int  # storages numbered from here on were born inside the layer
    weights: dict[str, int]  # parameter name -> storage
    before: list[int | None]  # storages of the tensors _walk passed (None: no op used it), in its order
    outputs: list  # per output leaf: its TensorMeta, or the plain value itself
    out_spec: Any
    cache_changes: list[dict[str, Any]]  # per cache layer: attribute -> new TensorMeta or plain value


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
        self.templates: dict[tuple, _Template | None] = {}  # None: that call cannot be replayed
        self.groups = repeated_layers_by_path(model)
        # Each member layer's own tensors, by name inside the layer.
        members_by_path = {path: layer for members in self.groups for path, layer in members}
        self.layer_state: dict[int, dict[str, torch.Tensor]] = {
            id(layer): {} for layer in members_by_path.values()
        }
        for name, t in state.items():
            for end in (i for i, c in enumerate(name) if c == "."):
                layer = members_by_path.get(name[:end])
                if layer is not None:
                    self.layer_state[id(layer)][name[end + 1 :]] = t
                    break

        # Layers after the first in a group whose weights are all on the meta device: their fakes
        # are made only if they run. Meta only, so code that uses such a weight outside its layer
        # fails loudly (and capture then runs in full) instead of silently computing on a real one.
        self.deferred = {
            id(layer)
            for members in self.groups
            for _, layer in members[1:]
            if all(t.device.type == "meta" for t in self.layer_state[id(layer)].values())
        }

    def deferred_names(self) -> set[str]:
        """Names in ``state`` whose fakes are made only if their layer runs."""
        return {
            f"{path}.{local}"
            for members in self.groups
            for path, layer in members
            if id(layer) in self.deferred
            for local in self.layer_state[id(layer)]
        }

    @contextmanager
    def active(self) -> Iterator[None]:
        patched = []
        for group_id, members in enumerate(self.groups):
            for path, layer in members:
                # a forward set on the instance (a rewrite) is put back after
                own = vars(layer).get("forward")
                layer.forward = self._wrap(
                    layer, layer.forward, group_id, owned_cache_index(layer, path), id(layer) in self.deferred
                )
                patched.append((layer, own))
        try:
            yield
        finally:
            for layer, own in patched:
                if own is None:
                    del layer.forward  # back to the class's forward
                else:
                    layer.forward = own

    def _wrap(
        self, layer: torch.nn.Module, forward: Callable, group_id: int, cache_index: int, deferred: bool
    ) -> Callable:
        weight_storages = None

        def reusing_forward(*args, **kwargs):
            nonlocal weight_storages
            if weight_storages is None:
                weight_storages = {
                    name: self.weights.storage(t) for name, t in self.layer_state[id(layer)].items()
                }
            tensors: list[torch.Tensor] = []
            parts: list[tuple[Any, Any]] = []
            signature = call_signature((args, kwargs), cache_index, tensors, parts)
            key = (group_id, signature)
            template = self.templates.get(key) if signature is not None else None
            if template is not None:
                return self._replay(template, weight_storages, tensors, parts)
            recording = signature is not None and key not in self.templates  # not one that failed already
            start, first_new = len(self.recorder.invokes), self.recorder.storage_count()
            caches = _snapshot(parts) if recording else []
            if deferred:  # its weights were left out of the capture's functional_call: swap fakes in now
                with self.recorder.paused():
                    fakes = {name: self.weights.fake(t) for name, t in self.layer_state[id(layer)].items()}
                with _swapped(layer, fakes):
                    out = forward(*args, **kwargs)
            else:
                out = forward(*args, **kwargs)
            if recording:
                self.templates[key] = self._template(
                    start, first_new, weight_storages, tensors, parts, caches, out
                )
            return out

        return reusing_forward

    def _template(
        self,
        start: int,
        first_new: int,
        weights: dict[str, int],
        tensors: list,
        parts: list,
        caches: list,
        out: Any,
    ) -> _Template | None:
        """What a replay needs of the call just run, or None when replaying it would differ from running it."""
        recorder = self.recorder
        invokes = recorder.invokes[start:]
        before = [recorder.numbered(t) for t in tensors]
        given = set(before)

        def new(value: Any) -> Any:
            """A value the call produced, as a replay remakes it; None if it cannot."""
            if isinstance(value, torch.Tensor):
                storage = None if is_traceable_wrapper_subclass(value) else recorder.numbered(value)
                fresh = storage is not None and storage >= first_new and storage not in given
                return TensorMeta.of(value, storage) if fresh else None
            return value if isinstance(value, PLAIN) else None

        flat_out, spec = pytree.tree_flatten(out)
        outputs = [new(v) for v in flat_out]
        changes = []
        states = {key: state for _, _, held in caches for key, state in held.items()}
        for _, part in parts:
            now, was = vars(part), states[id(part)]
            changes.append({name: new(v) for name, v in now.items() if name not in was or was[name] is not v})
            if was.keys() - now.keys() or any(
                v is None and now[n] is not None for n, v in changes[-1].items()
            ):
                return None
        if any(m is None and v is not None for m, v in zip(outputs, flat_out)):
            return None
        if caches and not _only_own_cache_layers(recorder, caches, {id(part) for _, part in parts}, invokes):
            return None
        _share_equal_keys(invokes)
        return _Template(
            invokes=invokes,
            module=recorder.current_module(),
            first_new_storage=first_new,
            weights=weights,
            before=before,
            outputs=outputs,
            out_spec=spec,
            cache_changes=changes,
        )

    def _replay(self, template: _Template, weights: dict[str, int], tensors: list, parts: list):
        recorder = self.recorder
        with recorder.paused():
            outputs = [_fake_of(m) if type(m) is TensorMeta else m for m in template.outputs]
            cache_values = [
                {name: _fake_of(v) if type(v) is TensorMeta else v for name, v in change.items()}
                for change in template.cache_changes
            ]
        mapping = {storage: weights[name] for name, storage in template.weights.items()}
        # The recorded call's own tensors stand for this call's; each is numbered when first used, as a
        # full capture would.
        pending = {old: t for old, t in zip(template.before, tensors) if old is not None}

        def renumber(storage: int) -> int:
            if storage not in mapping:
                if storage in pending:
                    mapping[storage] = recorder.storage_of(pending[storage])
                elif storage >= template.first_new_storage:  # born inside
                    mapping[storage] = recorder.new_storage_id()
                else:
                    mapping[storage] = storage
            return mapping[storage]

        remapped: dict[int, TensorMeta] = {}  # id(a template TensorMeta) -> this replay's

        def meta(value: TensorMeta) -> TensorMeta:
            new = remapped.get(id(value))
            if new is None:
                # Positional construction: several times faster than dataclasses.replace here.
                new = remapped[id(value)] = (
                    value
                    if value.storage < 0
                    else TensorMeta(
                        value.shape,
                        value.dtype,
                        value.stride,
                        value.storage_offset,
                        value.device,
                        renumber(value.storage),
                        value.storage_nbytes,
                    )
                )
            return new

        def remap(value: Any) -> Any:
            kind = type(value)
            if kind is TensorMeta:
                return meta(value)
            if kind is tuple:  # most leaves are plain values: test them here rather than call per leaf
                return tuple(
                    [
                        meta(v) if type(v) is TensorMeta else remap(v) if type(v) in (tuple, dict) else v
                        for v in value
                    ]
                )
            if kind is dict:
                return {k: remap(v) for k, v in value.items()}
            return value

        module = recorder.current_module()
        for invoke in template.invokes:
            recorder.invokes.append(
                OpInvoke(
                    op=invoke.op,
                    args=remap(invoke.args),
                    kwargs=remap(invoke.kwargs),
                    out=remap(invoke.out),
                    module=module + invoke.module[len(template.module) :],
                    index=len(recorder.invokes),
                    attrs=invoke.attrs,
                    _key=invoke.key,
                )
            )
        # The fakes take their ids only now, from the records, where a full capture numbers them.
        for made, value in zip(template.outputs, outputs):
            if type(made) is TensorMeta:
                recorder.bind(value, renumber(made.storage))
        for (_, part), change, values in zip(parts, template.cache_changes, cache_values):
            for name, value in values.items():
                if type(change[name]) is TensorMeta:
                    recorder.bind(value, renumber(change[name].storage))
                setattr(part, name, value)
        return pytree.tree_unflatten(outputs, template.out_spec)


def _snapshot(parts: list) -> list[tuple[Any, list, dict[int, dict]]]:
    """Each KV cache among a call's inputs: its layer list and the attributes of it and of every layer."""
    caches = {id(cache): cache for cache, _ in parts}.values()
    return [
        (cache, list(cache.layers), {id(obj): dict(vars(obj)) for obj in (cache, *cache.layers)})
        for cache in caches
    ]


def _only_own_cache_layers(recorder, caches: list, own: set[int], invokes: list[OpInvoke]) -> bool:
    """Whether the call changed and used no cache state but its own cache layers'."""
    touched = {t.storage for invoke in invokes for t in (*invoke.inputs(), *invoke.outputs())}
    for cache, layers, states in caches:
        if len(cache.layers) != len(layers) or any(a is not b for a, b in zip(cache.layers, layers)):
            return False
        for obj in (cache, *layers):
            if id(obj) in own:
                continue
            now, was = vars(obj), states[id(obj)]
            if now.keys() != was.keys() or any(now[k] is not v for k, v in was.items()):
                return False
            if any(recorder.numbered(t) in touched for t in now.values() if isinstance(t, torch.Tensor)):
                return False
    return True


def _fake_of(meta: TensorMeta) -> torch.Tensor:
    """A fake tensor of meta's shape, stride and offset over a storage of meta's size; must run under the fake mode."""
    dense = torch.empty_strided(meta.shape, meta.stride, dtype=meta.dtype, device="cpu")
    if meta.storage_offset == 0 and dense.untyped_storage().nbytes() == meta.storage_nbytes:
        return dense  # the usual case, and one op where a view of a larger storage takes two
    base = torch.empty(meta.storage_nbytes // meta.element_size(), dtype=meta.dtype, device="cpu")
    return base.as_strided(meta.shape, meta.stride, meta.storage_offset)


def _share_equal_keys(invokes: list[OpInvoke]) -> None:
    """Give invokes with equal keys one key object: replays copy them, and estimate caches then
    find every replayed call by identity instead of comparing its key field by field."""
    first: dict = {}
    for invoke in invokes:
        invoke._key = first.setdefault(invoke.key, invoke.key)


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
