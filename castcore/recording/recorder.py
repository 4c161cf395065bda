"""Running a model or function on fake tensors and recording every operator call as an OpInvoke.

Weights are never allocated: parameters and buffers are replaced by fake CPU tensors of the same shape for the
duration of the call (through functional_call, so the user's module is left untouched), on meta or a real device.
"""

from __future__ import annotations

import functools
import gc
import itertools
import threading
from collections.abc import Callable, Iterable, Mapping
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensorDeviceMismatchError,
    FakeTensorMode,
    UnsupportedOperatorException,
)
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.module_tracker import ModuleTracker

from castcore.errors import CastcoreError
from castcore.options.catalog import say
from castcore.recording import hints, routing
from castcore.recording.dtensor import dtensor_shadow, dtensor_type, local_shards
from castcore.recording.fake_weights import FakeWeights, fake_inputs
from castcore.recording.fakes import fake_in_any_dtype
from castcore.recording.invoke import OpInvoke, tensors_in, to_meta
from castcore.recording.reuse import LayerReuse
from castcore.recording.whole import kept_whole

# Namespaces whose calls are bookkeeping, not work a device does.
SKIPPED_NAMESPACES = {"prim"}


class CaptureError(CastcoreError, RuntimeError):
    """The model could not be run on fake tensors; the message names the op and the fix."""


@dataclass
class Capture:
    """Every operator call, and which storages were weights, inputs and the call's outputs."""

    invokes: list[OpInvoke]
    weight_storages: dict[int, int] = field(default_factory=dict)  # storage id -> bytes
    input_storages: dict[int, int] = field(default_factory=dict)
    output_storages: set[int] = field(default_factory=set)
    # Tensors held inside input objects, such as a KV cache: state the call reads and updates.
    state_storages: dict[int, int] = field(default_factory=dict)


class _Tracker(ModuleTracker):
    """ModuleTracker that also numbers each entry: of the modules open at once, the one entered last is the
    one running (innermost in a forward; in a backward, whose stale entries ModuleTracker keeps, the set
    alone would leave the choice to the hash seed)."""

    def __init__(self) -> None:
        super().__init__()
        self.entered: dict[str, int] = {}  # module path -> when it was last entered
        self._clock = itertools.count(1)

    def _get_append_fn(self, name, is_bw):
        add = super()._get_append_fn(name, is_bw)

        def fn(*args) -> None:
            add(*args)
            self.entered[name] = next(self._clock)

        return fn


class _Recorder(TorchDispatchMode):
    def __init__(self, tracker: _Tracker, progress: Callable[[int], None] | None = None):
        super().__init__()
        self.tracker = tracker
        self.progress = progress
        self.invokes: list[OpInvoke] = []
        self._storage_ids: dict[Any, int] = {}  # StorageWeakRef(...).cdata -> storage id
        self._ids_handed_out = 0
        self._keep_alive: list = []  # storages stay referenced so their addresses are never reused
        self._paused = False
        self._seen: list | None = None  # while watching(): every op dispatched here, recorded or not
        self.shadow = 0  # > 0 while DTensor's sharding propagation runs an op on global shapes

    @contextmanager
    def paused(self):
        """Ops run in here are not recorded (fake outputs made by layer reuse)."""
        self._paused, was = True, self._paused
        try:
            yield
        finally:
            self._paused = was

    @contextmanager
    def watching(self):
        """The ops dispatched in here, recorded or not (a whole op's decomposition, run while paused)."""
        self._seen, was = [], self._seen
        try:
            yield self._seen
        finally:
            if was is not None:
                was += self._seen
            self._seen = was

    def storage_count(self) -> int:
        return self._ids_handed_out

    def new_storage_id(self) -> int:
        """The next storage id. Called on its own, for a storage no tensor has yet: one that exists only
        in replayed records, or a weight whose fake is made only if its layer runs (see ``bind``)."""
        self._ids_handed_out += 1
        return self._ids_handed_out - 1

    def bind(self, t: torch.Tensor, storage: int) -> None:
        """Number t's storage ``storage``, an id handed out earlier by ``new_storage_id``."""
        untyped = t.untyped_storage()
        self._storage_ids[StorageWeakRef(untyped).cdata] = storage
        self._keep_alive.append(untyped)

    def numbered(self, t: torch.Tensor) -> int | None:
        """t's storage id if it already has one; unlike storage_of, never hands one out."""
        if t.layout != torch.strided:
            return None
        return self._storage_ids.get(StorageWeakRef(t.untyped_storage()).cdata)

    def storage_of(self, t: torch.Tensor) -> int:
        if t.layout != torch.strided:
            return -1
        storage = t.untyped_storage()
        key = StorageWeakRef(storage).cdata
        if key not in self._storage_ids:
            self._storage_ids[key] = self.new_storage_id()
            self._keep_alive.append(storage)
        return self._storage_ids[key]

    def storages(self, value: Any) -> dict[int, int]:
        value = local_shards(value)
        return {
            t.storage: t.storage_nbytes for t in tensors_in(to_meta(value, self.storage_of)) if t.storage >= 0
        }

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.shadow:  # DTensor inferring a global output shape: no device runs this
            return func(*args, **kwargs)
        dtensor = dtensor_type()
        if dtensor is not None and any(issubclass(t, dtensor) for t in types):
            # Let DTensor run the op: the local ops and collectives it issues come back here with
            # local shard shapes, which is what one device does.
            return NotImplemented
        try:
            out = fake_in_any_dtype(func, args, kwargs)
        except CaptureError:
            raise
        except (DynamicOutputShapeException, DataDependentOutputException) as exc:
            raise CaptureError(
                f"{func} needs tensor values to decide its output shape ({type(exc).__name__}); fake tensors "
                "carry none: write that step with static shapes or give its module an estimator"
            ) from None
        except Exception as exc:
            if func.namespace in ("aten", "prim") and not isinstance(exc, UnsupportedOperatorException):
                raise
            first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise CaptureError(
                f"operator {func._schema.name} cannot run on fake tensors ({first_line}); give it a fake "
                f"implementation with torch.library.register_fake('{func._schema.name}'), or define it with "
                "castcore.register_op and a dimension annotation"
            ) from None
        if self._seen is not None:
            self._seen.append(func)
        self.record(func, args, kwargs, out)
        return out

    def record(self, func, args: tuple, kwargs: dict, out: Any) -> None:
        """Append one call, unless recording is paused or its op is bookkeeping."""
        if func.namespace in SKIPPED_NAMESPACES or self._paused:
            return
        self.invokes.append(
            OpInvoke(
                op=func,
                args=to_meta(args, self.storage_of),
                kwargs=to_meta(kwargs, self.storage_of),
                out=to_meta(out, self.storage_of),
                module=self.current_module(),
                index=len(self.invokes),
                attrs=_attrs(func, args, kwargs),
            )
        )
        if self.progress is not None and len(self.invokes) % 256 == 0:
            self.progress(len(self.invokes))

    def current_module(self) -> str:
        parents = [p for p in self.tracker.parents if p != "Global"]
        return max(parents, key=self.tracker.entered.__getitem__) if parents else ""


@functools.cache
def _group_name_position(func) -> int | None:
    """Where an op's ``group_name`` argument sits, if it has one: asked once per op, not per call."""
    names = [a.name for a in func._schema.arguments]
    return names.index("group_name") if "group_name" in names else None


def _attrs(func, args, kwargs) -> dict:
    """Facts the arguments do not carry: a collective's process group size and kernels (castcore.recording.hints),
    an experts block's routing skew (castcore.recording.routing), torch's float32 matmul precision when it allows
    TF32 ("high", "medium": allow_tf32)."""
    precision = torch.get_float32_matmul_precision()
    found = {"float32_matmul_precision": precision} if precision != "highest" else {}
    return {**found, **routing.recorded(), **_group_attrs(func, args, kwargs)}


def _group_attrs(func, args, kwargs) -> dict:
    position = _group_name_position(func)
    if position is None:
        return {}
    name = kwargs.get("group_name", args[position] if position < len(args) else None)
    try:
        from torch.distributed.distributed_c10d import _resolve_process_group

        return {"group_size": _resolve_process_group(name).size(), "group_name": name, **hints.recorded()}
    except Exception:  # no such group in this process: estimators fall back to the op's own arguments
        return {"group_name": name, **hints.recorded()}


@contextmanager
def no_cyclic_gc():
    """Pause Python's cyclic garbage collector: a capture allocates many small objects that live on,
    and full collections over them cost more than the capture's own work (they are not garbage)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


# Module tracking and torch's dispatch modes hook the whole process, so two captures at once would record
# each other's calls: captures take turns. (Estimating a capture needs no turn.)
CAPTURE_LOCK = threading.RLock()


def capture(
    target: torch.nn.Module | Callable,
    *inputs: Any,
    train: bool = False,
    inputs_fn: Callable[[], tuple[tuple, dict]] | None = None,
    progress: Callable[[int], None] | None = None,
    reuse: bool = True,
    whole_ops: Iterable[Any] | Mapping[Any, frozenset] = (),
    **kwargs: Any,
) -> Capture:
    """Run ``target(*inputs, **kwargs)`` on fake tensors and return every operator call it made.

    ``train=True`` records the forward with autograd on and then the backward of its loss (the
    output's ``loss`` if it has one, else the sum of its first tensor).

    ``inputs_fn() -> (args, kwargs)`` builds further inputs inside the fake mode before recording
    starts: for inputs that are not plain tensors, such as a pre-filled KV cache object.
    ``progress(n)`` is called every few hundred recorded calls. ``reuse`` captures one of each set
    of identical layers and replays its records for the others (see castcore.recording.reuse);
    totals are the same as with ``reuse=False``. ``whole_ops`` are OpOverloads to record as one call
    even though torch decomposes them before a dispatch mode sees them (CompositeImplicitAutograd ops
    such as aten.linear; see castcore.recording.whole): the ops a plugin claims, which
    ``Session.whole_ops(device)`` lists. As a mapping, each op's value names ops that outrank it: a call whose
    decomposition runs one of them is recorded op by op (``Session.outranking``). Captures from several threads
    run one at a time.
    """
    # read twice if the capture runs again in full
    whole_ops = dict(whole_ops) if isinstance(whole_ops, Mapping) else dict.fromkeys(whole_ops, frozenset())
    with CAPTURE_LOCK:
        try:
            return _capture(target, inputs, kwargs, train, inputs_fn, progress, reuse, whole_ops)
        except FakeTensorDeviceMismatchError:
            if not reuse:
                raise
            # A replayed layer's weights stay on the meta device; code outside the layer used one, so
            # this model cannot be replayed: capture it in full.
            return _capture(target, inputs, kwargs, train, inputs_fn, progress, False, whole_ops)


def _capture(
    target,
    inputs: tuple,
    kwargs: dict,
    train: bool,
    inputs_fn,
    progress,
    reuse: bool,
    whole_ops: Mapping[Any, frozenset],
) -> Capture:
    tracker = _Tracker()
    recorder = _Recorder(tracker, progress)
    with no_cyclic_gc(), FakeTensorMode(allow_non_fake_inputs=True):
        fake_args = fake_inputs(inputs)
        fake_kwargs = fake_inputs(kwargs)
        if inputs_fn is not None:
            more_args, more_kwargs = inputs_fn()
            fake_args, fake_kwargs = (*fake_args, *more_args), {**fake_kwargs, **more_kwargs}
        weights = FakeWeights(recorder)
        state = _state(target) if isinstance(target, torch.nn.Module) else {}
        # Training needs every forward really run, for autograd.
        layer_reuse = (
            LayerReuse(recorder, target, state, weights)
            if reuse and not train and isinstance(target, torch.nn.Module)
            else None
        )
        deferred = layer_reuse.deferred_names() if layer_reuse else set()
        fake_state = {}
        for name, t in state.items():
            if name not in deferred:
                fake_state[name] = weights.fake(t)
            weights.storage(t)  # every weight numbered now, in state order: ids match with or without reuse
        if isinstance(target, torch.nn.Module):

            def run():
                return torch.func.functional_call(
                    target, fake_state, tuple(fake_args), fake_kwargs, strict=False
                )
        else:

            def run():
                return target(*fake_args, **fake_kwargs)

        given = recorder.storages((fake_args, fake_kwargs))
        held = recorder.storages(_tensors_inside_objects((fake_args, fake_kwargs)))
        reusing = layer_reuse.active() if layer_reuse else nullcontext()
        with (
            torch.set_grad_enabled(train),
            dtensor_shadow(recorder),
            kept_whole(recorder, whole_ops),
            tracker,
            recorder,
            reusing,
        ):
            result = run()
            if train:
                _loss_of(result).backward()
        outputs = set(recorder.storages(result))
    return Capture(
        invokes=recorder.invokes,
        weight_storages=weights.storages(),
        input_storages=given,
        output_storages=outputs,
        state_storages=held,
    )


def _tensors_inside_objects(value: Any, depth: int = 8) -> list[torch.Tensor]:
    """Tensors reachable through the attributes of non-container inputs (e.g. a transformers Cache)."""
    found: list[torch.Tensor] = []
    seen: set[int] = set()

    def walk(v: Any, level: int, inside_object: bool) -> None:
        if id(v) in seen or level > depth:
            return
        seen.add(id(v))
        if isinstance(v, torch.Tensor):
            if inside_object:
                found.append(v)
        elif isinstance(v, (list, tuple)):
            for item in v:
                walk(item, level + 1, inside_object)
        elif isinstance(v, dict):
            for item in v.values():
                walk(item, level + 1, inside_object)
        elif hasattr(v, "__dict__") and not isinstance(v, (torch.nn.Module, type)):
            for item in vars(v).values():
                walk(item, level + 1, True)

    walk(value, 0, False)
    return found


def _loss_of(result: Any) -> torch.Tensor:
    if isinstance(loss := getattr(result, "loss", None), torch.Tensor):
        return loss
    found = tensors_in(result, torch.Tensor)
    if not found or not found[0].requires_grad:
        raise CaptureError(
            f"{say('train', True)} needs the model's output to depend on its weights: it returned no "
            "tensor that requires grad (return a loss, or a tensor computed from the parameters)"
        )
    return found[0].float().sum()


def _state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    # remove_duplicate=False keeps tied weights under each name, as functional_call expects.
    state = dict(module.named_parameters(remove_duplicate=False))
    state.update(module.named_buffers(remove_duplicate=False))
    return state
