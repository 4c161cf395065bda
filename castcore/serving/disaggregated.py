"""Disaggregated prefill and decode under traffic: prompts run on a pool of prefill instances, their KV cache moves
to a pool of decode instances, which generate the rest.

Each pool is its own deployment: the simulated one, changed by ``--prefill-deployment`` / ``--decode-deployment``
("tp=4 weights=fp8 device=h200-sxm": any deployment option, and the device), with its own step-time model and KV
capacity. A request arrives at a prefill instance (every X-th request goes to the same one), which runs its prompt
and produces its first token, as engines' disaggregated prefill does (vLLM's and SGLang's P/D, NVIDIA Dynamo). Its
prompt's keys and values then go to a decode instance over the interconnect: each prefill device sends its share
(its ``kv_bytes_per_token``), all at once, in one transfer at the level of the device's interconnect that spans a
prefill and a decode instance together (NVLink inside a node, the network across nodes, or when the pools are
different devices), as a pipeline stage's send: a castcore::send call (castcore.builtin.comm_ops) asked of the
plugins, which castpack-collectives answers where it is installed (NCCL's protocols on a level that gives their
latencies) and the core's default otherwise (the level's latency, the bytes at its bandwidth and efficiency, and the
call's cost; castcore.builtin.formulas.comm). The request then queues at
a decode instance (every Y-th in order of the KV's arrival), admitted with its prompt's KV and first token
(``Request.prefilled``), and its later tokens come from there. TTFT is the prefill's; TPOT and ITL the decode's,
the transfer included in the gap between the first and second tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from castcore.errors import ModelError
from castcore.options.catalog import DEPLOYMENT_NAMES, say
from castcore.simulation import engine as engine_model
from castcore.simulation.metrics import Finished, format_ms
from castcore.simulation.requests import Request
from castcore.serving.kv_capacity import kv_capacity, step_times, with_draft
from castcore.serving.metering import Metered, pool_use
from castcore.serving.speculation import speculative_step
from castcore.simulation.overheads import ENGINES, EngineStep
from castcore.deploy.parallel.pipeline_stages import send_estimate, sent_over
from castcore.serving.simulation_report import SimulationReport, report_of
from castcore.workload.spec import Workload, build_workload

if TYPE_CHECKING:
    from castcore.deploy.pipeline import Pipeline
    from castcore.devices.costs import Estimate
    from castcore.devices.profile import DeviceProfile
    from castcore.plugins.resolve import Resolver
    from castcore.serving.engine_memory import KvBudget
    from castcore.serving.pools import Pools
    from castcore.serving.simulation_plan import Simulation
    from castcore.serving.step_time import StepTimes


def kv_send(
    profile: DeviceProfile,
    devices_together: int,
    same_device: bool,
    nbytes: float,
    resolver: Resolver | None = None,
) -> Estimate:
    """The Estimate of one device's share of a prompt's KV sent to its decode peer: a castcore::send (as a pipeline
    stage's, castcore.deploy.parallel.pipeline_stages.send_estimate) over the level spanning both instances, the outermost when
    they are different devices, answered by ``resolver``'s plugins (None: the core's default)."""
    return send_estimate(
        nbytes,
        profile,
        devices_together,
        outermost=not same_device,
        what="device {name!r} has no interconnect to move a prompt's KV cache over; give its profile "
        "[[interconnect]] levels",
        resolver=resolver,
        module="KV transfer",
    )


def transfer_seconds(
    profile: DeviceProfile,
    devices_together: int,
    same_device: bool,
    nbytes: float,
    resolver: Resolver | None = None,
) -> tuple[float, str]:
    """(seconds, level) of ``kv_send``."""
    estimate = kv_send(profile, devices_together, same_device, nbytes, resolver)
    return estimate.time_s, sent_over(estimate, profile, devices_together, not same_device)


@dataclass
class Pool:
    """One pool's step-time model as its engines call it (metered, the draft's steps added under speculative
    decoding, the engine's overheads around them), its meters and its KV capacity."""

    steps: StepTimes
    step: EngineStep
    meters: list[Metered]
    blocks: int
    per_token: int  # bytes of a token's KV, the draft's cache's included
    kv: KvBudget  # the engine's rule for the pool's devices


def _pool(
    pipeline: Pipeline, plan: Simulation, workload: Workload, device: str | DeviceProfile | None
) -> Pool:
    steps = step_times(pipeline, workload, device, plan.limits)
    kv = kv_capacity(pipeline, steps, plan.engine, plan.limits)
    blocks, per_token = kv.blocks, kv.per_token
    meters = [Metered(steps)]
    if not plan.speculation or plan.draft is None:  # each iteration with the engine's own CPU work and graphs
        return Pool(
            steps,
            EngineStep(meters[0], plan.engine, plan.limits, steps.kernels),
            meters,
            blocks,
            per_token,
            kv,
        )
    # The draft runs on each pool with the pool's deployment: it prefills the prompts on the prefill pool (its cache
    # moves with the model's) and drafts on the decode pool.
    draft = build_workload(
        plan.draft.model, **{k: v for k, v in workload.options().items() if k in DEPLOYMENT_NAMES}
    )
    meters.append(Metered(step_times(pipeline, draft, device, plan.limits)))
    blocks, draft_token = with_draft(pipeline, draft, device, blocks, per_token, plan.limits.block_size)
    drafted = speculative_step(meters[0], meters[1], plan.speculation[0])
    return Pool(
        steps,
        EngineStep(drafted, plan.engine, plan.limits, steps.kernels, 1 + plan.speculation[0]),
        meters,
        blocks,
        per_token + draft_token,
        replace(kv, blocks_with_draft=blocks),
    )


def run(
    pipeline: Pipeline, plan: Simulation, pools: Pools, device: str | DeviceProfile | None
) -> SimulationReport:
    """Simulate ``plan`` (a checked Simulation) on ``pools`` (its own) and return its SimulationReport; a pool
    without a device of its own runs on ``device``."""
    limits = plan.limits
    pre = _pool(pipeline, plan, pools.prefill, pools.prefill_device or device)
    dec = _pool(pipeline, plan, pools.decode, pools.decode_device or device)
    pre_profile, dec_profile = pre.steps.profile, dec.steps.profile
    longest = max(plan.requests, key=lambda r: r.input_tokens)
    if -(-longest.input_tokens // limits.block_size) > pre.blocks:
        raise ModelError(
            f"a prefill instance's KV cache ({pre.blocks} blocks of {limits.block_size} tokens) cannot "
            f"hold request {longest.index}'s {longest.input_tokens}-token prompt: give the prefill pool "
            f"a larger {say('tp')} in {say('prefill_deployment')}"
        )
    x, y = pools.prefill_instances, pools.decode_instances
    prompts = [replace(r, output_tokens=1) for r in plan.requests]
    # schedulers: one per attention group
    px, dy = (
        x * pools.prefill.attention_dp,
        y * pools.decode.attention_dp,
    )
    request_s = ENGINES[plan.engine].request_s  # tokenized and admitted on the prefill instance
    prefilled = [
        engine_model.run_engine(
            prompts[n::px],
            limits,
            pre.blocks,
            pre.step,
            None,
            None,
            request_s,
            state_blocks=pre.kv.state_blocks,
        )
        for n in range(px)
    ]
    first = {f.index: f for result in prefilled for f in result.finished}
    same = pre_profile.name == dec_profile.name
    together = pools.prefill.devices + pools.decode.devices
    by_index = {r.index: r for r in plan.requests}
    moved, sent = {}, None
    for index in first:
        sent = kv_send(
            pre_profile, together, same, by_index[index].input_tokens * pre.per_token, pipeline.host.resolver
        )
        moved[index] = sent.time_s
    # Every prompt goes the same way, answered by the same plugin: the last send says which.
    level = sent_over(sent, pre_profile, together, not same) if sent else ""
    answered = str(sent.source) if sent else ""
    decode_requests = sorted(
        (
            Request(
                i,
                by_index[i].input_tokens,
                by_index[i].output_tokens,
                first[i].first_token_s + moved[i],
                prefilled=True,
            )
            for i in first
            if by_index[i].output_tokens > 1
        ),
        key=lambda r: r.arrival_s or 0.0,  # at a rate: every request has its arrival
    )
    decoded = [
        engine_model.run_engine(
            decode_requests[n::dy],
            limits,
            dec.blocks,
            dec.step,
            None,
            plan.speculation,
            state_blocks=dec.kv.state_blocks,
        )
        for n in range(dy)
    ]
    later = {f.index: f for result in decoded for f in result.finished}
    finished = []
    for index, head in first.items():
        arrival = by_index[index].arrival_s or 0.0
        tail = later.get(index)
        times = [head.first_token_s] + (tail.token_times if tail else [])
        finished.append(
            Finished(
                index,
                head.input_tokens,
                by_index[index].output_tokens,
                arrival,
                head.first_token_s,
                times[-1],
                times,
                head.preemptions + (tail.preemptions if tail else 0),
            )
        )
    mean_moved = sum(moved.values()) / len(moved) if moved else 0.0
    notes = [
        f"disaggregated: {x} prefill instance(s) of {pools.prefill.devices} {pre_profile.name} device(s), "
        f"{y} decode instance(s) of {pools.decode.devices} {dec_profile.name} device(s); each prompt's KV "
        f"cache moves over {level} (castcore::send, answered by {answered}; mean {format_ms(mean_moved * 1e3)}), "
        "its first token from the prefill instance"
    ]
    figures = {
        "prefill_instances": x,
        "decode_instances": y,
        "mean_kv_transfer_ms": round(mean_moved * 1e3, 4),
        "devices": x * pools.prefill.devices + y * pools.decode.devices,
    }
    return report_of(
        plan,
        [*prefilled, *decoded],
        finished,
        prefix_from=prefilled,  # prefixes: where prompts run
        figures=figures,
        mean_running=decoded[0].mean_running if decoded else 0.0,
        device=f"{pre_profile.name} (prefill) + {dec_profile.name} (decode)",
        kv_blocks=dec.blocks,
        kv_bytes_per_token=dec.per_token,
        kv_usage=decoded[0].kv_usage if decoded else [],
        kv_capacity=dec.kv.for_requests(plan.requests),
        deployment={
            "prefill": pools.prefill.options(),
            "decode": pools.decode.options(),
            "prefill_instances": x,
            "decode_instances": y,
        },
        notes=notes,
        overheads=pre.step.summary(),
        iterations_trace=(decoded or prefilled)[0].trace,
        pool_use=[
            pool_use(pre_profile.name, pools.prefill, x, pre.meters, [r.trace for r in prefilled]),
            pool_use(dec_profile.name, pools.decode, y, dec.meters, [r.trace for r in decoded]),
        ],
    )
