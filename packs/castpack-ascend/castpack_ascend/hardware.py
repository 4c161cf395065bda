"""How Ascend's Da Vinci cores see work: fractal tiles on the Cube unit, 32-byte blocks on the vector
unit, and a fixed cost per kernel. Every estimator of this pack ends in ``timed``.

Numbers (all from the CANN platform files read for the profiles, see the pack README):
- Cube fractal M0 x K0 x N0: the profile's ``mma_unit`` ([m, n, k] per dtype) when it lists the dtype, else
  16 x (32 bytes / element size) x 16: [DtypeMKN] Default=16,16,16 (fp16, bf16), DT_INT8=16,32,16,
  DT_INT4=16,64,16; fp32 (and hf32) data is 16 x 8 x 16 by the same 32-byte rule.
- Vector unit and unified buffer move and compute in 32-byte blocks: [AICoreSpec] ubblock_size=32.
"""

from __future__ import annotations

import math

import torch

from castcore import pack

BLOCK_BYTES = 32  # ubblock_size=32 in every CANN platform file read (910B1-B4, 910_9391, 310P3)
CUBE_MN = 16  # cube_m_size = cube_n_size = 16; used only for a profile without mma_unit


def dtype_bytes(dtype: torch.dtype) -> int:
    return dtype.itemsize


def fractal(dtype: torch.dtype, device: pack.DeviceProfile | None = None) -> tuple[int, int, int]:
    """(M0, K0, N0) of one Cube fractal for inputs of ``dtype``: the profile's ``mma_unit`` for the dtype when
    it has one (castcore's order is [m, n, k]), else 16 x 16 with K0 filling 32 bytes."""
    unit = device.mma_unit.get(pack.dtype_name(dtype)) if device is not None else None
    if unit is not None:
        m0, n0, k0 = unit
        return m0, k0, n0
    return CUBE_MN, max(1, BLOCK_BYTES // dtype_bytes(dtype)), CUBE_MN


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple if n > 0 else 0


def padded_mkn(m: int, k: int, n: int, dtype: torch.dtype,
               device: pack.DeviceProfile | None = None) -> tuple[int, int, int]:
    """M, K and N rounded up to whole fractals of ``dtype`` (the profile's when ``device`` lists one)."""
    m0, k0, n0 = fractal(dtype, device)
    return round_up(m, m0), round_up(k, k0), round_up(n, n0)


def block_elements(dtype: torch.dtype) -> int:
    """Elements of ``dtype`` in one 32-byte block (16 fp16, 8 fp32)."""
    return max(1, BLOCK_BYTES // dtype_bytes(dtype))


def padded_rows(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    """Elements a row-wise vector kernel processes: every row's last dim rounded up to whole 32-byte blocks."""
    if not shape:
        return 1
    rows = math.prod(shape[:-1])
    return rows * round_up(shape[-1], block_elements(dtype))


def timed(device: pack.DeviceProfile, *, cube: dict | None = None, vector: dict | None = None,
          read_bytes: float = 0, write_bytes: float = 0, detail: dict | None = None,
          overlap: bool = True, attention: bool = False) -> pack.Estimate:
    """An Estimate from Cube and vector operations per dtype and HBM bytes.

    compute = cube time and vector time, overlapped (max) when the kernel runs both units at once
    (A2/A3 split cube and vector cores), added otherwise; memory = bytes / (bandwidth x efficiency).
    Each kernel also pays a fixed cost (``mma_op_cost_s`` with Cube work, else ``gp_op_cost_s``) on top of
    max(compute, memory), not as a floor under it: back-to-back 910B2 matmuls fit time = fixed + work / rate
    at 1024^3, 2048^3 and 4096^3, while a floor prices 1024^3 at 0.55 of its measured time and hides the
    per-token K/V reads of a decode attention step. A fused attention kernel (``attention``) runs its Cube
    work at the profile's ``attention_efficiency`` and pays ``attention_op_cost_s`` where the profile sets them.
    """
    cube, vector = cube or {}, vector or {}
    rates: dict[str, str] = {}

    def seconds(unit: str, work: dict) -> float:
        total = 0.0
        for dtype, ops in work.items():
            if ops:
                rate, used = device.rate(unit, dtype)
                rates[f"{'cube' if unit == 'mma' else 'vector'}:{pack.dtype_name(dtype)}"] = used
                efficiency = device.compute_efficiency
                if attention and unit == "mma" and device.attention_efficiency:
                    efficiency = device.attention_efficiency
                total += ops / (rate * efficiency)
        return total

    cube_s, vector_s = seconds("mma", cube), seconds("gp", vector)
    compute_s = max(cube_s, vector_s) if overlap else cube_s + vector_s
    memory_s = (read_bytes + write_bytes) / (device.memory_bandwidth * device.memory_efficiency)
    fixed_s = device.mma_op_cost_s if any(cube.values()) else device.gp_op_cost_s
    if attention and device.attention_op_cost_s:
        fixed_s = device.attention_op_cost_s
    busy = max(compute_s, memory_s)
    bound = "overhead" if fixed_s > busy else ("compute" if compute_s >= memory_s else "memory")
    info = {"cube_s": cube_s, "vector_s": vector_s, "fixed_s": fixed_s, "rates": rates}
    info.update(detail or {})
    return pack.Estimate(time_s=busy + fixed_s, compute_s=compute_s, memory_s=memory_s, overhead_s=fixed_s,
                         bound=bound, detail=info)
