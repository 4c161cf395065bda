"""The roofline: time from work and bytes on a device's peak rates, scaled by its efficiencies."""

from __future__ import annotations

from castcore.devices.costs import Estimate, PerformanceProperties, Source
from castcore.devices.profile import DeviceProfile


def roofline(props: PerformanceProperties, device: DeviceProfile, source: Source | None = None) -> Estimate:
    """max(compute, memory) plus the device's fixed cost per launch; zero for work-free ops (views)."""
    compute_s = 0.0
    rates = {}
    uses_mma = False
    for dtype, ops in props.compute_ops.items():
        for unit, count in (("mma", ops.mma_ops), ("gp", ops.gp_ops)):
            if count:
                rate, used = device.rate(unit, dtype)
                compute_s += count / (rate * device.compute_efficiency)
                rates[f"{unit}:{dtype}"] = used
                uses_mma = uses_mma or unit == "mma"
    memory_s = props.memory_bytes / (device.memory_bandwidth * device.memory_efficiency)
    if compute_s == 0 and memory_s == 0:
        return Estimate(time_s=0.0, bound="none", source=source)
    overhead_s = device.mma_op_cost_s if uses_mma else device.gp_op_cost_s
    busy = max(compute_s, memory_s)
    bound = "overhead" if overhead_s > busy else ("compute" if compute_s >= memory_s else "memory")
    return Estimate(time_s=busy + overhead_s, compute_s=compute_s, memory_s=memory_s, overhead_s=overhead_s,
                    bound=bound, source=source, detail={"rates": rates} if rates else {})
