"""Pipeline parallelism (``--pp N``): the layers split into N stages, one device's figures the slowest stage's.

The whole model (tensor/expert-parallel as asked) is captured once at the batch one stage runs at a time (a
prefill micro-batch of batch/M, a decode micro-batch of batch/N) and its records are split by the module that
made them: the decoder layers into N contiguous stages as vLLM splits them (L // N each, the remainder one
more each for the stages before the last, which holds the LM head), the ops before the first layer (embedding,
positions) with the first stage, those after the last layer (final norm, LM head) with the last. That is
exact for every op the model runs once; the rotary tables the first stage computes are, in a real pipeline,
computed by every stage (a few small ops).

Between stages the activation a layer outputs (one device's: [micro-batch, seq, hidden], 1/tp of the sequence
under --sp) is sent point to point over the innermost interconnect level that spans the replica's devices: a
castcore::send call (castcore.builtin.comm_ops) asked of the plugins, so castpack-collectives answers where it is
installed (NCCL's protocols on a level that gives their latencies) and the core's default otherwise, bytes /
(bandwidth x efficiency) + latency + the profile's comm_op_cost_s (a full mesh gives one peer 1/(devices - 1) of
the bandwidth, as castpack-collectives models it).

- Prefill, GPipe-style: M micro-batches, TTFT = (M + N - 1) x the slowest stage's micro-batch time
  + (N - 1) transfers (the first micro-batch's way to the last stage); the bubble is (N - 1) stage times.
- Decode, stages overlapped: N micro-batches of batch/N in flight, a token of every sequence takes each
  micro-batch through N stages, so TPOT = N x the slowest stage's time + (N - 1) transfers; with fewer
  sequences than stages the pipeline idles (N - batch) stage times of every round.

Memory per device is the heaviest stage's: its weights (a tied embedding and LM head held by both ends),
its layers' KV cache for every sequence in flight, and one micro-batch's activations.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from castcore.builtin.comm_ops import send_call
from castcore.builtin.formulas.comm import send_estimate as core_send_estimate
from castcore.builtin.formulas.comm import send_level
from castcore.devices.costs import STEP_ESTIMATOR, Source
from castcore.options.catalog import say
from castcore.plugins.loading import CORE_NAME
from castcore.recording.recorder import Capture
from castcore.report.memory import MemoryReport, analyze_memory
from castcore.report.records import Report, format_seconds
from castcore.deploy.parallel.sequence import decoder_layers
from castcore.workload.spec import ModelError

if TYPE_CHECKING:
    import torch

    from castcore.devices.costs import Estimate
    from castcore.devices.profile import DeviceProfile
    from castcore.plugins.resolve import Resolver
    from castcore.deploy.parallel.layout import Layout


def stage_layers(layers: int, stages: int) -> list[int]:
    """How many layers each stage holds: layers // stages, one more for the stages before the last while the
    remainder lasts (vLLM's split)."""
    counts = [layers // stages] * stages
    for i in range(2, layers % stages + 2):
        counts[-i] += 1
    return counts


def check_stages(model: torch.nn.Module, stages: int) -> tuple[str, int]:
    """The decoder layers' path and count; ModelError when there are none or fewer than ``stages``."""
    found = decoder_layers(model)
    if found is None:
        raise ModelError(
            f"{say('pp', stages)}: {type(model).__name__} has no decoder layers (an nn.ModuleList) to "
            f"split into stages; drop {say('pp')}"
        )
    path, layers = found
    if stages > len(layers):
        raise ModelError(
            f"{say('pp', stages)} is more pipeline stages than the model's {len(layers)} layers: use "
            f"{say('pp', len(layers))} or less"
        )
    return path, len(layers)


def assign(modules: list[str], prefix: str, counts: list[int]) -> list[int]:
    """The stage of each record, from the module that made it (see the module docstring). ``prefix`` is the
    layers' path as a record names it (the capture prefixes paths with the model's class name)."""
    owner = [s for s, count in enumerate(counts) for _ in range(count)]

    def layer_of(module: str) -> int | None:
        if not module.startswith(prefix + "."):
            return None
        head = module[len(prefix) + 1 :].split(".", 1)[0]
        return int(head) if head.isdigit() else None

    layer = [layer_of(m) for m in modules]
    seen = [i for i, j in enumerate(layer) if j is not None]
    if not seen:
        raise ModelError(
            f"{say('pp', len(counts))}: no op ran inside the decoder layers {prefix}.*, so there is "
            "nothing to split"
        )
    stages, current = [], 0
    for i, j in enumerate(layer):
        if j is not None:
            current = owner[j]
        stages.append(len(counts) - 1 if i > seen[-1] else current)
    return stages


@dataclass
class StageFigures:
    """The pipeline's figures: per-stage times of one micro-batch, transfers, and the step they make."""

    phase: str
    stages: int
    micro_batches: int  # prefill micro-batches; decode: micro-batches in flight
    layers: list[int]
    stage_times_s: list[float]
    stage_flops: list[float]
    stage_weight_bytes: list[int]
    stage_peak_bytes: list[int]
    transfer_bytes: int
    transfer_s: float
    level: str
    slowest: int
    heaviest: int
    step_s: float = 0.0  # prefill: TTFT; decode: TPOT
    bubble_s: float = 0.0
    formula: str = ""
    transfer_by: str = (
        ""  # who answered the castcore::send between stages, e.g. "castpack-collectives (estimator)"
    )

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


class PipelineReport(Report):
    """One device's report under --pp: the slowest stage's records, the heaviest stage's memory, and the
    pipeline's figures (``pipeline``)."""

    def __init__(self, *args: Any, pipeline: StageFigures, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.pipeline = pipeline

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "pipeline": self.pipeline.to_dict()}


def stage_figures(report: Report) -> StageFigures | None:
    """The pipeline's figures of a report made under --pp, else None."""
    return report.pipeline if isinstance(report, PipelineReport) else None


def transfer_time(
    nbytes: float,
    profile: DeviceProfile,
    devices: int,
    outermost: bool = False,
    what: str = f"{say('pp')}: device {{name!r}} has no [[interconnect]] levels to send activations over",
    resolver: Resolver | None = None,
    module: str = "pipeline stage send",
) -> tuple[float, str]:
    """A point-to-point send of ``nbytes`` between two of ``devices`` together, over the innermost interconnect level
    spanning them, or the ``outermost``; ModelError ``what`` without levels. The seconds and the level's name are
    ``send_estimate``'s."""
    estimate = send_estimate(nbytes, profile, devices, outermost, what, resolver, module)
    return estimate.time_s, sent_over(estimate, profile, devices, outermost)


def sent_over(estimate: Estimate, profile: DeviceProfile, devices: int, outermost: bool = False) -> str:
    """The level a send's Estimate says it went over (``detail["level"]``), else the core's choice of level."""
    return estimate.detail.get("level") or send_level(profile, devices, outermost).name


def send_estimate(
    nbytes: float,
    profile: DeviceProfile,
    devices: int,
    outermost: bool = False,
    what: str = "device {name!r} has no [[interconnect]] levels to send over",
    resolver: Resolver | None = None,
    module: str = "",
) -> Estimate:
    """The Estimate of a synthetic castcore::send call (castcore.builtin.comm_ops) of ``nbytes``, asked of
    ``resolver`` (a plugin host's: a pack claiming the op answers before the core's default,
    castcore.builtin.formulas.comm); None asks the core's default alone."""
    if not profile.interconnect:
        raise ModelError(what.format(name=profile.name))
    call = send_call(nbytes, devices, outermost, module)
    if resolver is None:
        estimate = core_send_estimate(call, profile)
        estimate.source = Source(CORE_NAME, STEP_ESTIMATOR)
        return estimate
    return resolver.estimate(call, profile)


def _touched(captured: Capture, indexes: list[int]) -> dict[int, int]:
    """Storage -> the leading dimension of a tensor viewing it (0 below two dimensions), for one stage's ops."""
    touched: dict[int, int] = {}
    for i in indexes:
        invoke = captured.invokes[i]
        for t in (*invoke.inputs(), *invoke.outputs()):
            if t.storage >= 0:
                touched.setdefault(t.storage, t.shape[0] if t.dim() >= 2 else 0)
    return touched


def _sub_captures(captured: Capture, indexes: list[list[int]], layout: Layout) -> list[Capture]:
    """The part of a capture each stage runs. Weights no op reads (a buffer kept for reference) go with the
    first stage; a decode step's per-sequence cache is scaled to every sequence in flight (the capture holds one
    micro-batch's)."""
    touched = [_touched(captured, ix) for ix in indexes]
    unread = {s for s in captured.weight_storages if not any(s in t for t in touched)}
    parts = []
    for stage, (ix, seen) in enumerate(zip(indexes, touched)):
        state = {}
        for s, nbytes in captured.state_storages.items():
            if s in seen:
                per_sequence = seen[s] == layout.batch and layout.kv_batch != layout.batch
                state[s] = nbytes * layout.kv_batch // layout.batch if per_sequence else nbytes
        parts.append(
            Capture(
                invokes=[captured.invokes[i] for i in ix],
                weight_storages={
                    s: b
                    for s, b in captured.weight_storages.items()
                    if s in seen or (stage == 0 and s in unread)
                },
                input_storages={s: b for s, b in captured.input_storages.items() if s in seen},
                output_storages={s for s in captured.output_storages if s in seen},
                state_storages=state,
            )
        )
    return parts


def _boundary_bytes(report: Report, owner: list[int]) -> int:
    """The activation one stage hands the next: the output of its last op, the largest over the boundaries."""
    sizes = [
        report.records[i].invoke.outputs()[0].nbytes
        for i in range(len(owner) - 1)
        if owner[i] != owner[i + 1] and report.records[i].invoke.outputs()
    ]
    return max(sizes, default=0)


def pipeline_report(
    report: Report,
    captured: Capture,
    model: torch.nn.Module,
    layout: Layout,
    phase: str,
    profile: DeviceProfile,
    kv_cache_bytes: int = 0,
    resolver: Resolver | None = None,
) -> PipelineReport:
    """Split a whole-model Report (and its capture) into ``layout.pp`` stages: see the module docstring.
    ``kv_cache_bytes`` is the prefill's KV cache of every layer, shared out by layers; ``resolver`` (the plugin
    host's) answers the sends between stages (None: the core's default)."""
    path, total_layers = check_stages(model, layout.pp)
    counts = stage_layers(total_layers, layout.pp)
    owner = assign([r.invoke.module for r in report.records], f"{type(model).__name__}.{path}", counts)
    indexes = [[i for i, s in enumerate(owner) if s == stage] for stage in range(layout.pp)]
    times = [sum(report.records[i].estimate.time_s for i in ix) for ix in indexes]
    memories: list[MemoryReport] = [
        analyze_memory(part, kv_cache_bytes=kv_cache_bytes // total_layers * count)
        for part, count in zip(_sub_captures(captured, indexes, layout), counts)
    ]
    slowest = max(range(layout.pp), key=times.__getitem__)
    heaviest = max(range(layout.pp), key=lambda s: memories[s].peak_bytes)
    nbytes = _boundary_bytes(report, owner)
    sent = send_estimate(
        nbytes,
        profile,
        layout.devices,
        what=f"{say('pp')}: device {{name!r}} has no [[interconnect]] levels to send activations over",
        resolver=resolver,
        module="pipeline stage send",
    )
    transfer, level = sent.time_s, sent_over(sent, profile, layout.devices)
    n, t = layout.pp, times[slowest]
    pipeline = StageFigures(
        phase=phase,
        stages=n,
        micro_batches=layout.micro_batches,
        layers=counts,
        stage_times_s=times,
        stage_flops=[sum(report.records[i].flops for i in ix) for ix in indexes],
        stage_weight_bytes=[m.weight_bytes for m in memories],
        stage_peak_bytes=[m.peak_bytes for m in memories],
        transfer_bytes=nbytes,
        transfer_s=transfer,
        level=level,
        slowest=slowest,
        heaviest=heaviest,
        transfer_by=str(sent.source or ""),
    )
    if phase == "decode":
        in_flight = -(-layout.kv_batch // layout.batch)
        pipeline.micro_batches = in_flight
        pipeline.step_s = n * t + (n - 1) * transfer
        pipeline.bubble_s = max(0, n - in_flight) * t
        pipeline.formula = (
            f"TPOT = {n} stages x {format_seconds(t)} + {n - 1} transfers x "
            f"{format_seconds(transfer)} = {format_seconds(pipeline.step_s)} ({in_flight} micro-batches "
            f"of {layout.batch} in flight"
            + (f"; the pipeline idles {n - in_flight} of every {n} stage steps" if in_flight < n else "")
            + ")"
        )
    else:
        m = layout.micro_batches
        pipeline.step_s = (m + n - 1) * t + (n - 1) * transfer
        pipeline.bubble_s = (n - 1) * t
        pipeline.formula = (
            f"TTFT = ({m} micro-batches + {n} stages - 1) x {format_seconds(t)} + {n - 1} transfers x "
            f"{format_seconds(transfer)} = {format_seconds(pipeline.step_s)} (GPipe; bubble "
            f"{format_seconds(pipeline.bubble_s)})"
        )
    records = [report.records[i] for i in indexes[slowest]]
    described = f"{report.description}, pipeline stage {slowest + 1} of {n} (the slowest; per device)"
    staged = PipelineReport(records, report.device, described, memory=memories[heaviest], pipeline=pipeline)
    staged.notes = [
        f"--pp {n}: layers per stage {counts} (vLLM's split); per-stage times of one micro-batch "
        + ", ".join(format_seconds(x) for x in times)
        + f"; {pipeline.formula}",
        (
            f"--pp {n}: {nbytes:,} bytes sent between stages, {format_seconds(transfer)} each over {level} "
            f"(castcore::send, answered by {pipeline.transfer_by}); memory is stage {heaviest + 1}'s "
            "(the heaviest)"
        ),
    ]
    return staged
