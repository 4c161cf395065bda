"""Shape-aware matrix timing: a product runs as output tiles spread over the device's compute units.

A GEMM kernel cuts the (m, n) output into tiles (the profile's ``mma_tile``), gives each compute unit (an SM, an
AI core) one tile at a time and steps through k in ``tile_k`` slices. So the work done is the padded tile work,
in waves of ``compute_units`` tiles: the last wave may be part-empty, and a small product fills few units. When
there are fewer tiles than units the kernel may split k over the idle units (split-K), as cuBLAS and CUTLASS
do for skinny products. Among the profile's tiles the fastest is taken, as a kernel heuristic picks one.

Time per tile-step is the unit's share of the sustained matrix rate (peak x compute_efficiency / units), so a
large, well-shaped product reaches compute_efficiency of the peak and nothing more. A profile whose GPU runs
each unit faster while few are busy (the sustained rate of a full device is its power limit: Hopper's fp8
GEMMs of one or two waves run each SM at about 0.9 of its share of the peak, full ones at 0.6 of the whole)
gives that faster rate as ``mma_tile_efficiency``: tiles step at it, and the product as a whole still takes at
least its work at the sustained rate. Each wave also waits two
device-memory latencies (the profile's ``memory_latency_s``) that no product overlaps: its first k-slice arriving
before the first MMA, and its output tile written back after the last. That is what makes a product with few
k-steps per tile (small K, or K split many ways) slower than its arithmetic. Split-K pays two more: each
split's partial tile is written to memory and read back to be summed.
"""

from __future__ import annotations

import math
from typing import Any

from castcore.devices.dtypes import dtype_name
from castcore.devices.profile import DeviceProfile


def tiled_matmul(
    device: DeviceProfile, dtype: Any, batch: int, m: int, n: int, k: int, rate: float
) -> tuple[float, dict[str, Any]] | None:
    """(seconds, how) for ``batch`` products of (m x k) @ (k x n) at sustained ``rate`` op/s; None when the
    profile has no tiles for ``dtype``."""
    tiles = device.mma_tile.get(dtype_name(dtype))
    units = device.compute_units
    if not tiles or not units or min(batch, m, n, k) < 1:
        return None
    boost = device.mma_tile_efficiency.get(dtype_name(dtype))
    per_unit = (device.rate("mma", dtype)[0] * boost if boost else rate) / units
    useful = 2 * batch * m * n * k
    best: tuple[float, dict[str, Any]] | None = None
    for tm, tn, tk in tiles:
        count = batch * math.ceil(m / tm) * math.ceil(n / tn)
        steps = math.ceil(k / tk)
        split = min(units // count, steps) if count < units else 1
        waves = math.ceil(count * split / units)
        # Split-K's partial tiles go to memory and back before the sum is written: one more round trip.
        round_trips = 2 if split == 1 else 4
        seconds = waves * (
            2 * tm * tn * tk * math.ceil(steps / split) / per_unit + round_trips * device.memory_latency_s
        )
        seconds = max(
            seconds, useful / rate
        )  # however fast its tiles step, no faster than the sustained rate
        if best is None or seconds < best[0]:
            best = (
                seconds,
                {
                    "tile": f"{tm}x{tn}x{tk}",
                    "tiles": count,
                    "split_k": split,
                    "waves": waves,
                    "tile_efficiency": useful / (seconds * rate),
                },
            )
    return best
