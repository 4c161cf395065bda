"""castpack-collectives: alpha-beta ring estimates for torch's functional collectives.

A torch.distributed program under a fake process group emits ``_c10d_functional`` ops;
the core would time them as memory copies, which says nothing about the fabric.
"""

from __future__ import annotations

import torch

import castcore

from .alphabeta import PASSES, RingCost, pick_level, ring_cost

__all__ = ["PASSES", "RingCost", "estimate_collective", "group_size", "pick_level", "ring_cost"]

_ops = torch.ops._c10d_functional


def group_size(invoke: castcore.OpInvoke) -> int:
    """The capture's record of the process group first; else the op's own ``group_size`` argument."""
    n = invoke.attrs.get("group_size")
    if n is None:
        n = invoke.argument("group_size")
    if n is None:
        group = invoke.attrs.get("group_name", invoke.argument("group_name"))
        raise ValueError(f"{invoke.name}: size of process group {group!r} unknown; capture the program after "
                         "torch.distributed.init_process_group so castcore can record it")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"{invoke.name}: group size {n!r} is not a whole number >= 1")
    return n


def estimate_collective(collective: str, nbytes: float, invoke: castcore.OpInvoke,
                        device: castcore.DeviceProfile) -> castcore.Estimate:
    """Wrap ring_cost in an Estimate; the detail says which level was used and why."""
    n = group_size(invoke)
    if n > 1 and not device.interconnect:
        raise ValueError(f"device {device.name!r} has no interconnect levels, so {invoke.name} cannot be timed; "
                         f"add [[interconnect]] to its profile ({device.origin or 'no file'})")
    cost = ring_cost(collective, nbytes, n, device.interconnect, device.comm_op_cost_s)
    detail = {"algorithm": "ring", "level": cost.level.name if cost.level else None, "group_size": n,
              "bytes_moved": cost.bytes_moved, "steps": cost.steps}
    if not cost.fits:
        detail["note"] = (f"group of {n} exceeds every interconnect level; used the outermost, "
                          f"{cost.level.name!r} ({cost.level.devices} devices)")
    return castcore.Estimate(time_s=cost.time_s, comm_s=cost.comm_s, overhead_s=cost.overhead_s,
                             bound="comm" if n > 1 else "none", detail=detail)


@castcore.register_op_estimator(_ops.all_reduce.default)
def _all_reduce(invoke, device):
    return estimate_collective("all_reduce", invoke.inputs()[0].nbytes, invoke, device)


@castcore.register_op_estimator(_ops.all_gather_into_tensor.default)
def _all_gather_into_tensor(invoke, device):
    return estimate_collective("all_gather", invoke.outputs()[0].nbytes, invoke, device)


@castcore.register_op_estimator(_ops.reduce_scatter_tensor.default)
def _reduce_scatter_tensor(invoke, device):
    return estimate_collective("reduce_scatter", invoke.inputs()[0].nbytes, invoke, device)


@castcore.register_op_estimator(_ops.wait_tensor.default)
def _wait_tensor(invoke, device):
    # The collective's own estimate already holds its time; waiting adds no work.
    return castcore.Estimate(time_s=0.0, bound="none")
