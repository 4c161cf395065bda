"""Device profiles: what an accelerator can do, every number with its source (read from TOML by
castcore.devices.profile_files)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from castcore.devices.dtypes import dtype_name
from castcore.devices.memory_kernels import MemoryKernel
from castcore.errors import CastcoreError

TOPOLOGIES = ("full-mesh", "ring", "switch", "clos")
BAND_FAMILIES = (
    "gemm_bf16",
    "gemm_fp8",
    "gemm_fp8_block",
    "moe",
    "attention_prefill",
    "attention_decode",
    "engine_allreduce",
    "low_latency_a2a",
    "memory_bound",  # norms, activations, rotary, elementwise, quantize, cache writes (castcore.devices.memory_kernels)
    "collective",  # a collective library's all-reduce, all-gather, reduce-scatter, all-to-all, send
)  # the kernel families castcore.report.bands sorts calls into
ENGINE_ALLREDUCE = (
    "engine_allreduce_max_bytes",
    "one_shot_latency_s",
    "one_shot_bandwidth",
    "two_shot_latency_s",
    "two_shot_bandwidth",
)
# the collective libraries whose protocols a level's protocol_latency_s can be given for (Interconnect.library)
LIBRARIES = ("nccl", "rccl")
# a collective library's protocols, as Interconnect.protocol_latency_s orders them
PROTOCOLS = (
    "LL",
    "LL128",
    "Simple",
)


class DeviceError(CastcoreError, ValueError):
    """A device profile that cannot be used; the message names the file and field."""


@dataclass(frozen=True, slots=True)
class Interconnect:
    """One level of the fabric: ``devices`` reachable at this level, each with ``bandwidth`` B/s one way."""

    name: str
    devices: int
    bandwidth: float
    latency_s: float
    efficiency: float = 1.0
    topology: str = "switch"
    # A switch that reduces in the network (NVLink SHARP): an all-reduce then sends and receives its buffer
    # once, at reduction_efficiency of bandwidth, after a start-up of reduction_latency_s. 0: it cannot.
    reduction_efficiency: float = 0.0
    reduction_latency_s: float = 0.0
    # A serving engine's own all-reduce on this level, for buffers up to engine_allreduce_max_bytes (vLLM's and
    # SGLang's custom all-reduce, TensorRT-LLM's kernels): one shot, each rank reading every peer's buffer at
    # one_shot_bandwidth after one_shot_latency_s; two shots, a reduce-scatter then an all-gather. 0: none.
    engine_allreduce_max_bytes: float = 0.0
    one_shot_latency_s: float = 0.0
    one_shot_bandwidth: float = 0.0
    two_shot_latency_s: float = 0.0
    two_shot_bandwidth: float = 0.0
    # A collective library's protocols on this level (NCCL's LL, LL128, Simple, in that order): the latency of one
    # step of each, which replaces latency_s for that library's algorithms; 0 for a protocol the library does not
    # run on this level. Empty: one protocol, latency_s a step.
    protocol_latency_s: tuple[float, ...] = ()
    # The collective library that runs on this level, whose protocols' base latencies and shares of the bandwidth
    # go with protocol_latency_s (NCCL on NVIDIA GPUs, RCCL, NCCL's fork, on AMD ones)
    library: str = "nccl"
    # The most ranks the engine's own all-reduce runs for on this level (vLLM turns its custom all-reduce off above
    # two GPUs that are not all NVLink-connected); 0: no limit.
    engine_allreduce_max_ranks: int = 0
    # A network level described by its fabric: one NIC's line rate one way and the NICs each device has (1 on a
    # DGX, 0.5 with one NIC per two GPUs, 0.125 with one per 8-GPU node); bandwidth is then their product, and
    # efficiency the fraction of line rate the collective library reaches. 0: bandwidth was given as is.
    nic_bandwidth: float = 0.0
    nics_per_device: float = 0.0
    # The library's tree (NCCL's, for an all-reduce across nodes): the latency of one of its steps on this level
    # in each protocol, as protocol_latency_s gives the ring's. Empty: no tree.
    tree_latency_s: tuple[float, ...] = ()


@dataclass(frozen=True, slots=True)
class DeviceProfile:
    """An accelerator in SI units: op/s, bytes, B/s, seconds. ``sources`` says where each number came from."""

    name: str
    vendor: str
    mma_flops: Mapping[str, float]
    gp_flops: Mapping[str, float]
    memory_bytes: float
    memory_bandwidth: float
    compute_efficiency: float = 1.0
    memory_efficiency: float = 1.0
    # dtype -> the fraction of that dtype's matrix peak a tuned GEMM sustains, where it differs from
    # compute_efficiency (fp8 kernels reach a smaller share of their doubled peak than bf16 ones do)
    mma_efficiency: Mapping[str, float] = field(default_factory=dict)
    mma_op_cost_s: float = 0.0
    gp_op_cost_s: float = 0.0
    comm_op_cost_s: float = 0.0
    attention_op_cost_s: float = (
        0.0  # a fused attention kernel's fixed cost per call, for mma_op_cost_s (0: that)
    )
    low_latency_a2a_cost_s: float = (
        0.0  # DeepEP's low-latency dispatch or combine: the kernel's own time per call
    )
    interconnect: tuple[Interconnect, ...] = ()
    # Shape-aware pricing (castcore.devices.tiles), all optional: without them the plain roofline applies.
    compute_units: int = 0  # SMs / AI cores a matrix product's tiles are spread over
    # dtype -> kernel tiles
    mma_tile: Mapping[str, tuple[tuple[int, int, int], ...]] = field(default_factory=dict)
    mma_unit: Mapping[str, tuple[int, int, int]] = field(default_factory=dict)  # dtype -> one MMA instruction
    # dtype -> the fraction of its units' share of the dtype's peak one tile runs at while a product is too
    # small to hold the device at its sustained (power-limited) rate (empty: that rate, mma_efficiency's)
    mma_tile_efficiency: Mapping[str, float] = field(default_factory=dict)
    # A plain matrix product (a GEMM kernel) streams its operands at mma_memory_efficiency of memory_bandwidth
    # after a ramp of mma_half_bytes (0: memory_efficiency, no ramp), and no call takes less than mma_floor_s.
    mma_memory_efficiency: float = 0.0
    mma_half_bytes: float = 0.0
    mma_floor_s: float = 0.0
    attention_efficiency: float = (
        0.0  # fraction of the matrix peak a fused attention kernel reaches (0: compute_efficiency)
    )
    # A grouped (mixture-of-experts) GEMM's speed against a plain GEMM's, in its matrix work and its weight
    # streaming alike: its tiles index experts' weights (0: the same speed)
    grouped_mm_efficiency: float = 0.0
    memory_half_bytes: float = (
        0.0  # bytes at which a streaming kernel reaches half its bandwidth (Hockney n_1/2)
    )
    l2_bytes: float = 0.0
    clock_hz: float = 0.0
    memory_latency_s: float = (
        0.0  # one load from device memory; a tiled product's wave waits for it to fill and drain
    )
    # A memory-bound family's own bandwidth fraction, floor and ramp (castcore.devices.memory_kernels)
    memory_kernels: Mapping[str, MemoryKernel] = field(default_factory=dict)
    # Held-out median |error| of castcore's estimate per kernel family on this device (castcore.report.bands).
    error_bands: Mapping[str, float] = field(default_factory=dict)
    # Board power (castcore.report.energy): the most the board draws (tdp_w, its power limit) and what it draws
    # holding a deployment between kernels (idle_w); 0: not given, so no energy figures.
    tdp_w: float = 0.0
    idle_w: float = 0.0
    sources: Mapping[str, str] = field(default_factory=dict)
    default: bool = False
    origin: str = ""  # the file or plugin it came from, for messages

    def rate(self, unit: str, dtype: Any) -> tuple[float, str]:
        """Peak op/s of ``unit`` ("mma" or "gp") for ``dtype`` and the dtype name used.

        A dtype the profile does not list gets the slowest listed rate of that unit: a
        conservative guess, named in the second element so reports can show it.
        """
        table = self.mma_flops if unit == "mma" else self.gp_flops
        name = dtype_name(dtype)
        if name in table:
            return table[name], name
        if name == "tf32":  # a device without TF32 runs the float32 product as float32
            return self.rate(unit, "float32")
        if unit == "mma" and self.gp_flops:
            # A matrix op in a dtype the matrix unit lacks runs on the vector unit.
            return self.rate("gp", dtype)
        if not table:
            raise DeviceError(
                f"device {self.name!r} lists no {unit}_flops; add [{unit}_flops] to its profile"
            )
        slowest = min(table, key=table.__getitem__)
        return table[slowest], f"{slowest} (no {name} rate)"

    def efficiency(self, unit: str, dtype_name: str) -> float:
        """The sustained fraction of ``unit``'s peak for a dtype named as ``rate`` names it."""
        if unit == "mma":
            return self.mma_efficiency.get(dtype_name, self.compute_efficiency)
        return self.compute_efficiency
