"""Tensor parallelism as one device sees it: DTensors' local shards, and DTensor's global-shape shadow runs."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Any


def dtensor_type() -> type | None:
    """DTensor, if the program has imported torch.distributed.tensor (castcore never imports it itself)."""
    module = sys.modules.get("torch.distributed.tensor")
    return getattr(module, "DTensor", None)


def local_shards(value: Any) -> Any:
    """``value`` with every DTensor replaced by its local shard: what one device holds."""
    dtensor = dtensor_type()
    if dtensor is None:
        return value
    if isinstance(value, dtensor):
        return value._local_tensor
    if isinstance(value, (list, tuple)):
        return type(value)(local_shards(v) for v in value) if not hasattr(value, "_fields") else value
    if isinstance(value, dict):
        return {k: local_shards(v) for k, v in value.items()}
    return value


@contextmanager
def dtensor_shadow(recorder: Any):
    """Mark the ops DTensor runs on global shapes to infer an output's shape, so they are not recorded.

    torch.distributed.tensor's ShardingPropagator runs each op once on fake global-shape tensors
    inside ``ShardingPropagator._fake_mode_lock`` (a nullcontext unless a test installs a lock);
    wrapping that context is the one place that tells those calls from the real local ones.
    """
    module = sys.modules.get("torch.distributed.tensor._sharding_prop")
    propagator = getattr(module, "ShardingPropagator", None)
    if propagator is None or not hasattr(propagator, "_fake_mode_lock"):
        yield
        return
    previous = propagator._fake_mode_lock

    class Marked:
        def __enter__(self):
            previous.__enter__()
            recorder.shadow += 1

        def __exit__(self, *exc):
            recorder.shadow -= 1
            return previous.__exit__(*exc)

    propagator._fake_mode_lock = Marked()
    try:
        yield
    finally:
        propagator._fake_mode_lock = previous
