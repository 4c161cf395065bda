"""What a deployment's device time costs: energy from a power model of each device, money from a price per
device-hour.

Power. A device draws ``idle_w`` holding a deployment between kernels and up to ``tdp_w`` (its board power
limit) while a kernel keeps its compute or memory units busy:

    power = idle_w + (tdp_w - idle_w) x utilization

where utilization is the share of the step's time that some op keeps the device busy: per op, its time less its
launch overhead and its communication (for a roofline estimate that is max(compute, memory): the busier of the
op's compute-bound and memory-bound times, the unit that runs flat out while the other waits on it). Launch gaps,
collectives and pipeline bubbles count as idle. A step's energy is then

    energy = idle_w x step time + (tdp_w - idle_w) x busy time

so nothing needs averaging: the busy seconds of every step add up. The model takes a busy device at its board
limit; memory-bound kernels draw less than compute-bound ones in practice, so decode-heavy energy is an upper
estimate within the idle..TDP range.

Money. At ``price`` dollars per device-hour, $/Mtok is what public cost dashboards and engines quote: the price
over the tokens per second per device the deployment delivers while working, at the interactivity it served
(output tokens/s per user, 1000 / mean TPOT in ms). Only the working device-seconds (every device of an
instance while its engine runs an iteration) are charged to tokens, split between input and output tokens by the
share of the iterations' time that went to prompts; a static batch works all its time, its prefill for the input
tokens and its decode for the output. Device time held but idle (a rate below what the devices serve) is reported
apart, as its share of the held time and its dollars per hour, never charged to tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from castcore.report.records import Report

HOUR_S = 3600.0
MILLION = 1e6


def has_power(device: Any) -> bool:
    """Whether a profile gives the power model's two numbers."""
    return bool(getattr(device, "tdp_w", 0.0))


def busy_s(report: Report) -> float:
    """Seconds one device's units are busy in a step: per op, its time less launch overhead and communication;
    under ``--pp`` the average device's (every stage runs its share of the layers for each micro-batch)."""
    busy = sum(
        max(0.0, r.estimate.time_s - r.estimate.overhead_s - r.estimate.comm_s) for r in report.records
    )
    staged = getattr(report, "pipeline", None)
    if staged is not None:
        busy = min(busy * staged.micro_batches / staged.stages, staged.step_s)
    return busy


def energy_j(device: Any, time_s: float, busy: float) -> float:
    """Joules one device draws over ``time_s`` seconds of which ``busy`` are busy (see the module docstring)."""
    busy = min(max(busy, 0.0), time_s)
    return device.idle_w * time_s + (device.tdp_w - device.idle_w) * busy


def fitted_sum(points: dict[int, float], first: int, count: int) -> float:
    """The least-squares line through ``points`` (kv -> value) summed over kv = first .. first + count - 1."""
    n = len(points)
    mean_x, mean_y = sum(points) / n, sum(points.values()) / n
    spread = sum((x - mean_x) ** 2 for x in points)
    b = sum((x - mean_x) * (y - mean_y) for x, y in points.items()) / spread if spread else 0.0
    a = mean_y - b * mean_x
    return count * a + b * (count * first + count * (count - 1) / 2)


@dataclass(frozen=True)
class PhaseTime:
    """One phase of serving on one device: its seconds, its busy seconds and the tokens it makes."""

    seconds: float
    busy_s: float
    tokens: int


def energy_figures(device: Any, devices: int, prefill: PhaseTime, decode: PhaseTime) -> dict[str, Any]:
    """Energy of a request batch on ``devices`` devices (each drawing as ``device``), its prefill giving the input
    tokens and its decode the output tokens; empty when the profile has no power numbers."""
    if not has_power(device):
        return {}
    prefill_j = devices * energy_j(device, prefill.seconds, prefill.busy_s)
    decode_j = devices * energy_j(device, decode.seconds, decode.busy_s)
    total = prefill_j + decode_j
    seconds = prefill.seconds + decode.seconds
    return {
        "energy_j": total,
        "prefill_energy_j": prefill_j,
        "decode_energy_j": decode_j,
        "power_w_per_device": total / devices / seconds if seconds else None,
        "utilization": (prefill.busy_s + decode.busy_s) / seconds if seconds else None,
        "joules_per_input_token": prefill_j / prefill.tokens,
        "joules_per_output_token": total / decode.tokens,
        "output_tokens_per_joule": decode.tokens / total if total else None,
    }


@dataclass(frozen=True)
class DeviceTime:
    """A deployment's device-seconds: ``held`` (every device for the whole run) and, of them, those working
    for the input tokens (prompts) and for the output tokens."""

    held: float
    input: float
    output: float


def cost_figures(
    price: float | None,
    devices: int,
    time: DeviceTime,
    input_tokens: int,
    output_tokens: int,
    per_user: float | None,
) -> dict[str, Any]:
    """Dollars at ``price`` per device-hour (see the module docstring): per million input and output tokens (their
    working device time), per hour of the ``devices`` held, and the idle share of the held time with its dollars
    per hour; ``per_user``, the output tokens/s per user the tokens were served at. Empty without a price."""
    if price is None:
        return {}
    per_second = price / HOUR_S
    idle = min(max(1 - (time.input + time.output) / time.held, 0.0), 1.0) if time.held else 0.0
    return {
        "price_per_device_hour": price,
        "usd_per_hour": price * devices,
        "usd_per_million_input_tokens": per_second * time.input / input_tokens * MILLION
        if input_tokens
        else None,
        "usd_per_million_output_tokens": per_second * time.output / output_tokens * MILLION
        if output_tokens
        else None,
        "output_tokens_per_s_per_user": per_user,
        "idle_share": idle,
        "usd_per_hour_idle": price * devices * idle,
    }


def prefill_share(
    prefill_tokens: Sequence[float], decode_tokens: Sequence[float], durations: Sequence[float]
) -> float | None:
    """The share of an engine's iteration time that went to prompts: each iteration's time split between its
    prefill and decode tokens by their counts (a mixed iteration's linear layers, most of its time, cost each
    token alike); None without iterations."""
    prompt = total = 0.0
    for p, d, t in zip(prefill_tokens, decode_tokens, durations):
        if p + d:
            prompt += t * p / (p + d)
            total += t
    return prompt / total if total else None


def simulation_cost(price: float | None, pools: Sequence[PoolUse], summary: dict[str, Any]) -> dict[str, Any]:
    """Dollars of a simulated run at ``price`` per device-hour (see the module docstring): every pool's devices
    held for the run's duration, its working device-seconds charged to the tokens, split between input and output
    by its iterations' prefill share."""
    if price is None:
        return {}
    duration = summary["duration"]
    working = [min(use.working_device_s, use.devices * duration) for use in pools]
    prompts = sum(w * use.prefill_share for w, use in zip(working, pools))
    devices = sum(use.devices for use in pools)
    return {
        **cost_figures(
            price,
            devices,
            DeviceTime(devices * duration, prompts, sum(working) - prompts),
            summary["total_input_tokens"],
            summary["total_output_tokens"],
            summary.get("output_tokens_per_s_per_user"),
        ),
        "prefill_time_share": prompts / sum(working) if sum(working) else 0.0,
    }


@dataclass(frozen=True)
class PoolUse:
    """One pool of a simulated deployment (all of it, or a disaggregated deployment's prefill or decode pool): its
    device, how many of them, and the device-seconds their units were busy (for the energy), summed over them (castcore.serving.metering:
    each scheduler's iterations' busy seconds, times the devices running each iteration, over its pipeline
    stages, as a device runs 1/pp of an iteration's layers)."""

    device: str
    devices: int
    busy_device_s: float
    # the device-seconds its engines ran iterations (the cost's working time) and the share of it spent on prompts
    working_device_s: float
    prefill_share: float


def simulation_energy(pools: Sequence[tuple[Any, PoolUse]], summary: dict[str, Any]) -> dict[str, Any]:
    """Energy of a simulated run: every device of every pool (``(profile, use)`` pairs) held for the run's duration
    and busy for its pool's share of the busy device-seconds; empty when a pool's profile has no power numbers."""
    if not pools or not all(has_power(device) for device, _ in pools):
        return {}
    duration = summary["duration"]
    total = sum(energy_j(device, use.devices * duration, use.busy_device_s) for device, use in pools)
    held = sum(use.devices for _, use in pools) * duration
    busy = sum(min(use.busy_device_s, use.devices * duration) for _, use in pools)
    output = summary["total_output_tokens"]
    return {
        "energy_j": total,
        "power_w_per_device": total / held if held else None,
        "utilization": busy / held if held else None,
        "joules_per_output_token": total / output if output else None,
        "output_tokens_per_joule": output / total if total else None,
    }


def format_lines(figures: dict[str, Any]) -> list[str]:
    """The energy and cost lines a report prints, from its figures (those present)."""
    lines = []
    if figures.get("energy_j") is not None:
        lines.append(
            f"energy       {figures['energy_j']:,.1f} J ({figures['power_w_per_device']:,.0f} W per device "
            f"at {figures['utilization']:.0%} busy): {figures['output_tokens_per_joule']:.3g} output "
            f"tokens/J, {figures['joules_per_output_token']:.3g} J per output token"
        )
    if figures.get("usd_per_hour") is not None:
        per_user = figures.get("output_tokens_per_s_per_user")
        lines += [
            f"cost         ${figures['usd_per_million_input_tokens']:,.4g} per million input tokens, "
            f"${figures['usd_per_million_output_tokens']:,.4g} per million output tokens"
            + (f" at {per_user:,.1f} tok/s/user" if per_user else "")
            + f" (working device time at ${figures['price_per_device_hour']:g} per device-hour)",
            f"idle         {figures['idle_share']:.0%} of the held device time, "
            f"${figures['usd_per_hour_idle']:,.2f}/hour of the ${figures['usd_per_hour']:,.2f}/hour held "
            "(not in the $ per million tokens)",
        ]
    return lines
