"""``castcore plan``'s traffic as simulate takes it: length distributions for ``--input``/``--output``, and simulate's
options named in castcore.options.plan.SHARED_TRAFFIC (``--dataset``, ``--burstiness``, ``--seed``, prefix caching,
speculative decoding). They are checked once, as ``castcore simulate`` checks them, before anything runs, then handed
to every simulation the plan runs, so what it ranks is served under that traffic.

A static plan (no ``--rate``, ``--concurrency`` or ``--max-rate``) prices one batch of requests that all have the same
lengths, so it takes ``--input`` and ``--output`` as whole numbers only and refuses the rest: a distribution's mean or
median in its place would hide the long prompts that decide a percentile.
"""

from __future__ import annotations

from typing import Any

from castcore.errors import ModelError
from castcore.options.catalog import say
from castcore.options.option import Placeholder
from castcore.options.parts import ACTIVATION_DTYPES
from castcore.options.plan import PLAN, SHARED_TRAFFIC
from castcore.options.traffic import SIMULATE
from castcore.serving import simulation_plan
from castcore.simulation.requests import read_dataset
from castcore.sweeps.plan_space import ENGINE_LIMITS

PlanRequest = Any  # castcore.sweeps.plan's, which imports this module


def given(shared: dict[str, Any]) -> dict[str, Any]:
    """The shared traffic options given, those away from simulate's defaults, by name."""
    return {name: value for name, value in shared.items() if value != SIMULATE[name].default}


def point_values(request: PlanRequest, at_rate: bool) -> dict[str, Any]:
    """A simulate point's values (sweep keys) for the shared options given; the burstiness only where requests
    arrive at a rate (``at_rate``), as simulate refuses it elsewhere."""
    return {
        SIMULATE[name].key: value
        for name, value in given(request.shared).items()
        if at_rate or name != "burstiness"
    }


def lengths(request: PlanRequest) -> tuple[Any, Any]:
    """The request's --input and --output checked: whole numbers (the only lengths of a static plan's batch), or
    under traffic distributions' text; ModelError naming the option, or saying that a static plan needs a rate."""
    found = []
    for name in ("input_tokens", "output_tokens"):
        text = getattr(request, name)
        parsed = simulation_plan.lengths_of(name, text)
        if parsed.family == "fixed":
            found.append(int(parsed.params[0]))
        elif request.traffic:
            found.append(str(parsed))
        else:
            _refuse_static(name, text)
    if not request.traffic and (extra := given(request.shared)):
        _refuse_static(*next(iter(extra.items())))
    for name in ENGINE_LIMITS:  # a static batch has no engine scheduling it
        if not request.traffic and getattr(request, name) != [None]:
            _refuse_static(name, getattr(request, name), "is a limit of the engine serving traffic")
    for name in ("validate", "validate_requests"):  # a static batch is priced, not simulated
        if not request.traffic and getattr(request, name) != PLAN[name].default:
            _refuse_static(name, getattr(request, name), "confirms a plan under traffic")
    return found[0], found[1]


def activations(given: list[str] | None, dtype: str) -> list[str | None]:
    """``--activations`` as plan searches them: the model's ``dtype`` named there means unquantized (None);
    ModelError for another unquantized dtype, which the model does not run in."""
    found: list[str | None] = []
    for name in given or [dtype]:
        if name != dtype and name not in ACTIVATION_DTYPES:
            raise ModelError(
                f"{say('activations', [name])}: the model runs in {say('dtype', dtype)}; give {dtype} for "
                f"unquantized activations, or {' or '.join(ACTIVATION_DTYPES)} to quantize them"
            )
        found.append(None if name == dtype else name)
    return list(dict.fromkeys(found))


def _refuse_static(name: str, value: Any, what: str = "describes traffic") -> None:
    raise ModelError(
        f"{say(name, value)} {what}, and a static plan prices one batch of fixed --input and "
        f"--output lengths: give {say('rate', Placeholder('QPS'))}, {say('concurrency', Placeholder('C'))} or "
        f"{say('max_rate', True)} to simulate it"
    )


def check(request: PlanRequest) -> None:
    """Under traffic, the requests made and every shared option checked as simulate checks them (a distribution's
    parameters, the dataset's fields, the position limit, the prefix and speculation options), each fault one
    ModelError naming the option."""
    if not request.traffic:
        return
    options = dict(request.shared)
    if request.max_rate:
        options.pop("burstiness")  # the bisection's rates take it; its first round arrives all at once
        dataset = options["dataset"]
        if dataset is not None and any(r.arrival_s is not None for r in read_dataset(dataset)):
            raise ModelError(
                f"{say('dataset', dataset)} gives each request its arrival time, so {say('max_rate', True)} has "
                f"no rate to vary: drop arrival_s from it, or plan for its own arrivals with {say('concurrency')} "
                f"or {say('rate', Placeholder('QPS'))}"
            )
    simulation_plan.check(
        request.model,
        input_lengths=request.input_tokens,
        output_lengths=request.output_tokens,
        requests=request.requests,
        engine=request.engine,
        rate=request.rate,
        concurrency=request.concurrency,
        dtype=request.dtype,
        **options,
    )


def options_of(traffic: dict[str, Any]) -> dict[str, Any]:
    """``plan``'s keywords beyond its own, which must be SHARED_TRAFFIC's (TypeError otherwise, as Python says)."""
    unknown = [name for name in traffic if name not in SHARED_TRAFFIC]
    if unknown:
        raise TypeError(f"plan() got an unexpected keyword argument {unknown[0]!r}")
    return {name: traffic.get(name, SIMULATE[name].default) for name in SHARED_TRAFFIC}
