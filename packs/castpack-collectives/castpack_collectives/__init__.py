"""castpack-collectives: alpha-beta estimates for torch's functional collectives and ``collectives::`` ops.

A torch.distributed program under a fake process group (and tensor parallelism through
``parallelize_module``) emits ``_c10d_functional`` ops; the core would time them as memory
copies, which says nothing about the fabric. Each call here gets the fastest of ring,
recursive doubling (a binomial tree for broadcast), direct and hierarchical over the device
profile's interconnect levels, in NCCL's protocols (LL, LL128, Simple) where a level gives their
step latencies; ``Estimate.detail`` records the choice and the alternatives. castcore's point-to-point send
(``castcore::send``: a pipeline stage's activations, a prompt's KV cache moved from a prefill to a decode instance)
is priced as NCCL sends (castpack_collectives.p2p).
"""

from __future__ import annotations

import torch

from castcore import pack

from . import ops, p2p, protocols
from .alphabeta import (ALGORITHMS, COLLECTIVES, ENGINE, KERNELS, NCCL, CollectiveCost, Phase, bus_bandwidth, bus_factor,
                        collective_cost, flat, phases_time, pick_level)

__all__ = ["ALGORITHMS", "COLLECTIVES", "ENGINE", "KERNELS", "NCCL", "CollectiveCost", "Phase", "bus_bandwidth", "bus_factor",
           "collective_cost", "estimate_collective", "estimate_send", "flat", "group_size", "ops", "p2p", "pick_level",
           "protocols"]

_c10d = torch.ops._c10d_functional
_c10d_pg = torch.ops.c10d
_marked = torch.ops.collectives


def group_size(invoke: pack.OpInvoke) -> int:
    """The capture's record of the process group first; else the op's own ``group_size`` argument."""
    n = invoke.attrs.get("group_size")
    if n is None:
        n = invoke.argument("group_size")
    if n is None and invoke.argument("process_group") is not None:  # c10d:: ops (dist.all_reduce & co)
        n = _process_group_size(invoke.argument("process_group"))
    if n is None:
        group = invoke.attrs.get("group_name", invoke.argument("group_name"))
        size = getattr(group, "size", None)  # a ProcessGroup object passed as group_name
        if callable(size):
            n = size()
        else:
            raise ValueError(f"{invoke.name}: size of process group {group!r} unknown; capture the program after "
                             "torch.distributed.init_process_group so castcore can record it")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"{invoke.name}: group size {n!r} is not a whole number >= 1")
    return n


def _process_group_size(group) -> int | None:
    """The size of the ProcessGroup a ``c10d::`` op receives (boxed as a TorchScript object)."""
    try:
        from torch.distributed import ProcessGroup

        return ProcessGroup.unbox(group).size() if isinstance(group, torch.ScriptObject) else group.size()
    except Exception:
        return None


def estimate_collective(collective: str, nbytes: float, invoke: pack.OpInvoke,
                        device: pack.DeviceProfile) -> pack.Estimate:
    """Time one collective of ``nbytes`` (S, as nccl-tests counts it) with the fastest algorithm."""
    n = group_size(invoke)
    if n > 1 and not device.interconnect:
        raise ValueError(f"device {device.name!r} has no interconnect levels, so {invoke.name} cannot be timed; "
                         f"add [[interconnect]] to its profile ({device.origin or 'no file'})")
    # The kernels that run the call, when the capture recorded them (castcore.recording.hints); else a library's.
    kernels = invoke.attrs.get("kernels")
    algorithms = KERNELS.get(kernels, NCCL)
    # DeepEP's low-latency kernels are not a library's calls: their own fixed cost, where the profile gives one.
    op_cost_s = device.low_latency_a2a_cost_s if kernels == "low-latency" else device.comm_op_cost_s
    cost = collective_cost(collective, nbytes, n, device.interconnect, op_cost_s, algorithms)
    detail = describe(cost)
    return pack.Estimate(time_s=cost.time_s, comm_s=cost.comm_s, overhead_s=cost.overhead_s,
                             bound="comm" if n > 1 else "none", detail=detail)


def describe(cost: CollectiveCost) -> dict:
    """The Estimate detail: chosen algorithm, level(s), traffic, bus bandwidth and every candidate's time."""
    detail = {"collective": cost.collective, "algorithm": cost.algorithm, "level": "+".join(cost.levels) or None,
              "protocol": "+".join(cost.protocols) or None,
              "group_size": cost.ranks, "bytes": cost.nbytes, "bytes_moved": cost.bytes_moved, "steps": cost.steps}
    if cost.ranks > 1:
        detail["bus_bandwidth"] = bus_bandwidth(cost.collective, cost.nbytes, cost.ranks, cost.comm_s)
        detail["candidates"] = cost.candidates
    if cost.algorithm == "hierarchical":
        detail["phases"] = [f"{p.collective} {p.algorithm} x{p.ranks} on {p.level.name}: {p.time_s * 1e6:.3f} us"
                            for p in cost.phases]
    if not cost.fits:
        outer = cost.phases[-1].level
        detail["note"] = (f"group of {cost.ranks} exceeds every interconnect level; used the outermost, "
                          f"{outer.name!r} ({outer.devices} devices)")
    return detail


def _bytes(tensors) -> int:
    return sum(t.nbytes for t in tensors)


def _claim(op, collective: str, size_of) -> None:
    def estimator(invoke, device):
        return estimate_collective(collective, size_of(invoke), invoke, device)

    estimator.__name__ = estimator.__qualname__ = f"estimate_{op.__name__.replace('.', '_')}"
    pack.register_op_estimator(op)(estimator)


_inputs = lambda invoke: _bytes(invoke.inputs())  # noqa: E731
_outputs = lambda invoke: _bytes(invoke.outputs())  # noqa: E731
_larger = lambda invoke: max(_inputs(invoke), _outputs(invoke))  # noqa: E731  uneven all_to_all splits

for _op, _collective, _size in (
    (_c10d.all_reduce.default, "all_reduce", _inputs),
    (_c10d.all_reduce_.default, "all_reduce", _inputs),
    (_c10d.all_reduce_coalesced.default, "all_reduce", _inputs),  # one launch for the whole list
    (_c10d.all_reduce_coalesced_.default, "all_reduce", _inputs),
    (_c10d.all_gather_into_tensor.default, "all_gather", lambda i: _bytes(i.outputs()[:1])),
    (_c10d.all_gather_into_tensor_out.default, "all_gather", lambda i: _bytes(i.outputs()[:1])),
    (_c10d.all_gather_into_tensor_coalesced.default, "all_gather", _outputs),
    (_c10d.reduce_scatter_tensor.default, "reduce_scatter", _inputs),
    (_c10d.reduce_scatter_tensor_out.default, "reduce_scatter", lambda i: _bytes(i.inputs()[:1])),
    (_c10d.reduce_scatter_tensor_coalesced.default, "reduce_scatter", _inputs),
    (_c10d.all_to_all_single.default, "all_to_all", _larger),
    (_c10d.broadcast.default, "broadcast", _inputs),
    (_c10d.broadcast_.default, "broadcast", _inputs),
    # The process-group API that ordinary code calls (dist.all_reduce, dist.all_gather_into_tensor, ...).
    (_c10d_pg.allreduce_.default, "all_reduce", _inputs),
    (_c10d_pg.allreduce_coalesced_.default, "all_reduce", _inputs),
    (_c10d_pg.barrier.default, "all_reduce", _inputs),  # a one-byte all_reduce, as NCCL does it
    (_c10d_pg._allgather_base_.default, "all_gather", lambda i: i.argument("output_tensor").nbytes),
    (_c10d_pg.allgather_.default, "all_gather", lambda i: _bytes(pack.tensors_in(i.argument("output_tensors")))),
    (_c10d_pg.allgather_into_tensor_coalesced_.default, "all_gather",
     lambda i: _bytes(pack.tensors_in(i.argument("outputs")))),
    (_c10d_pg._reduce_scatter_base_.default, "reduce_scatter", lambda i: i.argument("input_tensor").nbytes),
    (_c10d_pg.reduce_scatter_.default, "reduce_scatter", lambda i: _bytes(pack.tensors_in(i.argument("input_tensors")))),
    (_c10d_pg.alltoall_base_.default, "all_to_all",
     lambda i: max(i.argument("input").nbytes, i.argument("output").nbytes)),
    (_c10d_pg.alltoall_.default, "all_to_all", lambda i: _bytes(pack.tensors_in(i.argument("input_tensors")))),
    (_c10d_pg.broadcast_.default, "broadcast", _inputs),
    # castpack-collectives' own markers.
    (_marked.all_reduce.default, "all_reduce", _inputs),
    (_marked.all_gather.default, "all_gather", _outputs),
    (_marked.reduce_scatter.default, "reduce_scatter", _inputs),
    (_marked.all_to_all.default, "all_to_all", _inputs),
    (_marked.broadcast.default, "broadcast", _inputs),
):
    _claim(_op, _collective, _size)


# castcore's point-to-point send (defined by the core, so it exists once castcore.pack is imported).
@pack.register_op_estimator(torch.ops.castcore.send.default)
def estimate_send(invoke: pack.OpInvoke, device: pack.DeviceProfile) -> pack.Estimate:
    """One send of the tensor's bytes between two of ``devices``, over the level p2p.send_cost picks."""
    devices, outermost = invoke.argument("devices"), bool(invoke.argument("outermost", False))
    if not device.interconnect:
        raise ValueError(f"device {device.name!r} has no interconnect levels, so {invoke.name} cannot be timed; "
                         f"add [[interconnect]] to its profile ({device.origin or 'no file'})")
    nbytes = _inputs(invoke)
    phase = p2p.send_cost(nbytes, device.interconnect, devices, outermost)
    comm_s = phases_time([phase])
    return pack.Estimate(time_s=comm_s + device.comm_op_cost_s, comm_s=comm_s, overhead_s=device.comm_op_cost_s,
                         bound="comm", detail={"collective": "send", "algorithm": "direct", "level": phase.level.name,
                                               "protocol": phase.protocol or None, "bytes": nbytes, "devices": devices,
                                               "outermost": outermost, "base_s": phase.base_s})


@pack.register_op_estimator(_c10d.wait_tensor.default)
def _wait_tensor(invoke, device):
    # The collective's own estimate already holds its time; waiting adds no work.
    return pack.Estimate(time_s=0.0, bound="none")


@pack.register_op_properties(_c10d.wait_tensor.default)
def _wait_tensor_properties(invoke, device):
    # Waiting reads and writes nothing: the bytes belong to the collective.
    return pack.PerformanceProperties()
