"""Disaggregated pools as options give them: ``--prefill-instances``, ``--decode-instances`` and each pool's
deployment (``--prefill-deployment "tp=4 weights=fp8 device=h200-sxm"``), checked as their options check them.
castcore.serving.disaggregated runs them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from castcore.errors import ModelError
from castcore.options.catalog import DEPLOYMENT_NAMES, say
from castcore.options.traffic import SIMULATE
from castcore.workload.spec import Workload, build_workload

if TYPE_CHECKING:
    from castcore.devices.profile import DeviceProfile


@dataclass(frozen=True)
class Pools:
    prefill_instances: int
    decode_instances: int
    prefill: Workload  # a prefill instance's deployment
    decode: Workload  # and a decode instance's
    prefill_device: str | DeviceProfile | None  # None: the simulation's device
    decode_device: str | DeviceProfile | None


def pools_of(
    given: dict[str, Any], options: dict[str, Any], device: str | DeviceProfile | None = None
) -> Pools | None:
    """The two pools from ``--prefill-instances``, ``--decode-instances`` and their deployments, or None."""
    x, y = given["prefill_instances"], given["decode_instances"]
    if x is None and y is None:
        for name in ("prefill_deployment", "decode_deployment"):
            if given[name] is not None:
                raise ModelError(
                    f"{say(name)} needs {say('prefill_instances')} and {say('decode_instances')}"
                )
        return None
    if x is None or y is None:
        raise ModelError(
            f"disaggregated serving needs both {say('prefill_instances')} and {say('decode_instances')}"
        )
    if given["concurrency"] is not None:
        raise ModelError(
            f"{say('concurrency')} with disaggregated pools is not simulated; give {say('rate')}"
        )
    workloads, devices = [], []
    for name in ("prefill_deployment", "decode_deployment"):
        changed, pool_device = _deployment(name, given[name], device)
        workloads.append(build_workload(options.get("model"), **{**_without_model(options), **changed}))
        devices.append(pool_device)
    return Pools(x, y, workloads[0], workloads[1], devices[0], devices[1])


def _without_model(options: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in options.items() if k != "model"}


def _deployment(
    name: str, text: str | None, device: str | DeviceProfile | None
) -> tuple[dict[str, Any], str | DeviceProfile | None]:
    """``key=value`` pairs of deployment options (and ``device``), checked as their options check them."""
    found: dict[str, Any] = {}
    for pair in (text or "").replace(",", " ").split():
        key, _, value = pair.partition("=")
        key = key.replace("-", "_")
        if key != "device" and key not in DEPLOYMENT_NAMES or not value:
            raise ModelError(
                f"{say(name, text)}: {pair!r} is not OPTION=VALUE of a deployment option "
                f"({', '.join(('device', *DEPLOYMENT_NAMES))})"
            )
        if key == "device":
            device = value
            continue
        option = SIMULATE[key]
        found[key] = option.check(int(value) if option.kind == "int" and value.isdigit() else value)
    return found, device
