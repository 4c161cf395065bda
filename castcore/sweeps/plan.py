"""``castcore plan``: which device, parallel layout, weight dtype and batch serve a model's traffic best.

The search is a sweep of ``castcore serve`` points, run by the sweep machinery (castcore.sweeps.run):

1. every layout on every device, each at ``--max-batch`` (serve's largest batch that fits in memory, found by
   bisection over captured peaks): the layouts are tensor parallel over the divisors of the attention heads up to
   the device's innermost interconnect level (a node), pipeline stages beyond that (as deployments put tensor
   parallelism inside a node and pipeline stages across nodes), for a mixture-of-experts model expert parallel
   equal to the tensor parallel and wider (attention data parallel over 2, 4, ... groups of the tensor-parallel
   devices, without stages), each with every weight dtype asked; at most ``max_devices`` devices a replica;
2. a layout whose largest batch misses a latency objective (TTFT, TPOT: both grow with the batch) is tried again
   at the next lower power of two, round after round, until it meets them or batch 1 does not.

Every point that fits and meets the objectives is a candidate; the best are those with the most output tokens/s
per device, or under ``objective`` the fewest dollars per million output tokens or the most output tokens per
joule. The fewest devices that fit at all, per device, come from step 1. The candidates, and those skipped before
anything runs with why, come from castcore.sweeps.plan_space.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from castcore.options.catalog import say
from castcore.options.plan import PLAN, SHARED_TRAFFIC
from castcore.options.option import Objective
from castcore.plugins.selection import PluginOptions
from castcore.sweeps import plan_disaggregated, plan_frontier, plan_traffic, plan_validation
from castcore.sweeps.plan_space import Skipped, choices
from castcore.sweeps.capacity import PLAN_KEYS
from castcore.sweeps import plan_objective
from castcore.sweeps.plan_objective import objective_key
from castcore.sweeps.run import SweepResult
from castcore.sweeps.spec import Command, Point, make_points
from castcore.workload import checkpoint
from castcore.workload.spec import ModelError, is_factory, load_model_config


@dataclass
class PlanRequest:
    model: str
    input_tokens: int | str = 2048  # under traffic: simulate's lengths, a distribution's text
    output_tokens: int | str = 256
    devices: list[str] = field(default_factory=list)
    ttft: Objective | None = None
    tpot: Objective | None = None
    max_devices: int = 8
    top: int = 5
    tp: list[int] | None = None  # None: searched (see the module docstring)
    pp: list[int] | None = None
    weights: list[str | None] = field(default_factory=lambda: [None, "int8"])  # None: the model dtype
    activations: list[str | None] = field(default_factory=lambda: [None])  # None: as the weights have them
    kv_cache: list[str | None] = field(default_factory=lambda: [None])  # None: the model dtype
    # the engine's limits searched under traffic (castcore.sweeps.plan_space); None: the --engine preset's
    max_batched_tokens: list[int | None] = field(default_factory=lambda: [None])
    max_running_requests: list[int | None] = field(default_factory=lambda: [None])
    dtype: str = "bf16"
    # Traffic (castcore.sweeps.capacity): simulated deployments instead of one static batch each.
    rate: float | None = None
    concurrency: int | None = None
    max_rate: bool = False
    requests: int = 500
    engine: str = "vllm"
    # the best confirmed by longer simulations (castcore.sweeps.plan_validation); 0: not confirmed
    validate: int = 3
    validate_requests: int = 4000
    # simulate's other traffic options, by name, passed to each simulation (castcore.sweeps.plan_traffic)
    shared: dict[str, Any] = field(default_factory=dict)
    # What the best maximise (castcore.sweeps.plan_objective.objective_key), and the price the cost objective needs.
    objective: str = "throughput"
    price_per_device_hour: float | None = None
    device_prices: dict[str, float] = field(default_factory=dict)  # a device's own price, over the one above
    disaggregated: bool = (
        False  # also search disaggregated prefill/decode layouts (castcore.sweeps.plan_disaggregated)
    )

    def price(self, device: str) -> float | None:
        return self.device_prices.get(device, self.price_per_device_hour)

    @property
    def traffic(self) -> bool:
        return self.rate is not None or self.concurrency is not None or self.max_rate

    @property
    def ttft_s(self) -> float | None:
        return None if self.ttft is None else self.ttft.seconds

    @property
    def tpot_s(self) -> float | None:
        return None if self.tpot is None else self.tpot.seconds

    def meets(self, row: dict[str, Any]) -> bool:
        """Fits, and meets the latency objectives: a static batch's every request has the same latency, so any
        statistic of them is that latency. Under traffic, a simulated row as the confirming rounds judge it
        (castcore.sweeps.plan_validation: not saturated, each objective's interval within it)."""
        if self.traffic:
            return not plan_validation.misses(self, row)
        return (
            not row.get("error")
            and row.get("fits") is True
            and (self.ttft_s is None or row["ttft_s"] <= self.ttft_s)
            and (self.tpot_s is None or row["tpot_s"] <= self.tpot_s)
        )


@dataclass
class PlanResult:
    request: PlanRequest
    rows: list[dict[str, Any]]  # every point evaluated, rounds after the first included
    best: list[dict[str, Any]]
    fewest: list[dict[str, Any]]  # per device, the layout with the fewest devices that fits batch 1 or more
    layouts: int = 0
    refused: list[dict[str, Any]] = field(default_factory=list)  # layouts the model or device cannot take
    seconds: float = 0.0
    # under traffic: layouts that ran but never met, each at its last try, with why under "missed"
    missed: list[dict[str, Any]] = field(default_factory=list)
    verdict: dict[str, Any] | None = None  # with disaggregated layouts: which kind wins and why
    # with --frontier: each best row's throughput-per-device curve (castcore.sweeps.plan_frontier)
    frontier: list[list[dict[str, Any]]] | None = None
    # candidates not run, by reason: {"reason", "count", "example"} (castcore.sweeps.plan_space)
    skipped: list[dict[str, Any]] = field(default_factory=list)
    # per device type searched, its best and how it compares (castcore.sweeps.plan_objective)
    by_device: list[dict[str, Any]] = field(default_factory=list)


def _next_batch(batch: int) -> int | None:
    """The largest power of two below ``batch``; None below 2."""
    if batch < 2:
        return None
    power = 1
    while power * 2 < batch:
        power *= 2
    return power


def search(
    request: PlanRequest, command: Command, devices: dict[str, Any], run: Callable[[list[Point]], SweepResult]
) -> PlanResult:
    """Search (see the module docstring). ``command`` is castcore serve's; ``devices`` the profiles by name;
    ``run`` runs points through one backend kept for every round."""
    import time

    started = time.perf_counter()
    skipped = Skipped()
    chosen = choices(request, devices, {"max_batch": True}, skipped)
    everything: list[dict[str, Any]] = []
    rows = _round(command, chosen, run, everything)
    first = rows
    while True:
        again = []
        for row in rows:
            smaller = None if request.meets(row) or row.get("error") else _next_batch(row["served_batch"])
            if smaller is not None:
                again.append({**{k: row[k] for k in PLAN_KEYS}, "batch": smaller, "max_batch": False})
        if not again:
            break
        rows = _round(command, again, run, everything)
    ranked = sorted(
        (r for r in everything if request.meets(r)),
        key=lambda r: (
            objective_key(request, r, r["output_tokens_per_s_per_device"]),
            r["devices"],
            r["latency_s"],
        ),
    )
    fitting = [r for r in first if not r.get("error")]
    fewest = [
        min(mine, key=lambda r: (r["devices"], -r["output_tokens_per_s_per_device"]))
        for name in request.devices
        if (mine := [r for r in fitting if r["device"] == name])
    ]
    return PlanResult(
        request=request,
        rows=everything,
        best=ranked[: request.top],
        fewest=fewest,
        layouts=len(chosen),
        refused=[r for r in first if r.get("error")],
        seconds=time.perf_counter() - started,
        skipped=skipped.listed(),
        by_device=plan_objective.by_device(request, ranked),
    )


def _round(
    command: Command,
    chosen: list[dict[str, Any]],
    run: Callable[[list[Point]], SweepResult],
    everything: list[dict[str, Any]],
) -> list[dict[str, Any]]:
    points = make_points(command, chosen, chosen[0]["device"])
    rows = run(points).rows
    everything += rows
    return rows


def plan(
    model: str,
    *,
    input_tokens: int | str = 2048,
    output_tokens: int | str = 256,
    ttft: Any = None,
    tpot: Any = None,
    rate: float | None = None,
    concurrency: int | None = None,
    max_rate: bool = False,
    requests: int = 500,
    validate: int = 3,
    validate_requests: int = 4000,
    engine: str = "vllm",
    devices: list[str] | None = None,
    max_devices: int = 8,
    top: int = 5,
    tp: list[int] | None = None,
    pp: list[int] | None = None,
    weights: list[str] | tuple[str, ...] = ("bf16", "int8"),
    activations: list[str] | None = None,
    kv_cache: list[str] | None = None,
    max_batched_tokens: list[int] | None = None,
    max_running_requests: list[int] | None = None,
    dtype: str = "bf16",
    objective: str = "throughput",
    price_per_device_hour: float | None = None,
    device_prices: list[str] | None = None,
    disaggregated: bool = False,
    frontier: bool = False,
    workers: int | None = None,
    backend: str = "local",
    ray_address: str | None = None,
    plugins: PluginOptions | None = None,
    progress: bool | None = False,
    **traffic: Any,
) -> PlanResult:
    """The best deployments of ``model`` for requests of ``input_tokens`` + ``output_tokens``: ``best`` rows by
    output tokens/s per device that fit and meet ``ttft``/``tpot`` (seconds, "50ms", or under traffic a statistic
    such as "p99:500ms"), ``fewest`` devices that fit (under traffic: that meet them) per device. With ``rate``,
    ``concurrency`` or ``max_rate`` the deployments are simulated under traffic (castcore.sweeps.capacity).
    ``objective`` "cost" ranks the best by dollars per million output tokens at ``price_per_device_hour``, "energy"
    by output tokens per joule (castcore.report.energy). The options are ``castcore plan``'s (see its --help);
    ``plugins`` the plugin options; ``traffic`` simulate's options plan shares (castcore.options.plan.SHARED_TRAFFIC:
    dataset, burstiness, seed, prefix_len, prefix_hit_rate, spec_tokens, acceptance, draft_model)."""
    from castcore.sweeps import capacity
    from castcore.sweeps.run import backend_for, run_points
    from castcore.sweeps.sweep import commands, open_session
    from castcore.sweeps.work import Settings
    from castcore.serving.static import check_request

    plugins = plugins or PluginOptions()
    given = {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "ttft": ttft,
        "tpot": tpot,
        "rate": rate,
        "concurrency": concurrency,
        "max_rate": max_rate,
        "requests": requests,
        "validate": validate,
        "validate_requests": validate_requests,
        "engine": engine,
        "devices": devices,
        "max_devices": max_devices,
        "top": top,
        "tp": tp,
        "pp": pp,
        "weights": weights,
        "activations": activations,
        "kv_cache": kv_cache,
        "max_batched_tokens": max_batched_tokens,
        "max_running_requests": max_running_requests,
        "dtype": dtype,
        "objective": objective,
        "price_per_device_hour": price_per_device_hour,
        "device_prices": device_prices,
        "disaggregated": disaggregated,
        "frontier": frontier,
        "workers": workers,
        "backend": backend,
        "ray_address": ray_address,
        **plan_traffic.options_of(traffic),
    }
    values = {name: PLAN[name].check(value) for name, value in given.items()}
    for group in PLAN.exclusive:
        given_together = [name for name in group if values[name] not in (None, False)]
        if len(given_together) > 1:
            raise ModelError(
                f"{say(given_together[0])} and {say(given_together[1])} cannot be given together"
            )
    if list(values["weights"]) == list(PLAN["weights"].default) and not is_factory(model):
        # a quantized checkpoint is planned as it ships
        found = checkpoint.shipped(model, load_model_config(model))
        if found is not None:
            values["weights"] = [found[0]["weights"]]
    request = PlanRequest(
        model=model,
        input_tokens=values["input_tokens"],
        output_tokens=values["output_tokens"],
        ttft=values["ttft"],
        tpot=values["tpot"],
        max_devices=max_devices,
        top=top,
        tp=tp,
        pp=pp,
        dtype=dtype,
        weights=list(dict.fromkeys(None if w == dtype else w for w in values["weights"])),
        activations=plan_traffic.activations(values["activations"], dtype),
        kv_cache=list(values["kv_cache"] or [None]),
        max_batched_tokens=list(values["max_batched_tokens"] or [None]),
        max_running_requests=list(values["max_running_requests"] or [None]),
        rate=values["rate"],
        concurrency=concurrency,
        max_rate=max_rate,
        requests=requests,
        validate=values["validate"],
        validate_requests=values["validate_requests"],
        engine=engine,
        shared={name: values[name] for name in SHARED_TRAFFIC},
        objective=objective,
        price_per_device_hour=values["price_per_device_hour"],
        device_prices=capacity.device_prices(values["device_prices"]),
        disaggregated=disaggregated,
    )
    request.input_tokens, request.output_tokens = plan_traffic.lengths(request)
    if not request.traffic:  # the model and the request, as serve does
        check_request(model, request.input_tokens, request.output_tokens, 1, dtype=dtype)
    capacity.check(request)
    plan_frontier.check(request, frontier)
    plan_traffic.check(request)  # under traffic, the model and the requests as simulate makes them
    session = open_session(plugins)
    # "h200-sxm,mi325x" as well as "h200-sxm mi325x"
    devices = [name for given in devices or () for name in given.split(",") if name]
    for name in devices:
        session.device(name)  # an unknown device fails here, naming the installed ones
    request.devices = list(dict.fromkeys(devices)) or list(session.devices)
    if not request.devices:
        session.device(None)  # none installed: says how to install one
    capacity.check_prices(request, session.devices)
    unpowered = [name for name in request.devices if not session.devices[name].tdp_w]
    if objective == "energy" and unpowered:
        raise ModelError(
            f"{say('objective', 'energy')} needs each device's power (tdp_w and idle_w in its "
            f"profile), which {', '.join(unpowered)} lack: name others with {say('devices')}"
        )
    settings = Settings(session=plugins.session_kwargs(), cwd=os.getcwd())
    command = commands()["simulate" if request.traffic else "serve"]
    with backend_for(backend, workers, settings, ray_address) as runner:

        def run(points: list[Point]) -> SweepResult:
            return run_points(points, command.axes(), settings, runner=runner, progress=progress)

        if request.traffic:
            more = {"requests": requests, "engine": engine, **plan_traffic.point_values(request, False)}
            skipped = Skipped()
            chosen = choices(request, session.devices, more, skipped)
            if request.disaggregated:
                chosen += plan_disaggregated.candidates(chosen, request.max_devices, skipped.add)
            searched = capacity.search(request, command, chosen, run, getattr(runner, "workers", 1))
            result = PlanResult(request=request, **searched, skipped=skipped.listed())
            if frontier:
                result.frontier = plan_frontier.frontier(
                    request,
                    result.best,
                    lambda values: run(make_points(command, values, values[0]["device"])).rows,
                )
            return result
        return search(request, command, session.devices, run)
