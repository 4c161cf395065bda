"""The roofline: time from work and bytes on a device's peak rates, scaled by its efficiencies."""

from __future__ import annotations

from castcore.devices.costs import Estimate, PerformanceProperties, Source
from castcore.devices.profile import DeviceProfile
from castcore.devices.tiles import tiled_matmul


def roofline(props: PerformanceProperties, device: DeviceProfile, source: Source | None = None) -> Estimate:
    """max(compute, memory) plus the device's fixed cost per launch; zero for work-free ops (views).

    Shape-aware where the profile and the properties allow (see castcore.devices.tiles): matrix products with
    known shapes are timed by their tiles and waves, a fused attention kernel at the profile's
    attention_efficiency, and a transfer pays the bandwidth ramp memory_half_bytes (which, measured end to end,
    includes the launch: the per-op cost is then a floor rather than an addition); a memory-bound family the
    profile's [memory_kernels] lists streams at its own efficiency, ramp and floor, and a plain matrix product
    (a GEMM) streams its operands at mma_memory_efficiency after the ramp mma_half_bytes and takes at least
    mma_floor_s."""
    compute_s = 0.0
    rates: dict[str, str] = {}
    detail: dict = {}
    uses_mma = False
    for dtype, ops in props.compute_ops.items():
        for unit, count in (("mma", ops.mma_ops), ("gp", ops.gp_ops)):
            if not count:
                continue
            rate, used = device.rate(unit, dtype)
            rates[f"{unit}:{dtype}"] = used
            efficiency = device.efficiency(unit, used)
            if unit == "mma":
                uses_mma = True
                if props.kernel == "attention" and device.attention_efficiency:
                    # measured in bf16; a dtype whose GEMMs sustain less of their peak (fp8) loses as much here
                    efficiency = device.attention_efficiency * efficiency / device.compute_efficiency
                elif props.matmuls and sum(1 for o in props.compute_ops.values() if o.mma_ops) == 1:
                    tiled = _tiled(props, device, dtype, rate * efficiency)
                    if tiled is not None:
                        seconds, covered, detail = tiled
                        compute_s += seconds
                        count -= covered
                        if count <= 0:
                            continue
            compute_s += count / (rate * efficiency)
    # A memory-bound family the profile lists (props.kernel, castcore.devices.memory_kernels) streams at its own
    # fraction, ramp and floor; a plain matrix product (no kernel family) at the profile's GEMM ones; every other
    # call at the device-wide ones.
    family = device.memory_kernels.get(props.kernel) if not uses_mma else None
    gemm = uses_mma and not props.kernel
    efficiency = _given(family and family.efficiency, device.memory_efficiency)
    if gemm and device.mma_memory_efficiency:
        efficiency = device.mma_memory_efficiency
    bandwidth = device.memory_bandwidth * efficiency
    # The bandwidth ramp is a streaming kernel's (measured end to end, launch included); matrix kernels keep
    # their additive launch cost, a GEMM's operands their own ramp.
    ramp = _given(family and family.half_bytes, device.memory_half_bytes) if not uses_mma else 0.0
    if gemm:
        ramp = device.mma_half_bytes
    memory_s = (props.memory_bytes + ramp) / bandwidth if props.memory_bytes else 0.0
    if props.kernel == "grouped_mm" and device.grouped_mm_efficiency:  # expert-indexed tiles, as measured
        compute_s, memory_s = (
            compute_s / device.grouped_mm_efficiency,
            memory_s / device.grouped_mm_efficiency,
        )
    if compute_s == 0 and memory_s == 0:
        return Estimate(time_s=0.0, bound="none", source=source)
    overhead_s = device.mma_op_cost_s if uses_mma else _given(family and family.floor_s, device.gp_op_cost_s)
    # its scheduling and prologue, measured per call
    if props.kernel == "attention" and device.attention_op_cost_s:
        overhead_s = device.attention_op_cost_s
    overhead_s *= props.launches
    busy = max(compute_s, memory_s)
    bound = "overhead" if overhead_s > busy else ("compute" if compute_s >= memory_s else "memory")
    if ramp and not uses_mma:  # the measured ramp already holds the launch: it is a floor, not an addition
        overhead_s = max(0.0, overhead_s - busy)
    if gemm:  # the least a GEMM call takes, whatever its size
        overhead_s = max(overhead_s, device.mma_floor_s - busy)
        bound = "overhead" if overhead_s > busy else bound
    if rates:
        detail = {"rates": rates, **detail}
    return Estimate(
        time_s=busy + overhead_s,
        compute_s=compute_s,
        memory_s=memory_s,
        overhead_s=overhead_s,
        bound=bound,
        source=source,
        detail=detail,
    )


def _given(value: float | None, default: float) -> float:
    """A family's own number where it gives one (0 counts), else the device-wide one."""
    return default if value is None else value


def _tiled(
    props: PerformanceProperties, device: DeviceProfile, dtype, rate: float
) -> tuple[float, float, dict] | None:
    """Seconds for the products with known shapes, the mma ops they cover, and how they were tiled."""
    seconds, covered, how = 0.0, 0.0, []
    for batch, m, n, k in props.matmuls:
        timed = tiled_matmul(device, dtype, batch, m, n, k, rate)
        if timed is None:
            return None
        seconds += timed[0]
        covered += 2 * batch * m * n * k
        how.append(timed[1])
    return seconds, covered, {"tiling": how[0] if len(how) == 1 else how}
