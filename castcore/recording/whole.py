"""Whole ops: a CompositeImplicitAutograd op a plugin claims, recorded as one call instead of its decomposition.

Such an op (aten.linear, aten.matmul, a torch.library op implemented for CompositeImplicitAutograd)
has no kernel of its own below autograd: for CPU tensors, which every fake of a capture is, the
dispatcher runs its decomposition at the AutogradCPU key, above the Python key where the recording
dispatch mode sits, so the mode only ever sees the ops it decomposes into. While a capture runs, each
such op it is asked to keep whole gets a kernel of its own at AutogradCPU (a direct registration
comes before the composite there, and is removed again afterwards): the kernel runs the op's own
decomposition with recording paused and records one call. The dispatcher picks the op and overload,
so every way in is caught (``F.linear``, ``x @ w``, ``torch.ops.ns.op``, a composite calling another)
without mapping Python functions to ops, and no other op pays a Python hop.

In a training step the decomposition runs under autograd, so the backward is recorded as the
decomposition's backward ops: autograd has no other formula for such an op. A call on DTensors (or
another tensor subclass) decomposes as before: DTensor runs only the ops it decomposes into and
records their local shards.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from torch._C import DispatchKey
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack, is_traceable_wrapper_subclass

_KEY = "AutogradCPU"  # the autograd key of the capture's fakes


def decomposes(op: Any) -> bool:
    """Whether a capture sees ``op`` only as the ops it decomposes into: the dispatcher's rule for which
    kernel runs at AutogradCPU (a CompositeImplicitAutograd kernel, and none of its own there or below)."""
    name = op.name()
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    return has(name, "CompositeImplicitAutograd") and not any(
        has(name, key) for key in (_KEY, "CPU", "CompositeExplicitAutograd")
    )


@contextmanager
def kept_whole(recorder: Any, ops: Mapping[Any, frozenset] | Iterable[Any]) -> Iterator[None]:
    """While in here, ``recorder`` records each op of ``ops`` that decomposes as one call, unless the call's
    decomposition runs an op of that op's value: a claim asked before the whole op's wants it (see
    Session.outranking), so that call is recorded op by op."""
    libraries: dict[str, torch.library.Library] = {}
    if not isinstance(ops, Mapping):
        ops = dict.fromkeys(ops, frozenset())
    try:
        for op, outranking in ops.items():
            if decomposes(op):
                if op.namespace not in libraries:
                    libraries[op.namespace] = torch.library.Library(op.namespace, "IMPL")
                libraries[op.namespace].impl(op, _kernel(op, recorder, outranking), _KEY)
        yield
    finally:
        for library in libraries.values():
            library._destroy()


def _kernel(op: Any, recorder: Any, outranking: frozenset):
    def whole(*args, **kwargs):
        if not _records(recorder, args, kwargs):
            return op._op_dk(DispatchKey.CompositeImplicitAutograd, *args, **kwargs)
        with recorder.paused(), recorder.watching() as ran:
            out = op._op_dk(DispatchKey.CompositeImplicitAutograd, *args, **kwargs)
        if outranking and not outranking.isdisjoint(ran):  # run again, recorded op by op
            return op._op_dk(DispatchKey.CompositeImplicitAutograd, *args, **kwargs)
        recorder.record(op, args, kwargs, out)
        return out

    return whole


def _records(recorder: Any, args: tuple, kwargs: dict) -> bool:
    """Whether this call is one the capture records whole: made under the recording mode (not by another
    thread, nor by DTensor inferring a global shape), on plain tensors. (While recording is paused, inside
    another whole op or making a replay's fakes, ``record`` records nothing.)"""
    if recorder not in _get_current_dispatch_mode_stack() or recorder.shadow:
        return False
    return not any(is_traceable_wrapper_subclass(v) for v in pytree.tree_leaves((args, kwargs)))
