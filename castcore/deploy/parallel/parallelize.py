"""One device's share of a deployment: ``parallelize(built, workload)`` applies --tp, --sp and --ep together.

A fake process group of max(tp, ep) ranks is started (castcore plays rank 0) with the device meshes the
options need, the model is sharded in place and hooked for the collectives one device issues, and the inputs
are cut to what that device runs:

- ``--tp`` / ``--sp``: castcore.deploy.parallel.tensor (torch's parallelize_module) and castcore.deploy.parallel.sequence;
- ``--ep``: castcore.deploy.parallel.experts. With ep <= tp the experts are spread over the tensor-parallel group
  (with ep < tp each also split over tp/ep devices); with ep > tp the attention runs data-parallel over ep/tp
  groups of tp devices (a "dp" x "tp" mesh), each on batch/(ep/tp) sequences;
- ``--pp``: the prefill runs batch/M sequences per micro-batch (``--micro-batches M``), a decode step
  ceil(batch/pp) (the stages overlapped on pp micro-batches in flight); castcore.deploy.parallel.pipeline_stages splits the
  capture into stages afterwards.

``Layout`` (castcore.deploy.parallel.layout) says what was done: the batch the capture runs and the sequences whose KV
cache a device holds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch

from castcore.options.catalog import say
from castcore.options.option import current_terms
from castcore.deploy.parallel.experts import ExpertGroups, experts_modules, shard_experts
from castcore.deploy.parallel.layout import Layout, plan_layout
from castcore.workload.models import BuiltModel
from castcore.deploy.parallel.tensor import apply_tensor_parallel, fake_process_group
from castcore.deploy.parallel.sequence import sequence_parallel
from castcore.workload.spec import ModelError, Workload
from castcore.deploy.parallel.pipeline_stages import check_stages

if TYPE_CHECKING:
    from castcore.devices.profile import DeviceProfile


def check_interconnect(profile: DeviceProfile, workload: Workload) -> None:
    """Refuse a replica whose devices the profile's interconnect cannot join, naming the options and the fix."""
    devices = workload.devices
    if devices == 1:
        return
    asked = (" " if current_terms() == "cli" else ", ").join(
        say(k, v) for k, v in (("tp", workload.tp), ("ep", workload.ep), ("pp", workload.pp)) if v > 1
    )
    levels = profile.interconnect
    if not levels:
        raise ModelError(
            f"{asked} needs {devices} devices joined by an interconnect, but device {profile.name!r} has "
            f"no [[interconnect]] levels in its profile ({profile.origin or 'no file'}); add them, or "
            f"run on one device ({say('dp')} adds replicas, which need none)"
        )
    largest = max(levels, key=lambda level: level.devices)
    if devices > largest.devices:
        names = ", ".join(f"{level.name}: {level.devices} devices" for level in levels)
        raise ModelError(
            f"{asked} needs {devices} devices in one replica, more than the largest interconnect level of "
            f"device {profile.name!r} joins ({names}); use at most {largest.devices} (tp or ep, times pp), "
            f"and {say('dp')} for more replicas"
        )


@contextmanager
def parallelize(built: BuiltModel, workload: Workload) -> Iterator[Layout]:
    """Shard ``built`` for one device of ``workload``'s deployment for the duration of the block (see the module
    docstring); the fake process group is destroyed on exit, even on error."""
    layout = plan_layout(workload)
    tp, ep = workload.tp, workload.ep
    if workload.pp > 1:
        check_stages(built.model, workload.pp)
    notes = _notes(workload, layout)
    if workload.sp and layout.sp and experts_modules(built.model):
        raise ModelError(
            f"{say('sp', True)}: sequence parallelism of mixture-of-experts blocks is not supported yet; "
            f"drop {say('sp')}"
        )
    world = max(tp, ep)
    if world == 1:
        _rebatch(built, workload, layout)
        built.notes += notes
        yield layout
        return
    from torch.distributed.device_mesh import init_device_mesh

    option = "tp" if ep == 1 else "ep"
    with fake_process_group(world, option):
        tp_mesh, groups = _meshes(tp, ep, init_device_mesh)
        if tp > 1:
            # ep > tp: the experts' outputs come back whole, so no MoE block sums partial outputs
            layout.tensor = apply_tensor_parallel(
                built, tp_mesh, tp, sp=layout.sp, experts=ep == 1, moe_sums=ep <= tp
            )
        if ep > 1:
            low_latency = workload.ep_kernels == "low-latency" or (
                workload.ep_kernels == "auto" and workload.phase == "decode"
            )
            groups = dataclasses.replace(groups, kernels="low-latency" if low_latency else None)
            count = shard_experts(built.model, groups)
            built.description += f", expert parallel {ep}" + ("" if tp > 1 else " (per device)")
            routed = (
                "taken as balanced, each device priced at the expected most of the tokens x top_k rows "
                "any one receives (about 3 of a token's 8 over 8 devices"
                if not workload.expert_skew
                else f"skewed ({say('expert_skew', workload.expert_skew)}: the busiest device's rows"
            )
            moved = (
                f"split evenly over its experts); the {tp} tensor-parallel devices all hold every token, so "
                "nothing is dispatched: each runs the rows routed to its own experts and one all_reduce sums "
                "their outputs, as vLLM runs expert parallelism without data parallelism"
                + (
                    f" ({say('ep_kernels', workload.ep_kernels)} applies to all_to_all dispatch, which only "
                    f"attention data parallelism has: {say('attention_dp')})"
                    if workload.ep_kernels != "normal"
                    else ""
                )
                if groups.replicated
                else "split evenly over its experts), dispatched and combined by all_to_all"
                + (
                    " as low-latency kernels run it (every rank sends straight to every other, one step)"
                    if low_latency
                    else ""
                )
                + (
                    f" after each of the {tp} tensor-parallel ranks takes 1/{tp} of the tokens, all-gathered "
                    "after the combine"
                    if tp > 1
                    else ""
                )
            )
            notes.append(
                f"--ep {ep}: {count} experts modules hold 1/{ep} of their experts per device; routing is "
                f"{routed}, {moved}"
            )
        if layout.sp:
            sequence_parallel(built, tp_mesh, tp, workload.seq, layout.tensor)
        _rebatch(built, workload, layout)
        built.notes += notes
        yield layout


def _meshes(tp: int, ep: int, init_device_mesh) -> tuple[Any, ExpertGroups | None]:
    """The tensor-parallel mesh, and the groups the experts talk over (None without --ep)."""
    if ep <= tp:
        tp_mesh = init_device_mesh("cpu", (tp,))
        if ep == 1:
            return tp_mesh, None
        return tp_mesh, ExpertGroups(ep=None, tp=tp_mesh, ep_size=ep, etp_size=tp // ep, token_share=tp)
    ep_mesh = init_device_mesh("cpu", (ep,))
    tp_mesh = init_device_mesh("cpu", (ep // tp, tp), mesh_dim_names=("dp", "tp"))["tp"] if tp > 1 else None
    return tp_mesh, ExpertGroups(ep=ep_mesh, tp=tp_mesh, ep_size=ep, etp_size=1, token_share=tp)


def _notes(workload: Workload, layout: Layout) -> list[str]:
    """What a user should know about how the deployment was cut to one device."""
    notes = []
    if workload.sp and not layout.sp:
        notes.append(
            "--sp: a decode step (one token per sequence) cannot be split by sequence, so it runs as plain "
            "tensor parallelism"
        )
    if workload.ep > workload.tp:
        groups = workload.ep // workload.tp
        notes.append(
            f"--ep {workload.ep} over --tp {workload.tp} (--attention-dp {groups}): attention runs "
            f"data-parallel on {groups} groups of "
            f"{workload.tp} device{'s' if workload.tp > 1 else ''}; this device's group holds "
            f"{layout.kv_batch} of the {workload.batch} sequences"
        )
        if workload.batch % groups:  # priced as the busiest group, which every step waits for
            idle = groups - workload.batch if workload.batch < groups else 0
            notes.append(
                f"the batch of {workload.batch} does not divide over {groups} attention groups: priced as the "
                f"busiest, with {layout.kv_batch} sequence{'s' if layout.kv_batch > 1 else ''}"
                + (f"; {idle} group{'s' if idle > 1 else ''} idle" if idle else "")
            )
    if workload.pp > 1 and workload.phase == "decode":
        notes.append(
            f"--pp {workload.pp}: a decode step runs micro-batches of {layout.batch} sequences, "
            f"{workload.pp} in flight so the stages overlap"
            + (
                ""
                if layout.kv_batch >= workload.pp
                else f"; with {layout.kv_batch} sequences for {workload.pp} stages the pipeline idles part of "
                "each round"
            )
        )
        if workload.micro_batches > 1:
            notes.append(
                "--micro-batches applies to the prefill; decode steps keep pp micro-batches in flight"
            )
    if workload.dp > 1:
        notes.append(
            f"--dp {workload.dp}: {workload.dp} replicas of this deployment ({workload.devices * workload.dp} "
            "devices in all); per-device figures are one replica's, throughput is x "
            f"{workload.dp} (castcore serve)"
        )
    return notes


def _rebatch(built: BuiltModel, workload: Workload, layout: Layout) -> None:
    """Cut the inputs to the batch one device runs (a micro-batch, one attention group's share)."""
    if layout.batch == workload.batch:
        return
    batch, local = workload.batch, layout.batch
    if not workload.named:
        raise ModelError(
            f"{say('micro_batches')}, {say('pp')} decode steps and {say('ep')} over {say('tp')} split the "
            "batch castcore makes; for your own module pass one device's inputs and drop them"
        )
    cut, changed = _cut_inputs(batch, local)
    if built.inputs_fn is not None:
        inner = built.inputs_fn

        def make():
            args, kwargs = inner()
            return cut(args), {k: _cut_cache(v, batch, local) for k, v in cut(kwargs).items()}

        built.inputs_fn = make
    else:
        built.args, built.kwargs = cut(built.args), cut(built.kwargs)
        if not changed:
            raise ModelError(
                f"the model's inputs have no batch dimension of {batch} to split into {local}; drop "
                f"{say('micro_batches')} / {say('ep')} over {say('tp')}"
            )
        built.kv_cache_shape = (
            layout.kv_batch,
            workload.seq,
            built.kv_cache_shape[2] if built.kv_cache_shape else _dtype(workload),
        )
    built.description += f", {local} of {batch} sequences per device step"


def _dtype(workload: Workload) -> torch.dtype:
    from castcore.workload.models import parse_dtype

    return parse_dtype(workload.dtype)


def _cut_inputs(batch: int, local: int):
    """A function cutting every [batch, ...] tensor in a value to [local, ...], and a list it marks when it did."""
    changed: list[bool] = []

    def cut(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.dim() >= 2 and value.shape[0] == batch:
            changed.append(True)
            if value.device.type == "meta":
                return torch.zeros((local, *value.shape[1:]), dtype=value.dtype, device="meta")
            return value.narrow(0, 0, local).clone()
        if isinstance(value, tuple):
            return tuple(cut(v) for v in value)
        if isinstance(value, dict):
            return {k: cut(v) for k, v in value.items()}
        return value

    return cut, changed


def _cut_cache(value: Any, batch: int, local: int) -> Any:
    """A static KV cache made for ``batch`` sequences re-made for ``local`` (its layers initialized anew)."""
    for layer in getattr(value, "layers", None) or ():
        keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
        if (
            isinstance(keys, torch.Tensor)
            and keys.dim() == 4
            and keys.shape[0] == batch
            and hasattr(layer, "lazy_initialization")
        ):
            layer.lazy_initialization(
                keys.narrow(0, 0, local).narrow(2, 0, 0), values.narrow(0, 0, local).narrow(2, 0, 0)
            )
        indexer = getattr(layer, "indexer_keys", None)  # DeepSeek-V3.2's indexer keys (StaticIndexedLayer)
        if isinstance(indexer, torch.Tensor) and indexer.shape[0] == batch:
            layer.lazy_initialization_indexer(indexer.narrow(0, 0, local).narrow(1, 0, 0))
    return value
