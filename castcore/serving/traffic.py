"""``castcore simulate``: what a deployment delivers under traffic, request by request, on castcore's own costs.

Requests (lengths drawn or read from a dataset) arrive all at once, at a rate or in a closed loop; an engine model
(castcore.simulation.engine, with vLLM's, SGLang's or TensorRT-LLM's defaults) schedules them in iterations of
prefill chunks and decode tokens over a KV cache of whole blocks; each iteration takes the time castcore estimates
for that mixed batch on the deployment (castcore.serving.step_time, from a few captures). The KV cache holds what
the engine's memory share leaves after the weights and the activations of a full token budget (both from the
largest of those captures). Data-parallel replicas each take every dp-th request at 1/dp of the rate; under
``--pp`` each replica's micro-batches in flight are schedulers of their own (see ``simulate``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from castcore.errors import ModelError
from castcore.options.catalog import DEPLOYMENT_NAMES, say
from castcore.options.parts import AXIS
from castcore.options.traffic import ENGINE_OPTIONS, SIMULATE
from castcore.options.option import Placeholder
from castcore.plugins.audit import plugins_elsewhere
from castcore.report.memory import config_field, format_bytes, language_config
from castcore.simulation import engine as engine_model
from castcore.simulation.arrivals import Arrivals
from castcore.simulation.lengths import Lengths
from castcore.simulation.metrics import format_table, summarize
from castcore.simulation.presets import EngineLimits, limits
from castcore.simulation.requests import check_lengths, make_requests, read_dataset, share_prefix
from castcore.simulation.trace import chrome_trace
from castcore.deploy.kernels.latent import NOT_IN_MIXED_BATCHES
from castcore.serving.metering import Metered, pool_use
from castcore.workload.spec import DEFAULT_MODEL, build_workload, is_factory, load_model_config
from castcore.serving import disaggregated, speculation
from castcore.workload import draft_heads
from castcore.serving.kv_capacity import kv_capacity, step_times, with_draft

if TYPE_CHECKING:
    from castcore.deploy.pipeline import Pipeline

# The traffic and objective options; the engine's limits are ENGINE_OPTIONS, the rest the deployment's.
TRAFFIC_NAMES = tuple(
    o.name
    for o in SIMULATE.scoped(AXIS)
    if o.name not in (*ENGINE_OPTIONS, *DEPLOYMENT_NAMES, "model", "device")
)


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
    finished: list = field(
        default_factory=list, repr=False
    )  # every request's times (castcore.simulation.metrics)
    iterations_trace: Any = field(default=None, repr=False)  # the first replica's iterations (engine.Trace)
    slo_ttft_s: float | None = None  # the goodput objectives, drawn by ``plot``
    slo_tpot_s: float | None = None
    pool_use: list = field(
        default_factory=list, repr=False
    )  # each pool's busy device-seconds, for the energy
    # (castcore.report.energy.PoolUse)

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
            "engine_limits": {k: v for k, v in vars(self.limits).items() if k != "sources"},
            "kv_blocks": self.kv_blocks,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "iterations": self.iterations,
            "mean_running_batch": self.mean_running,
            "never_fit": self.never_fit,
            "kv_usage": [list(p) for p in self.kv_usage],
            "deployment": self.deployment,
            "notes": self.notes,
            "partial": self.partial,
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
            format_table(self.summary),
            f"iterations {self.iterations:,}, mean running batch {self.mean_running:.1f}, preemptions "
            f"{self.summary['preemptions']}, peak KV use {max((u for _, u in self.kv_usage), default=0):.0%}",
        ]
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


def requests_for(
    model: str,
    requests: int,
    input_lengths: Any,
    output_lengths: Any,
    dataset: Any,
    arrivals: Arrivals,
    seed: int,
) -> list:
    """The requests of a run, each with its arrival time (None in a closed loop), checked against the model's
    position limit."""
    found = (
        read_dataset(dataset)
        if dataset is not None
        else make_requests(
            requests,
            _lengths("input_lengths", input_lengths),
            _lengths("output_lengths", output_lengths),
            seed,
        )
    )
    if not is_factory(model):
        context = config_field(language_config(load_model_config(model)), "max_position_embeddings")
        check_lengths(found, context if isinstance(context, int) else None)
    return arrivals.schedule(found, seed)


def _lengths(name: str, text: str) -> Lengths:
    try:
        return Lengths.parse(text)
    except ModelError as exc:
        raise ModelError(f"{say(name, text)}: {exc}") from None


def arrivals_of(rate: float | None, burstiness: float, concurrency: int | None) -> Arrivals:
    if rate is not None and concurrency is not None:
        raise ModelError(
            f"{say('rate')} is an open loop and {say('concurrency')} a closed one: give one of them"
        )
    if rate is None and burstiness != SIMULATE["burstiness"].default:
        instead = (
            "a closed loop starts a request as one ends" if concurrency else "every request arrives at once"
        )
        raise ModelError(
            f"{say('burstiness', burstiness)} shapes the gaps between arrivals at {say('rate')}, and "
            f"without it {instead}: give {say('rate', Placeholder('QPS'))} too, or drop "
            f"{say('burstiness')}"
        )
    if concurrency is not None:
        return Arrivals.closed_loop(concurrency)
    return Arrivals.at_rate(rate, burstiness) if rate is not None else Arrivals.offline()


@dataclass
class Simulation:
    """A checked simulation, before anything is captured: the deployment, the engine, the requests."""

    model: str
    base: Any  # the Workload of the deployment
    engine: str
    limits: EngineLimits
    requests: list
    concurrency: int | None
    slo_ttft: float | None
    slo_tpot: float | None
    speculation: tuple[int, float] | None = None  # (draft tokens, tokens a decode step keeps)
    draft: Any = None  # the draft model's Workload, on the same deployment
    pools: Any = None  # disaggregated prefill and decode (castcore.serving.disaggregated.Pools)


def check(model: str = DEFAULT_MODEL, **options: Any) -> Simulation:
    """Every option checked and the requests made (see ``simulate``); ModelError names the option at fault."""
    if not isinstance(model, str):
        raise ModelError(
            "simulate builds the model itself: name a preset, a config.json or package.module:factory"
        )
    given = {name: SIMULATE[name].check(options.pop(name, SIMULATE[name].default)) for name in TRAFFIC_NAMES}
    overrides = {
        name: SIMULATE[name].check(value)
        for name in ENGINE_OPTIONS
        if (value := options.pop(name, None)) is not None
    }
    if "chunked_prefill" in overrides:
        overrides["chunked_prefill"] = overrides["chunked_prefill"] == "on"
    base = build_workload(model, **options)
    if not is_factory(model) and config_field(language_config(load_model_config(model)), "kv_lora_rank"):
        raise ModelError(f"{model}: {NOT_IN_MIXED_BATCHES}")
    arrivals = arrivals_of(given["rate"], given["burstiness"], given["concurrency"])
    engine_limits = limits(given["engine"], **overrides)  # its refusals before the requests'
    if given["spec_tokens"] is not None and given["spec_tokens"] + 1 > engine_limits.max_batched_tokens:
        budget = say("max_batched_tokens", engine_limits.max_batched_tokens)
        raise ModelError(
            f"{say('spec_tokens', given['spec_tokens'])}: a verification pass of its last token and "
            f"{given['spec_tokens']} draft tokens does not fit the {budget} token budget"
            f"{'' if 'max_batched_tokens' in overrides else ' (the ' + given['engine'] + ' preset)'}: "
            f"give at most {say('spec_tokens', engine_limits.max_batched_tokens - 1)}"
        )
    spec, draft = _speculation(model, given, options)
    pools = disaggregated.pools_of(given, {**options, "model": model})
    found = requests_for(
        model,
        given["requests"],
        given["input_lengths"],
        given["output_lengths"],
        given["dataset"],
        arrivals,
        given["seed"],
    )
    if given["prefix_len"] is not None:
        share_prefix(found, given["prefix_len"], given["prefix_hit_rate"], given["seed"])
    elif given["prefix_hit_rate"] is not None:
        raise ModelError(
            f"{say('prefix_hit_rate', given['prefix_hit_rate'])} needs {say('prefix_len')}: how long "
            "the shared prefix is"
        )
    return Simulation(
        model=model,
        base=base,
        engine=given["engine"],
        limits=engine_limits,
        requests=found,
        concurrency=given["concurrency"],
        slo_ttft=given["slo_ttft"],
        slo_tpot=given["slo_tpot"],
        speculation=spec,
        draft=draft,
        pools=pools,
    )


def _speculation(model: str, given: dict[str, Any], options: dict[str, Any]) -> tuple[Any, Any]:
    """(draft tokens, tokens a step keeps) and the draft's Workload, or (None, None) without ``--spec-tokens``."""
    drafts, rates, draft = given["spec_tokens"], given["acceptance"], given["draft_model"]
    if drafts is None:
        if rates is not None or draft is not None:
            raise ModelError(
                f"{say('acceptance' if rates is not None else 'draft_model')} needs {say('spec_tokens')}:"
                " how many draft tokens each decode step verifies"
            )
        return None, None
    if rates is None or draft is None:
        raise ModelError(
            f"{say('spec_tokens', drafts)} needs {say('draft_model')} (the model proposing the tokens) "
            f"and {say('acceptance')} (how often they are accepted)"
        )
    kept = speculation.tokens_per_step(speculation.acceptance_rates(rates, drafts))
    if draft in draft_heads.HEADS:  # the model's own layers: its vocabulary, its embedding and head shared
        if is_factory(model):
            raise ModelError(
                f"{say('draft_model', draft)} cuts the model's own layers: name the model by a preset or "
                "a config.json"
            )
        draft = draft_heads.draft_source(model, load_model_config(model), draft)
    elif not is_factory(model) and not is_factory(draft):
        vocab = (
            config_field(language_config(load_model_config(name)), "vocab_size") for name in (model, draft)
        )
        speculation.check_vocabulary(next(vocab), draft, next(vocab))
    return (drafts, kept), build_workload(draft, **options)


def simulate_traffic(
    pipeline: Pipeline, model: str | Simulation = DEFAULT_MODEL, *, device: Any = None, **options: Any
) -> SimulationReport:
    """Simulate serving (see the module docstring). ``options``: ``castcore simulate``'s by their Python names
    (castcore.options.traffic.SIMULATE: traffic, engine limits, objectives) and the deployment's; or a Simulation
    ``check`` made."""
    plan = model if isinstance(model, Simulation) else check(model, **options)
    if plan.pools:
        return disaggregated.run(pipeline, plan, device, report_of)
    base, engine_limits = plan.base, plan.limits
    steps = step_times(pipeline, base, device, engine_limits)
    blocks, per_token = kv_capacity(pipeline, steps, engine_limits, steps.profile)
    # Each replica's pp micro-batches in flight are schedulers of their own (vLLM's virtual engines), each with
    # 1/pp of its KV blocks and running requests, and so is each attention data-parallel group (an engine core
    # of its own, as vLLM's data-parallel ranks are); every scheduler serves every n-th request.
    schedulers = base.dp * base.pp * base.attention_dp
    mine = replace(engine_limits, max_running_requests=max(1, engine_limits.max_running_requests // base.pp))
    if blocks // base.pp < 1:
        raise ModelError(
            f"the KV cache's {blocks} blocks do not go round {say('pp', base.pp)} micro-batches in "
            f"flight: use a smaller {say('pp')} or a larger {say('tp')}"
        )
    results, metered = [], [Metered(steps)]
    step = metered[0]
    if (
        plan.speculation
    ):  # the draft's weights and cache share the devices' memory; its steps add to each iteration
        metered.append(Metered(step_times(pipeline, plan.draft, device, engine_limits)))
        blocks, _ = with_draft(pipeline, plan.draft, device, blocks, per_token, engine_limits.block_size)
        step = speculation.speculative_step(metered[0], metered[1], plan.speculation[0])
    for n in range(schedulers):
        results.append(
            engine_model.simulate(
                plan.requests[n::schedulers],
                mine,
                blocks // base.pp,
                step,
                None if plan.concurrency is None else max(1, plan.concurrency // schedulers),
                plan.speculation,
            )
        )
        if results[-1].partial:  # Ctrl-C: no further scheduler runs
            break
    notes = (
        [f"data-parallel: {base.dp} replicas, each serving every {_ordinal(base.dp)} request"]
        if base.dp > 1
        else []
    )
    if base.attention_dp > 1:
        notes.append(
            f"attention data-parallel: {base.attention_dp} groups of {base.tp} device(s), each scheduling its "
            f"own requests with the KV blocks of its devices; an iteration's MoE layers take as many tokens "
            "from every group as from its own (the groups run in step, balanced by taking every "
            f"{_ordinal(base.attention_dp)} request)"
        )
    if base.pp > 1:
        notes.append(
            f"pipeline-parallel: {base.pp} micro-batches in flight per replica, each scheduled on its own "
            f"with 1/{base.pp} of the KV blocks and running requests; an iteration's period is {base.pp} "
            "times its slowest stage, at least one pass through every stage with the activation sends"
        )
    elsewhere = plugins_elsewhere(
        pipeline.host, steps.profile.name
    )  # their rewrites are no news on this device
    rewriters = [
        label
        for impl in pipeline.host.plugins.pm.hook.fuse_model.get_hookimpls()
        if (label := pipeline.host.plugins.label(impl.plugin_name)) not in elsewhere
    ]
    if rewriters:  # see castcore.serving.mixed_batch
        notes.append(
            f"a mixed batch runs castcore's deployed kernels: the fused-kernel rewrites of "
            f"{', '.join(rewriters)} are not applied in it yet (their estimators still price the ops they "
            "claim)"
        )
    return report_of(
        plan,
        results,
        [f for r in results for f in r.finished],
        partial=results[-1].partial,
        device=steps.profile.name,
        kv_blocks=blocks,
        kv_bytes_per_token=per_token,
        kv_usage=results[0].kv_usage,
        deployment=base.options(),
        notes=notes,
        iterations_trace=results[0].trace,
        pool_use=[pool_use(steps.profile.name, base, base.dp, metered)],
    )


def report_of(
    plan: Simulation,
    results: list,
    finished: list,
    *,
    prefix_from: list | None = None,
    figures: dict[str, Any] | None = None,
    mean_running: float | None = None,
    partial: bool = False,
    **fields: Any,
) -> SimulationReport:
    """The SimulationReport of a run from its schedulers' results (engine.Result) and the requests it finished: the
    summary under the plan's objectives with ``figures`` (the run's own entries) and the prefix-cache and speculation
    counts, the requests that never fit, the iterations and the mean running batch over them. ``prefix_from``: the
    results whose prefix caches count (all of them by default); ``fields``: the report's other fields."""
    never = [{"index": n.index, "why": n.why} for r in results for n in r.never_fit]
    if not finished:
        if partial:
            raise KeyboardInterrupt  # interrupted before any request finished: no figures to print
        raise ModelError(
            f"no request can be served: all {len(never)} never fit; request {never[0]['index']}: "
            f"{never[0]['why']}"
        )
    summary = summarize(
        finished,
        None if plan.slo_ttft is None else plan.slo_ttft * 1e3,
        None if plan.slo_tpot is None else plan.slo_tpot * 1e3,
    )
    summary.update(figures or {})
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
        **fields,
    )


def _ordinal(n: int) -> str:
    """2nd, 3rd, 4th, 11th, 21st."""
    suffix = "th" if n % 100 in (11, 12, 13) else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"
