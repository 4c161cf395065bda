"""The core's default time of a point-to-point send (castcore::send, castcore.builtin.comm_ops).

A send of ``nbytes`` between two of ``devices`` devices goes over the innermost interconnect level spanning them
(``outermost``: the profile's outermost level): ``nbytes / (bandwidth x efficiency) + latency_s +
comm_op_cost_s``, where a ``full-mesh`` level gives one peer ``1 / (devices - 1)`` of the bandwidth (one link per
peer), as castpack-collectives models it. Packs answer before this (it is the core's estimator, asked last);
castpack-collectives adds NCCL's protocols where the level gives their latencies.
"""

from __future__ import annotations

from castcore.builtin.comm_ops import SEND
from castcore.devices.costs import Estimate
from castcore.devices.profile import DeviceProfile, Interconnect
from castcore.plugins.claims import register_op_estimator
from castcore.recording.invoke import OpInvoke


def send_level(profile: DeviceProfile, devices: int, outermost: bool = False) -> Interconnect:
    """The level a send between two of ``devices`` goes over: the innermost spanning them, else (or when
    ``outermost``) the outermost; ValueError when the profile has no levels."""
    levels = profile.interconnect
    if not levels:
        raise ValueError(f"device {profile.name!r} has no [[interconnect]] levels to send over")
    return levels[-1] if outermost else next((lv for lv in levels if lv.devices >= devices), levels[-1])


def send_seconds(
    nbytes: float, profile: DeviceProfile, devices: int, outermost: bool = False
) -> tuple[float, str]:
    """(seconds, level name) of a send of ``nbytes`` between two of ``devices`` (see the module docstring)."""
    level = send_level(profile, devices, outermost)
    bandwidth = level.bandwidth * level.efficiency
    if level.topology == "full-mesh" and level.devices > 1:
        bandwidth /= level.devices - 1
    return nbytes / bandwidth + level.latency_s + profile.comm_op_cost_s, level.name


@register_op_estimator(SEND)
def send_estimate(invoke: OpInvoke, device: DeviceProfile) -> Estimate:
    x, devices = invoke.args[0], invoke.argument("devices")
    outermost = bool(invoke.argument("outermost", False))
    seconds, level = send_seconds(x.nbytes, device, devices, outermost)
    overhead = device.comm_op_cost_s
    return Estimate(
        time_s=seconds,
        comm_s=seconds - overhead,
        overhead_s=overhead,
        bound="comm",
        detail={
            "collective": "send",
            "level": level,
            "bytes": x.nbytes,
            "devices": devices,
            "outermost": outermost,
        },
    )
