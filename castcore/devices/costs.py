"""What an operator call costs: its work (operations per dtype and unit, bytes moved) and its time.

Names follow the seed RFC (ComputeOps, mma_ops, gp_ops, memory_read_bytes) so estimator
files written for it port with import changes only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


@dataclass(slots=True)
class ComputeOps:
    """Operations on the matrix unit (``mma_ops``) and the vector/scalar units (``gp_ops``)."""

    mma_ops: float = 0
    gp_ops: float = 0


@dataclass(slots=True)
class PerformanceProperties:
    compute_ops: dict[torch.dtype | str, ComputeOps] = field(default_factory=dict)
    memory_read_bytes: float = 0
    memory_write_bytes: float = 0
    # Optional shape hints for shape-aware timing (castcore.devices.tiles): the matrix products behind the
    # mma_ops as (batch, m, n, k), and the kernel family ("attention", "grouped_mm") whose own efficiency applies.
    matmuls: list[tuple[int, int, int, int]] = field(default_factory=list)
    kernel: str = ""
    launches: int = 1  # kernels the call runs as, each paying the device's per-call cost (a fused op's parts)

    def add(self, dtype: torch.dtype | str, *, mma: float = 0, gp: float = 0) -> PerformanceProperties:
        """Add operations counted in ``dtype`` (a torch dtype, or a device mode such as "tf32"); returns self so
        formulas chain."""
        ops = self.compute_ops.setdefault(dtype, ComputeOps())
        ops.mma_ops += mma
        ops.gp_ops += gp
        return self

    @property
    def flops(self) -> float:
        return sum(c.mma_ops + c.gp_ops for c in self.compute_ops.values())

    @property
    def memory_bytes(self) -> float:
        return self.memory_read_bytes + self.memory_write_bytes

    def problems(self) -> list[str]:
        """Why these properties are nonsense (negative or non-finite numbers), empty when sane."""
        found = []
        numbers = {"memory_read_bytes": self.memory_read_bytes, "memory_write_bytes": self.memory_write_bytes}
        if not isinstance(self.compute_ops, dict):
            return [f"compute_ops is {type(self.compute_ops).__name__}, not a dict of dtype -> ComputeOps"]
        for dtype, ops in self.compute_ops.items():
            if not isinstance(ops, ComputeOps):
                found.append(f"compute_ops[{dtype}] is {type(ops).__name__}, not ComputeOps")
                continue
            numbers[f"compute_ops[{dtype}].mma_ops"] = ops.mma_ops
            numbers[f"compute_ops[{dtype}].gp_ops"] = ops.gp_ops
        for name, value in numbers.items():
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                found.append(f"{name} is {type(value).__name__}, not a number")
            elif not value >= 0 or value == float("inf"):
                found.append(f"{name} = {value}")
        return found


STEP_ESTIMATOR = "estimator"
STEP_PROPERTIES = "properties"
STEP_FALLBACK = "fallback"
BOUNDS = ("compute", "memory", "comm", "overhead", "none", "unknown")


@dataclass(frozen=True, slots=True)
class Source:
    """Which plugin answered and at which step of the priority order."""

    plugin: str
    step: str

    def __str__(self) -> str:
        return f"{self.plugin} ({self.step})"


@dataclass(slots=True)
class Estimate:
    """Time of one operator call and its parts, in seconds."""

    time_s: float
    compute_s: float = 0.0
    memory_s: float = 0.0
    comm_s: float = 0.0
    overhead_s: float = 0.0
    bound: str = "unknown"
    source: Source | None = None
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def fallback(self) -> bool:
        return self.source is not None and self.source.step == STEP_FALLBACK
