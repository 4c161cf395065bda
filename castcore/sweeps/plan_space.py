"""The candidates ``castcore plan`` searches, and those it skips before anything runs, counted by reason.

A candidate is a device, a parallel layout (castcore.sweeps.plan's module docstring says which are tried), a weight,
activation and KV cache dtype, and under traffic the engine's token budget (``--max-batched-tokens``) and running
requests (``--max-running-requests``), one or more values each (none given: the ``--engine`` preset's). A candidate
that cannot run is not run but skipped and counted with why:

- a layout needing more devices than a replica may have (``--max-devices``, or the device's widest interconnect);
- a split the model's shape refuses, as ``castcore estimate`` would refuse it (castcore.workload.spec.
  check_model_split: tensor parallel sizes that do not divide the heads, expert parallel sizes that do not divide
  the experts, more stages than layers);
- expert parallelism wider than tensor parallelism (attention data parallel) with pipeline stages;
- weights with activations no kernel pairs (castcore.workload.spec.activation_fault: bf16 weights with fp8
  activations);
- under ``--disaggregated``, the pool candidates past its bound (castcore.sweeps.plan_disaggregated).
"""

from __future__ import annotations

import itertools
from typing import Any

from castcore.options.catalog import say
from castcore.sweeps.spec import one_line
from castcore.workload.spec import (
    ModelError,
    activation_fault,
    check_model_split,
    is_factory,
    load_model_config,
    routed_experts,
)

PlanRequest = Any  # castcore.sweeps.plan's, which imports this module
ENGINE_LIMITS = ("max_batched_tokens", "max_running_requests")  # searched under traffic only
# a candidate's own keys beside the model, the lengths and the price: its device, layout and dtypes
LAYOUT_NAMES = ("device", "tp", "pp", "ep", "weights", "activations", "kv_cache")


class Skipped:
    """Candidates skipped, by reason: how many, and one of them in a few words."""

    def __init__(self) -> None:
        self.reasons: dict[str, dict[str, Any]] = {}

    def add(self, reason: str, example: str, count: int = 1) -> None:
        found = self.reasons.setdefault(reason, {"reason": reason, "count": 0, "example": example})
        found["count"] += count

    def listed(self) -> list[dict[str, Any]]:
        return list(self.reasons.values())


def parallel(row: dict[str, Any], replicas: bool = False) -> str:
    """A layout's parallel sizes in words: 'tp 2 x pp 2', 'attention dp 4, ep 4' (the experts over 4 groups of tp
    devices), '1 device'; with ``replicas``, its dp too."""
    tp, ep = row.get("tp") or 1, row.get("ep") or 1
    groups = ep // tp if ep > tp else 1
    sizes = (
        ("tp", tp),
        ("attention dp", groups),
        ("pp", row.get("pp") or 1),
        ("ep", 1 if groups > 1 else ep),
        ("dp", (row.get("dp") or 1) if replicas else 1),
    )
    words = " x ".join(f"{k} {n}" for k, n in sizes if n > 1) or "1 device"
    return words + (f", ep {ep}" if groups > 1 else "")


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def layouts(
    config: dict[str, Any] | None,
    device: Any,
    request: PlanRequest,
    skipped: Skipped | None = None,
    each: int = 1,
) -> list[dict[str, int]]:
    """The parallel layouts searched for one device; each one dropped goes to ``skipped`` as ``each`` candidates
    (its dtype and engine-limit combinations)."""
    levels = device.interconnect
    largest = max((level.devices for level in levels), default=1)
    node = min((level.devices for level in levels), default=1)
    limit = max(1, min(request.max_devices, largest))
    text = config.get("text_config") or config if config else {}
    heads = text.get("num_attention_heads") or text.get("n_head")
    layers = text.get("num_hidden_layers") or text.get("n_layer") or 1
    experts = routed_experts(config) if config else None
    if request.tp is not None:
        tps = list(request.tp)
    else:
        tps = [d for d in divisors(heads) if d <= node] if isinstance(heads, int) else [1]
    widest = max((t for t in tps if t <= limit), default=0)
    tried = []
    for tp in tps:
        if request.pp is not None:
            pps = request.pp
        else:  # stages beyond a full node's tensor parallelism
            pps, stages = [1], 2
            while tp == widest and tp * stages <= limit and stages <= layers:
                pps.append(stages)
                stages *= 2
        eps = [1] + ([tp] if isinstance(experts, int) and tp > 1 else [])
        groups = 2  # attention data parallel: the experts over 2, 4, ... groups of tp devices (wide EP)
        while isinstance(experts, int) and tp * groups <= limit:
            eps.append(tp * groups)
            groups *= 2
        tried += [{"tp": tp, "pp": pp, "ep": ep} for pp in pps for ep in eps]
    wider = f", {device.name}'s widest interconnect holds {largest}" if largest < request.max_devices else ""
    found = []
    for layout in tried:
        tp, pp, ep = layout["tp"], layout["pp"], layout["ep"]
        reason = None
        if max(tp, ep) * pp > limit:
            reason = (
                f"more devices than a replica may have ({say('max_devices', request.max_devices)}{wider})"
            )
        elif ep > tp and pp > 1:
            reason = "attention data parallel (ep above tp) is not searched with pipeline stages"
        elif config is not None:
            try:
                check_model_split(
                    request.model, config, tp=tp, ep=ep, pp=pp, groups=ep // tp if ep > tp else 0
                )
            except ModelError as exc:
                reason = one_line(exc)
        if reason is None:
            found.append(layout)
        elif skipped is not None:
            skipped.add(reason, f"{device.name} {parallel(layout)}", each)
    return found


def choices(
    request: PlanRequest, devices: dict[str, Any], more: dict[str, Any], skipped: Skipped
) -> list[dict[str, Any]]:
    """Every candidate that can run (see the module docstring), as a point's values (with ``more``); the others
    counted in ``skipped``. ModelError when none can."""
    config = None if is_factory(request.model) else load_model_config(request.model)
    limits = (
        [
            dict(zip(ENGINE_LIMITS, pair))
            for pair in itertools.product(request.max_batched_tokens, request.max_running_requests)
        ]
        if request.traffic
        else [{}]
    )
    each = len(request.weights) * len(request.activations) * len(request.kv_cache) * len(limits)
    chosen = []
    for name in request.devices:
        for layout in layouts(config, devices[name], request, skipped, each):
            for weights, activations in itertools.product(request.weights, request.activations):
                fault = activation_fault(weights, activations)
                if fault:
                    words = (
                        f"{parallel(layout)}, {weights or request.dtype} weights, {activations} activations"
                    )
                    skipped.add(fault, f"{name} {words}", len(request.kv_cache) * len(limits))
                    continue
                chosen += [
                    {
                        "model": request.model,
                        # simulate's lengths are text: a length or a distribution
                        "input": str(request.input_tokens) if request.traffic else request.input_tokens,
                        "output": str(request.output_tokens) if request.traffic else request.output_tokens,
                        "dtype": request.dtype,
                        "device": name,
                        "weights": weights,
                        "activations": activations,
                        "kv_cache": kv_cache,
                        "price_per_device_hour": request.price(name),
                        **more,
                        **layout,
                        **engine,
                    }
                    for kv_cache in request.kv_cache
                    for engine in limits
                ]
    if not chosen:
        first = next(iter(skipped.reasons), "no layout was generated")
        raise ModelError(
            f"no candidate deployment of {request.model} within {say('max_devices', request.max_devices)} "
            f"on {', '.join(request.devices)} can run: {first}; change {say('tp')}/{say('pp')}, "
            f"{say('max_devices')} or the dtypes"
        )
    return chosen
