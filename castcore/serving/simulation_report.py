"""A simulation's figures: ``SimulationReport`` (text, JSON, trace and plot forms), and ``report_of``, the one
place a run's schedulers' results become one, for an aggregated run and disaggregated pools alike."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from castcore.errors import ModelError
from castcore.options.catalog import say
from castcore.report.memory import format_bytes
from castcore.simulation.metrics import format_table, summarize
from castcore.simulation.overheads import describe
from castcore.simulation.presets import EngineLimits
from castcore.simulation.steady import format_line, steady_state
from castcore.simulation.trace import chrome_trace

if TYPE_CHECKING:
    from castcore.serving.engine_memory import KvBudget
    from castcore.serving.simulation_plan import Simulation
    from castcore.simulation.engine import EngineResult
    from castcore.simulation.metrics import Finished


@dataclass
class SimulationReport:
    """A simulation's figures: ``summary`` under ``vllm bench serve --save-result``'s names, and the engine's."""

    model: str
    device: str
    engine: str
    limits: EngineLimits
    kv_blocks: int
    kv_bytes_per_token: int
    summary: dict[str, Any]
    never_fit: list[dict[str, Any]]
    iterations: int
    mean_running: float
    kv_usage: list[tuple[float, float]]
    deployment: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    partial: bool = False  # Ctrl-C ended the run: the figures are of the requests finished by then
    # every request's times (castcore.simulation.metrics)
    finished: list = field(default_factory=list, repr=False)
    iterations_trace: Any = field(default=None, repr=False)  # the first replica's iterations (engine.Trace)
    slo_ttft_s: float | None = None  # the goodput objectives, drawn by ``plot``
    slo_tpot_s: float | None = None
    # each pool's busy and working device-seconds, for the energy and cost (castcore.report.energy.PoolUse)
    pool_use: list = field(default_factory=list, repr=False)
    # the requests the engine refused, beyond its context ({"index", "why"}): the summary's ``failed``
    rejected: list[dict[str, Any]] = field(default_factory=list)
    # the engine's CPU costs and graphs the run used (castcore.simulation.overheads.EngineStep.summary)
    overheads: dict[str, Any] | None = None
    # the engine's rule for the KV cache (of the decode pool's devices when disaggregated)
    kv_capacity: KvBudget | None = None

    def to_trace(self) -> dict[str, Any]:
        """Chrome trace events Perfetto opens: iterations, KV use and requests (castcore.simulation.trace)."""
        return chrome_trace(
            self.iterations_trace, self.finished, f"{self.model} on {self.device}, {self.engine}"
        )

    def plot(self, path: Any) -> Any:
        """Draw the TTFT and TPOT distributions and output tokens/s over time (castcore.report.traffic_plot)."""
        from castcore.report.traffic_plot import plot_simulation

        return plot_simulation(
            self.finished,
            self.kv_usage,
            f"{self.model} on {self.device}, {self.engine} engine: {self.summary['completed']} requests",
            path,
            self.slo_ttft_s,
            self.slo_tpot_s,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.summary,
            "model": self.model,
            "device": self.device,
            "engine": self.engine,
            "engine_limits": {k: v for k, v in vars(self.limits).items() if k not in ("sources", "given")},
            "engine_overheads": self.overheads,
            "kv_blocks": self.kv_blocks,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "kv_capacity": None if self.kv_capacity is None else self.kv_capacity.to_dict(),
            "iterations": self.iterations,
            "mean_running_batch": self.mean_running,
            "never_fit": self.never_fit,
            "rejected": self.rejected,
            "kv_usage": [list(p) for p in self.kv_usage],
            "deployment": self.deployment,
            "notes": self.notes,
            "partial": self.partial,
            # the objectives goodput counts against, so a page made from this JSON can draw them
            "slo_ttft_ms": None if self.slo_ttft_s is None else self.slo_ttft_s * 1e3,
            "slo_tpot_ms": None if self.slo_tpot_s is None else self.slo_tpot_s * 1e3,
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def format_text(self) -> str:
        block = self.limits.block_size
        lines = (
            ["PARTIAL: interrupted; the figures are of the requests finished by then"] if self.partial else []
        )
        lines += [
            f"{self.model} on {self.device}, {self.engine} engine: {self.kv_blocks:,} KV blocks of {block} "
            f"tokens ({format_bytes(self.kv_blocks * block * self.kv_bytes_per_token)} per device)",
            *([self.kv_capacity.line()] if self.kv_capacity is not None else []),
            format_table(self.summary),
            f"iterations {self.iterations:,}, mean running batch {self.mean_running:.1f}, preemptions "
            f"{self.summary['preemptions']}, peak KV use {max((u for _, u in self.kv_usage), default=0):.0%}",
        ]
        if self.overheads is not None:
            lines.append(describe(self.engine, self.overheads))
        if not self.limits.mixed_chunk:
            lines.append(
                "scheduling: an iteration with prompt chunks runs them alone; the decodes wait for it"
            )
        steady = format_line(self.summary.get("steady_state"))
        if steady:
            lines.append(steady)
        if "prefix_cache_hits" in self.summary:
            lines.append(
                f"prefix cache: {self.summary['prefix_cache_hits']:,} hits, "
                f"{self.summary['cached_prompt_tokens']:,} prompt tokens not computed"
            )
        if "spec_tokens" in self.summary:
            lines.append(
                f"speculative decoding: {self.summary['spec_tokens']} draft tokens a step, "
                f"{self.summary['spec_tokens_per_step']:.2f} tokens kept a step on average"
            )
        if self.never_fit:
            lines.append(
                f"{len(self.never_fit)} request(s) never fit: request {self.never_fit[0]['index']}: "
                f"{self.never_fit[0]['why']}"
            )
        return "\n".join(lines)


def report_of(
    plan: Simulation,
    results: list[EngineResult],
    finished: list[Finished],
    *,
    prefix_from: list[EngineResult] | None = None,
    figures: dict[str, Any] | None = None,
    mean_running: float | None = None,
    partial: bool = False,
    saturated: dict[str, Any] | None = None,
    **fields: Any,
) -> SimulationReport:
    """The SimulationReport of a run from its schedulers' results (engine.Result) and the requests it finished: the
    summary under the plan's objectives with ``figures`` (the run's own entries) and the prefix-cache and speculation
    counts, the requests that never fit, the iterations and the mean running batch over them. ``prefix_from``: the
    results whose prefix caches count (all of them by default); ``saturated``: a run stopped as saturated
    (castcore.simulation.engine's EngineResult.saturated); ``fields``: the report's other fields."""
    never = [{"index": n.index, "why": n.why} for r in results for n in r.never_fit]
    if not finished:
        if partial:
            raise KeyboardInterrupt  # interrupted before any request finished: no figures to print
        raise ModelError(
            f"no request can be served: all {len(never)} never fit; request {never[0]['index']}: "
            f"{never[0]['why']}"
        )
    summary: dict[str, Any] = dict(
        summarize(
            finished,
            None if plan.slo_ttft is None else plan.slo_ttft * 1e3,
            None if plan.slo_tpot is None else plan.slo_tpot * 1e3,
        )
    )
    summary.update(figures or {})
    summary["steady_state"] = steady_state(finished)
    if saturated is not None:  # its steady window judged when the run stopped, no latencies claimed
        summary["stopped_saturated_s"] = saturated["stopped_s"]
        summary["steady_state"] = {
            **{k: v for k, v in saturated.items() if k != "stopped_s"},
            "ttft": None,
            "tpot": None,
        }
        fields["notes"] = [
            f"stopped at {saturated['stopped_s']:,.1f} s, once its steady window was saturated "
            f"({say('stop_saturated')}): the figures are of the {len(finished):,} request"
            f"{'s' * (len(finished) != 1)} finished by then",
            *fields.get("notes", []),
        ]
    summary["failed"] = len(plan.rejected)  # vllm bench serve's count of the requests the server refused
    if plan.rejected:
        shown = plan.rejected[0]
        fields["notes"] = [
            f"{len(plan.rejected)} of {len(plan.rejected) + len(plan.requests)} requests rejected, counted as "
            f"failed: an engine refuses a prompt + output beyond its context and serves the rest (request "
            f"{shown['index']}: {shown['why']})",
            *fields.get("notes", []),
        ]
    if any(r.prefix_id is not None for r in plan.requests):
        cached = results if prefix_from is None else prefix_from
        summary.update(
            prefix_cache_hits=sum(r.prefix_hits for r in cached),
            cached_prompt_tokens=sum(r.cached_tokens for r in cached),
        )
    if plan.speculation:
        summary.update(spec_tokens=plan.speculation[0], spec_tokens_per_step=round(plan.speculation[1], 4))
    iterations = sum(r.iterations for r in results)
    if mean_running is None:
        mean_running = sum(r.mean_running * r.iterations for r in results) / iterations if iterations else 0.0
    return SimulationReport(
        model=plan.model,
        engine=plan.engine,
        limits=plan.limits,
        summary=summary,
        never_fit=never,
        iterations=iterations,
        mean_running=mean_running,
        finished=finished,
        partial=partial,
        slo_ttft_s=plan.slo_ttft,
        slo_tpot_s=plan.slo_tpot,
        rejected=plan.rejected,
        **fields,
    )
