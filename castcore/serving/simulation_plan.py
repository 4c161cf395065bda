"""A simulation checked before anything is captured: ``check`` turns ``castcore simulate``'s options into a
``Simulation`` (the deployment's Workload, the engine's limits, the requests with their arrivals, the objectives,
speculative decoding and disaggregated pools), each fault one ModelError naming the option."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from castcore.errors import ModelError
from castcore.options.catalog import DEPLOYMENT_NAMES, say
from castcore.options.parts import AXIS
from castcore.options.traffic import ENGINE_OPTIONS, SIMULATE
from castcore.options.option import Placeholder
from castcore.report.memory import config_field, language_config
from castcore.serving import speculation
from castcore.serving.pools import Pools, pools_of
from castcore.simulation.arrivals import Arrivals
from castcore.simulation.lengths import Lengths
from castcore.simulation.presets import EngineLimits, limits
from castcore.simulation.requests import Request, make_requests, read_dataset, reject_overlong, share_prefix
from castcore.workload import draft_heads
from castcore.workload.spec import DEFAULT_MODEL, Workload, build_workload, is_factory, load_model_config

# The traffic and objective options; the engine's limits are ENGINE_OPTIONS, the rest the deployment's.
TRAFFIC_NAMES = tuple(
    o.name
    for o in SIMULATE.scoped(AXIS)
    if o.name not in (*ENGINE_OPTIONS, *DEPLOYMENT_NAMES, "model", "device")
)


def requests_for(
    model: str,
    requests: int,
    input_lengths: Any,
    output_lengths: Any,
    dataset: Any,
    arrivals: Arrivals,
    seed: int,
    max_model_len: int | None = None,
) -> tuple[list[Request], list[dict[str, Any]]]:
    """The requests a run serves, each with its arrival time (None in a closed loop), and those the engine
    rejects (``reject_overlong``) for exceeding its context: ``max_model_len``, or the model's position limit."""
    found = (
        read_dataset(dataset)
        if dataset is not None
        else make_requests(
            requests,
            lengths_of("input_lengths", input_lengths),
            lengths_of("output_lengths", output_lengths),
            seed,
        )
    )
    found = arrivals.schedule(found, seed)
    position = None
    if not is_factory(model):
        position = config_field(language_config(load_model_config(model)), "max_position_embeddings")
        position = position if isinstance(position, int) else None
    if max_model_len is not None and position is not None and max_model_len > position:
        raise ModelError(
            f"{say('max_model_len', max_model_len)}: above {model}'s position limit of {position} "
            f"(max_position_embeddings); give at most {say('max_model_len', position)}"
        )
    if max_model_len is not None:
        context, limit = max_model_len, say("max_model_len")
    elif position is not None:
        context, limit = position, "the model's position limit"
    else:
        return found, []
    kept, rejected = reject_overlong(found, context, limit)
    if not kept:
        raise ModelError(
            f"all {len(rejected)} requests are rejected: request {rejected[0]['index']} needs "
            f"{rejected[0]['why']}; give shorter {say('input_lengths')}/{say('output_lengths')} lengths or "
            f"a dataset that fits"
            + ("" if position is None or context == position else f", or a larger {say('max_model_len')}")
        )
    return kept, rejected


def lengths_of(name: str, text: str) -> Lengths:
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
    base: Workload  # the deployment
    engine: str
    limits: EngineLimits
    requests: list[Request]
    concurrency: int | None
    slo_ttft: float | None
    slo_tpot: float | None
    speculation: tuple[int, float] | None = None  # (draft tokens, tokens a decode step keeps)
    draft: Workload | None = None  # the draft model's, on the same deployment
    pools: Pools | None = None  # disaggregated prefill and decode
    # the requests the engine refuses, beyond its context ({"index", "why"}): failed, never run
    rejected: list[dict[str, Any]] = field(default_factory=list)
    stop_saturated: bool = False  # end a run once its steady window is saturated (castcore.simulation.engine)


def check(model: str = DEFAULT_MODEL, **options: Any) -> Simulation:
    """Every option checked and the requests made (see ``castcore.serving.traffic``); ModelError names the option at fault."""
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
    for switch in ("chunked_prefill", "mixed_chunk"):
        if switch in overrides:
            overrides[switch] = overrides[switch] == "on"
    base = build_workload(model, **options)
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
    pools = pools_of(given, {**options, "model": model})
    found, rejected = requests_for(
        model,
        given["requests"],
        given["input_lengths"],
        given["output_lengths"],
        given["dataset"],
        arrivals,
        given["seed"],
        given["max_model_len"],
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
        rejected=rejected,
        concurrency=given["concurrency"],
        slo_ttft=given["slo_ttft"],
        slo_tpot=given["slo_tpot"],
        speculation=spec,
        draft=draft,
        pools=pools,
        stop_saturated=given["stop_saturated"],
    )


def _speculation(
    model: str, given: dict[str, Any], options: dict[str, Any]
) -> tuple[tuple[int, float] | None, Workload | None]:
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
