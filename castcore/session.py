"""``castcore.Session``, the embedded API's centre: a plugin host (castcore.plugins.host) with the pipeline
(castcore.deploy.pipeline) and serving (castcore.serving.static) on top; and the default session the
module-level ``castcore.estimate`` and ``castcore.serve`` use."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from castcore.builtin import CorePlugin
from castcore.devices.profile import DeviceProfile
from castcore.plugins.config import Config
from castcore.plugins.host import PluginHost
from castcore.recording.recorder import Capture
from castcore.report.records import Report
from castcore.serving import static
from castcore.workload.models import BuiltModel
from castcore.deploy.pipeline import CaptureStep, Pipeline, build
from castcore.serving.serve_report import ServeReport
from castcore.serving.simulation_report import SimulationReport
from castcore.serving.traffic import simulate_traffic
from castcore.workload.spec import DEFAULT_MODEL, ModelError, Workload, build_workload


class Session(PluginHost):
    """Plugins and devices loaded once; estimate as many models as you like with them.

    ``Session(custom_op_dirs=[...], load_packs=[...])`` takes any Config field as an override.
    ``capture_step`` makes the pipeline's captures instead of capturing anew each time:
    ``Session(capture_step=castcore.sweeps.capture.CaptureCache())`` keeps them in memory and on disk.
    """

    def __init__(
        self, config: Config | None = None, *, capture_step: CaptureStep | None = None, **overrides: Any
    ):
        super().__init__(CorePlugin(), config, **overrides)
        self.pipeline = Pipeline(self, capture_step)

    @property
    def capture_step(self) -> CaptureStep | None:
        return self.pipeline.capture_step

    def estimate_capture(
        self,
        captured: Capture,
        device: str | DeviceProfile | None = None,
        description: str = "",
        kv_cache_bytes: int = 0,
    ) -> Report:
        """Estimate every call of a capture; the report includes its memory footprint (see castcore.report.memory)."""
        return self.pipeline.estimate_capture(captured, device, description, kv_cache_bytes)

    def build(self, workload: Workload) -> BuiltModel:
        """The model a workload names, built on the meta device with the inputs of its step (not fused or
        sharded): for looking at, or for ``fuse`` and ``capture`` by hand."""
        return build(workload)

    def estimate(
        self,
        workload: Workload | torch.nn.Module | Callable,
        *inputs: Any,
        device: str | DeviceProfile | None = None,
        progress: Callable[[int], None] | None = None,
        **options: Any,
    ) -> Report:
        """Estimate a Workload on ``device``: the Report ``castcore estimate`` prints for the same options.

        A model or function may be passed directly with its inputs, and any ``build_workload`` option
        (``train=True``, ``tp=2``, ``kwargs={...}``): ``session.estimate(model, input_ids)``.
        """
        if not isinstance(workload, Workload):
            workload = build_workload(workload, *inputs, **options)
        elif inputs or options:
            raise ModelError("pass inputs and options to build_workload, not with a Workload")
        return self.pipeline.run(workload, device, progress)

    def serve(
        self,
        model: str = DEFAULT_MODEL,
        *,
        input_tokens: int = 2048,
        output_tokens: int = 256,
        batch: int | str = 1,
        device: str | DeviceProfile | None = None,
        **deployment: Any,
    ) -> ServeReport:
        """What ``castcore serve`` prints: TTFT, TPOT, latency, throughput and memory of ``batch`` requests of
        ``input_tokens`` prompt and ``output_tokens`` generated tokens; ``batch="max"`` finds the largest batch
        that fits. ``deployment`` takes build_workload's deployment options (dtype, fuse, weights, activations,
        kv_cache, kv_reads, tp, sp, ep, pp, micro_batches, dp). See castcore.serving.static."""
        return static.serve(
            self.pipeline,
            model,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            batch=batch,
            device=device,
            **deployment,
        )

    def simulate(
        self, model: str = DEFAULT_MODEL, *, device: str | DeviceProfile | None = None, **options: Any
    ) -> SimulationReport:
        """What ``castcore simulate`` prints: a deployment serving requests under traffic, with continuous
        batching. ``options`` are the command's by their Python names (requests, input_lengths, output_lengths,
        dataset, rate, burstiness, concurrency, seed, engine, the engine limits, slo_ttft, slo_tpot) and the
        deployment's. See castcore.serving.traffic."""
        return simulate_traffic(self.pipeline, model, device=device, **options)


_default: Session | None = None


def default_session() -> Session:
    """The Session the module-level functions use, created on first use from the environment; claims
    declared since then are taken in."""
    global _default
    if _default is None:
        _default = Session()
    else:
        _default.refresh_claims()
    return _default


def estimate(workload, *inputs, device=None, **options) -> Report:
    """Estimate a Workload, or a model or function with its inputs, with the default session; see Session.estimate."""
    return default_session().estimate(workload, *inputs, device=device, **options)


def serve(model: str = DEFAULT_MODEL, *, device=None, **options) -> ServeReport:
    """Serving figures (TTFT, TPOT, throughput, memory) with the default session; see Session.serve."""
    return default_session().serve(model, device=device, **options)


def simulate(model: str = DEFAULT_MODEL, *, device=None, **options) -> SimulationReport:
    """A deployment under traffic (continuous batching) with the default session; see Session.simulate."""
    return default_session().simulate(model, device=device, **options)
