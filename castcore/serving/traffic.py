"""``castcore simulate``: what a deployment delivers under traffic, request by request, on castcore's own costs.

Requests (lengths drawn or read from a dataset) arrive all at once, at a rate or in a closed loop; an engine model
(castcore.simulation.engine, with vLLM's, SGLang's or TensorRT-LLM's defaults) schedules them in iterations of
prefill chunks and decode tokens over a KV cache of whole blocks; each iteration takes the time castcore estimates
for that mixed batch on the deployment (castcore.serving.step_time, from a few captures). The KV cache is what the
engine's own rule gives (castcore.serving.engine_memory: its memory share less the weights and, for vLLM and
TensorRT-LLM, the activations of a full token budget, both from the largest of those captures). Data-parallel replicas each take every dp-th request at 1/dp of the rate; under
``--pp`` each replica's micro-batches in flight are schedulers of their own (see ``simulate``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from castcore.errors import ModelError
from castcore.options.catalog import say
from castcore.plugins.audit import plugins_elsewhere
from castcore.serving import disaggregated, speculation
from castcore.serving.kv_capacity import kv_capacity, step_times, with_draft
from castcore.serving.metering import Metered, pool_use
from castcore.serving.simulation_plan import Simulation, check
from castcore.serving.simulation_report import SimulationReport, report_of
from castcore.simulation import engine as engine_model
from castcore.simulation.chunks import StepTime
from castcore.simulation.overheads import EngineStep
from castcore.simulation.presets import for_device
from castcore.workload.spec import DEFAULT_MODEL

if TYPE_CHECKING:
    from castcore.deploy.pipeline import Pipeline
    from castcore.devices.profile import DeviceProfile


def simulate_traffic(
    pipeline: Pipeline,
    model: str | Simulation = DEFAULT_MODEL,
    *,
    device: str | DeviceProfile | None = None,
    **options: object,
) -> SimulationReport:
    """Simulate serving (see the module docstring). ``options``: ``castcore simulate``'s by their Python names
    (castcore.options.traffic.SIMULATE: traffic, engine limits, objectives) and the deployment's; or a Simulation
    ``check`` made."""
    plan = model if isinstance(model, Simulation) else check(model, **options)
    profile = pipeline.host.device(device)
    plan = replace(
        plan, limits=for_device(plan.engine, plan.limits, profile.memory_bytes, profile.name, profile.vendor)
    )
    if plan.pools:
        return disaggregated.run(pipeline, plan, plan.pools, device)
    base, engine_limits = plan.base, plan.limits
    steps = step_times(pipeline, base, device, engine_limits)
    kv = kv_capacity(pipeline, steps, plan.engine, engine_limits)
    blocks, per_token = kv.blocks, kv.per_token
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
    step: StepTime = metered[0]
    # The draft's weights and cache share the devices' memory; its steps add to each iteration.
    if plan.speculation and plan.draft is not None:
        metered.append(Metered(step_times(pipeline, plan.draft, device, engine_limits)))
        blocks, _ = with_draft(pipeline, plan.draft, device, blocks, per_token, engine_limits.block_size)
        kv = replace(kv, blocks_with_draft=blocks)
        step = speculation.speculative_step(metered[0], metered[1], plan.speculation[0])
    # The engine's CPU work and graphs around the kernels (castcore.simulation.overheads).
    engine_step = EngineStep(step, plan.engine, mine, steps.kernels, 1 + (plan.speculation or (0,))[0])
    for n in range(schedulers):
        results.append(
            engine_model.run_engine(
                plan.requests[n::schedulers],
                mine,
                blocks // base.pp,
                engine_step,
                None if plan.concurrency is None else max(1, plan.concurrency // schedulers),
                plan.speculation,
                engine_step.costs.request_s,
                stop_saturated=plan.stop_saturated,
                state_blocks=kv.state_blocks,
            )
        )
        if results[-1].partial or results[-1].saturated:  # Ctrl-C, or saturated: no further scheduler runs
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
    # their rewrites are no news on this device
    elsewhere = plugins_elsewhere(pipeline.host, steps.profile.name)
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
        saturated=results[-1].saturated,
        device=steps.profile.name,
        kv_blocks=blocks,
        kv_bytes_per_token=per_token,
        kv_usage=results[0].kv_usage,
        kv_capacity=kv.for_requests(plan.requests),
        deployment=base.options(),
        notes=notes,
        iterations_trace=results[0].trace,
        pool_use=[pool_use(steps.profile.name, base, base.dp, metered, [r.trace for r in results])],
        overheads=engine_step.summary(),
    )


def _ordinal(n: int) -> str:
    """2nd, 3rd, 4th, 11th, 21st."""
    suffix = "th" if n % 100 in (11, 12, 13) else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"
