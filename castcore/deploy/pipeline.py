"""The one pipeline the CLI and embedders share: Workload -> build -> fuse -> shard -> capture -> Report.

A ``Pipeline`` runs it with one plugin host's plugins and devices (castcore.plugins.host), and with the capture
step it is given: ``capture_workload`` by default, or one that keeps captures (castcore.sweeps.capture).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch

from castcore.hf.causal_lm import quiet_kernel_fallbacks
from castcore.hf.versions import internals_error, raised_inside
from castcore.builtin import DEPLOYED_WHOLE_OPS
from castcore.options.catalog import say
from castcore.plugins.audit import unreached_claims, unreached_lines
from castcore.plugins.replacements import replacements
from castcore.errors import CastcoreError
from castcore.recording.recorder import CAPTURE_LOCK, Capture, CaptureError, capture, no_cyclic_gc
from castcore.report.memory import analyze_memory, kv_cache_bytes
from castcore.report.records import OpRecord, Report
from castcore.deploy.parallel.experts import with_model_routing
from castcore.deploy.parallel.parallelize import check_interconnect, parallelize
from castcore.deploy.parallel.layout import plan_layout
from castcore.recording.hints import collective_kernels
from castcore.recording.routing import expert_routing
from castcore.deploy.kernels.fusing import fuse
from castcore.deploy.kernels.packing import packing_on
from castcore.deploy.recurrent_layers import refuse_unpriced
from castcore.deploy.sparse_attention import refuse_sparse_attention
from castcore.workload.models import BuiltModel, build_preset, from_factory, parse_dtype
from castcore.devices.dtypes import torch_dtype
from castcore.deploy import engine_step, lora
from castcore.deploy.quantize.apply import quantize
from castcore.workload.spec import ModelError, Workload, is_factory
from castcore.deploy.parallel.pipeline_stages import pipeline_report
from castcore.workload.own_models import prepare as prepare_stock

if TYPE_CHECKING:
    from castcore.devices.profile import DeviceProfile
    from castcore.plugins.host import PluginHost


def build(workload: Workload) -> BuiltModel:
    """The model of a workload on the meta device, with the inputs of its step."""
    if not workload.named:
        return prepare_stock(
            BuiltModel(
                model=workload.model,
                args=workload.args,
                kwargs=dict(workload.kwargs),
                description=_own_description(workload),
            )
        )
    options = dict(
        batch=workload.batch,
        seq=workload.seq,
        dtype=workload.dtype,
        phase=workload.phase,
        kv_len=workload.cached_tokens,
        train=workload.train,
        all_logits=workload.all_logits,
    )
    if is_factory(workload.model):
        return from_factory(workload.model, **{**options, "dtype": parse_dtype(workload.dtype)})
    return build_preset(workload.model, **options)


def _own_description(workload: Workload) -> str:
    name = getattr(workload.model, "__name__", None) or type(workload.model).__name__
    return f"{name}{' training step' if workload.train else ''}"


def capture_workload(
    host: PluginHost,
    workload: Workload,
    device: DeviceProfile,
    progress: Callable[[int], None] | None = None,
    adjust: Callable[[BuiltModel], None] | None = None,
) -> tuple[BuiltModel, Capture]:
    """Build, fuse (when asked), shard and capture; the built model carries the notes a user should see.
    ``adjust`` changes the built model's inputs before anything else (a mixed batch's sampled rows).

    The whole of it takes the capture's turn: building touches process-wide state too (default device,
    transformers' registries, the fake process group)."""
    with CAPTURE_LOCK:
        built, captures = _capture_workload(host, workload, device, progress, (), adjust)
        return built, captures[workload.cached_tokens]


def capture_decode_steps(
    host: PluginHost,
    workload: Workload,
    device: DeviceProfile,
    kv_lens: list[int],
    progress: Callable[[int], None] | None = None,
) -> tuple[BuiltModel, dict[int, Capture]]:
    """Decode steps of one deployment at several KV lengths from one built, fused and sharded model (only the
    cache differs); a KV length whose inputs cannot be remade on that model is left out for the caller."""
    with CAPTURE_LOCK:
        return _capture_workload(host, workload, device, progress, tuple(kv_lens))


def _capture_workload(
    host: PluginHost,
    workload: Workload,
    device: DeviceProfile,
    progress: Callable[[int], None] | None,
    more_kv: tuple[int, ...],
    adjust: Callable[[BuiltModel], None] | None = None,
) -> tuple[BuiltModel, dict[int, Capture]]:
    built = None
    try:
        built = build(workload)
        if adjust is not None:
            adjust(built)
        refuse_unpriced(
            built.model,
            workload.model if workload.named else type(workload.model).__name__,
            workload.phase,
            workload.tp,
            packing_on(),
            workload.fuse and not workload.train,
        )
        refuse_sparse_attention(
            built.model,
            workload.model if workload.named else type(workload.model).__name__,
            workload.fuse and not workload.train,
        )
        with quiet_kernel_fallbacks():
            return built, _fuse_shard_capture(host, workload, device, built, progress, more_kv)
    except CastcoreError:
        raise
    except Exception as exc:
        if not raised_inside(exc):
            raise
        model = built.model if built is not None else workload.model
        raise internals_error(exc, model if isinstance(model, str) else type(model).__name__) from exc


def _fuse_shard_capture(
    host: PluginHost,
    workload: Workload,
    device: DeviceProfile,
    built: BuiltModel,
    progress: Callable[[int], None] | None,
    more_kv: tuple[int, ...],
) -> dict[int, Capture]:
    workload = with_model_routing(workload, built)
    if workload.fuse and workload.named and not workload.train:
        built.notes += fuse(host, built, device, workload.kv_reads)
        built.description += " (deployed kernels)"
    elif workload.named:
        built.description += " (eager)"
        if workload.fuse:  # a training step
            built.notes.append(
                "--train prices the eager graph: the deployed kernels are a server's inference kernels"
            )
    elif workload.fuse:
        built.notes.append(
            "your own module runs as you wrote it (eager), but for torch's composite norms "
            "(F.rms_norm, nn.RMSNorm), kept as the one kernel engines run: castcore rewrites only the "
            "models it builds (presets, config.json, factories) to the deployed kernels"
        )
    with built.while_capturing(), parallelize(built, workload), warnings.catch_warnings():
        quantize(built, workload, device)  # after sharding: quantized weights are one device's shard
        # around the projections
        built.notes += lora.attach(
            built.model,
            workload.lora_rank,
            workload.adapters,
            workload.tp,
            torch_dtype(workload.dtype),
            workload.adapter_skew,
        )
        # torch only warns when it backprops through an op with no autograd kernel, and drops its gradient.
        warnings.filterwarnings("error", message=_NO_AUTOGRAD_WARNING)
        captures = {workload.cached_tokens: _capture(host, workload, device, built, progress)}
        for kv_len in more_kv:
            remake = getattr(built.inputs_fn, "with_kv_len", None)
            # inputs rebuilt for a pipeline stage or an expert group: the caller captures anew
            if remake is None:
                break
            built.inputs_fn = remake(kv_len)
            captures[kv_len] = _capture(host, workload, device, built, progress)
    return captures


def _capture(
    host: PluginHost,
    workload: Workload,
    device: DeviceProfile,
    built: BuiltModel,
    progress: Callable[[int], None] | None,
) -> Capture:
    try:
        with (
            _tf32(workload.dtype == "tf32"),
            collective_kernels(None if workload.train else "engine"),
            expert_routing(skew=workload.expert_skew),
        ):
            whole = host.outranking(device)
            if workload.fuse and not workload.train:
                whole = {**dict.fromkeys(DEPLOYED_WHOLE_OPS, frozenset()), **whole}
            return capture(
                built.model,
                *built.args,
                train=workload.train,
                inputs_fn=built.inputs_fn,
                progress=progress,
                reuse=workload.reuse,
                whole_ops=whole,
                **built.kwargs,
            )
    except (RuntimeError, UserWarning) as exc:
        forward_only = _forward_only_op(str(exc)) if workload.train else None
        if forward_only:
            raise CaptureError(
                f"{say('train', True)}: {forward_only} has no backward (a forward-only custom op); "
                "give it one with torch.library.register_autograd, write it as a "
                "torch.autograd.Function, or define it with castcore.register_op, which registers a "
                "backward"
            ) from None
        if workload.phase == "decode" and workload.named and "index_copy_" in str(exc):
            # castcore's static cache gives every layer num_key_value_heads x head_dim keys and values.
            raise ModelError(
                f"{workload.model}: its attention writes keys or values of another shape than "
                "castcore's decode cache (num_key_value_heads x head_dim per layer), as multi-query "
                f"and latent (MLA) attention do; {say('phase', 'decode')} does not support this model "
                f"yet: use {say('phase', 'prefill')}"
            ) from None
        raise


@contextmanager
def _tf32(allowed: bool) -> Iterator[None]:
    """--dtype tf32: the capture runs with torch allowing TF32 products (as allow_tf32 = True does), then the
    caller's setting is back."""
    before = torch.get_float32_matmul_precision()
    if allowed:
        torch.set_float32_matmul_precision("high")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


_NO_AUTOGRAD_WARNING = r".*: an autograd kernel was not registered to the Autograd key"
# How torch names an op it cannot differentiate: torch.library.custom_op, a C++ autogradNotImplementedFallback,
# an op with no autograd kernel at all (the warning above, made an error).
_NO_BACKWARD = (
    r"Trying to backward through ([\w.]+) but no autograd formula",
    r"derivative for (\w+::[\w.]+) is not implemented",
    r"^(\w+::[\w.]+): an autograd kernel was not registered",
)


def _forward_only_op(message: str) -> str | None:
    """The op a backward failed on for want of an autograd formula, as ``ns::name``; None for other errors."""
    for pattern in _NO_BACKWARD:
        found = re.search(pattern, message)
        if found:
            ns, _, rest = found.group(1).replace("::", ".").partition(".")
            name, _, overload = rest.partition(".")
            if ns not in ("aten", "prim"):  # torch's own ops are not the user's to fix
                return f"{ns}::{name}" + (f".{overload}" if overload not in ("", "default") else "")
    return None


# What stands in for the capture: capture_workload's signature and result; with a ``decode_steps`` method,
# capture_decode_steps' too (a capture cache has both).
CaptureStep = Callable[..., tuple[BuiltModel, Capture]]


class Pipeline:
    """Workloads estimated with ``host``'s plugins and devices; ``capture_step`` (None: ``capture_workload``)
    makes each capture, so a caller that keeps captures (castcore.sweeps.capture.CaptureCache) gives it here."""

    def __init__(self, host: PluginHost, capture_step: CaptureStep | None = None):
        self.host = host
        self.capture_step = capture_step
        # What a command derives from captures and may reuse while this pipeline lives (simulate's step-time
        # models, by deployment): castcore.serving.traffic keeps it.
        self.derived: dict[Any, Any] = {}
        # per call key, whether it is hoisted: a capture repeats its layers' calls
        self._glue: dict[Any, bool] = {}

    def _hoisted(self, invoke: Any) -> bool:
        found = self._glue.get(invoke.key)
        if found is None:
            found = self._glue[invoke.key] = engine_step.hoisted(invoke)
        return found

    def estimate_capture(
        self,
        captured: Capture,
        device: str | DeviceProfile | None = None,
        description: str = "",
        kv_cache_bytes: int = 0,
        memory: bool = True,
        deployed: bool = False,
    ) -> Report:
        """Estimate every call of a capture; the report includes its memory footprint (see castcore.report.memory)
        unless ``memory`` is False (a caller that reads only the times: the analysis costs more than the pricing).
        ``deployed``: priced as an engine runs the step, its glue on ids and positions at nothing
        (castcore.deploy.engine_step)."""
        profile = self.host.device(device)
        resolver = self.host.resolver
        with no_cyclic_gc():
            records = [
                OpRecord(invoke, *engine_step.nothing())
                if deployed and self._hoisted(invoke)
                else OpRecord(
                    invoke=invoke,
                    estimate=resolver.estimate(invoke, profile),
                    properties=resolver.properties(invoke, profile)[0],
                )
                for invoke in captured.invokes
            ]
            footprint = analyze_memory(captured, kv_cache_bytes=kv_cache_bytes) if memory else None
        return Report(records, profile, description, memory=footprint)

    def run(
        self,
        workload: Workload,
        device: str | DeviceProfile | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> Report:
        """Estimate a workload on a device: the Report ``castcore estimate`` prints."""
        profile = self.host.device(device)  # a bad device fails before the capture, not after
        check_interconnect(profile, workload)
        built, captured = (self.capture_step or capture_workload)(self.host, workload, profile, progress)
        return self._report(workload, built, captured, profile, built.description)

    def run_decode_steps(
        self, workload: Workload, kv_lens: list[int], device: str | DeviceProfile | None = None
    ) -> dict[int, Report]:
        """The decode step of ``workload`` at each of ``kv_lens``: what ``run`` gives for each, from one built model."""
        profile = self.host.device(device)
        check_interconnect(profile, workload)
        steps = getattr(self.capture_step, "decode_steps", None)
        if self.capture_step is not None and steps is None:
            return {kv_len: self.run(replace(workload, kv_len=kv_len), profile) for kv_len in kv_lens}
        if steps is not None:
            built, captures = steps(self.host, workload, profile, kv_lens)
        else:
            built, captures = capture_decode_steps(
                self.host, replace(workload, kv_len=kv_lens[0]), profile, kv_lens[1:]
            )
        reports = {}
        for kv_len in kv_lens:
            step = replace(workload, kv_len=kv_len)
            if kv_len not in captures:
                reports[kv_len] = self.run(step, profile)
                continue
            description = re.sub(r"over \d+ cached", f"over {kv_len} cached", built.description)
            reports[kv_len] = self._report(step, built, captures[kv_len], profile, description)
        return reports

    def _report(
        self,
        workload: Workload,
        built: BuiltModel,
        captured: Capture,
        profile: DeviceProfile,
        description: str,
    ) -> Report:
        # A prefill fills a KV cache a server must hold; a decode step's cache is already in the capture.
        batch, seq, dtype = built.kv_cache_shape or (
            workload.batch,
            workload.seq,
            parse_dtype(workload.dtype),
        )
        cache = 0
        notes = list(built.notes)
        if built.config is not None and workload.phase == "prefill" and not workload.train:
            try:
                cache = kv_cache_bytes(built.config, batch, seq, dtype)
            except ValueError as exc:
                notes.append(f"the KV cache a prefill fills is not counted: {exc}")
        report = self.estimate_capture(
            captured,
            profile,
            description=description,
            kv_cache_bytes=cache,
            deployed=workload.fuse and not workload.train,
        )
        # one device runs one stage: the slowest stage's records, the heaviest stage's memory
        if workload.pp > 1:
            report = pipeline_report(
                report,
                captured,
                built.model,
                plan_layout(workload),
                workload.phase,
                profile,
                cache,
                self.host.resolver,
            )
            notes += report.notes
        report.notes = notes + report.borrowed_rates()
        report.workload = workload.options()
        if workload.fuse and workload.named and not workload.train:  # the user asked for the deployed kernels
            report.warnings = unreached_lines(
                unreached_claims(self.host, captured, profile.name, replacements(), others_only=True)
            )
        return report
