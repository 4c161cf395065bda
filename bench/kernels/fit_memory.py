"""Fit a profile's ``[memory_kernels]`` table to measured memory-bound kernels (gpu_measure.py's JSONL).

``python bench/kernels/fit_memory.py measured/h200-sxm-2026-11-27.jsonl --device h200-sxm [--device-file X.toml]``

Each norm, SwiGLU and fp8-quantize point is priced once on the profile to learn each call's bytes, its
compute time and its memory family; then, family by family (in turns, as one point can hold calls of two), the
efficiency, floor_s and half_bytes that minimise the mean |log(castcore / measured)| are searched on a grid,
and printed as TOML. The points fitted on are the fitting set: score.py's report on them is no held-out figure.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import gpu_measure  # noqa: E402
import score  # noqa: E402

FAMILIES = ("rms_norm", "layer_norm", "swiglu", "fp8_quantize")
# the grid searched: fraction of memory_bandwidth, floor (s), bytes at half bandwidth
EFFICIENCY = np.arange(0.30, 1.001, 0.01)
FLOOR = np.arange(0.0, 12.01e-6, 0.1e-6)
HALF = np.arange(0.0, 40.01e6, 0.5e6)
# torch runs silu with the same pointwise kernel machinery as mul, and SwiGLU points cannot tell them apart
SAME_AS = {"activation": "elementwise"}


def calls(rows, session, device, metric):
    """(measured s, [(family, bytes, compute s)], the measured family) for each memory-bound point, and the
    profile's bandwidth."""
    from castcore.devices.memory_kernels import memory_family

    points, profile = [], None
    for row in rows:
        if row["family"] not in FAMILIES or not row.get(metric):
            continue
        fn, inputs = gpu_measure.build(row, "meta")
        report = session.estimate(fn, *inputs, device=device)
        profile = report.device
        parts = []
        for record in report.records:
            if record.estimate.time_s > 0:  # its bytes, from the memory time the profile as it is gave it
                family = memory_family(record.invoke.name)
                own = profile.memory_kernels.get(family)
                efficiency = own.efficiency if own and own.efficiency else profile.memory_efficiency
                ramp = own.half_bytes if own and own.half_bytes is not None else profile.memory_half_bytes
                moved = record.estimate.memory_s * profile.memory_bandwidth * efficiency - ramp
                parts.append((SAME_AS.get(family, family), max(moved, 0.0), record.estimate.compute_s))
        points.append((row[metric], parts, row["family"]))
    return points, profile.memory_bandwidth


def predict(points, params, bandwidth, grid_family=None):
    """Each point's time; the family grid_family over the whole grid (an array per point), others fixed."""
    times = []
    for _, parts, _ in points:
        total = 0.0
        for family, moved, compute in parts:
            if family == grid_family:
                e, f, h = EFFICIENCY[:, None, None], FLOOR[None, :, None], HALF[None, None, :]
            else:
                e, f, h = params[family]
            total = total + np.maximum(f, np.maximum(compute, (moved + h) / (bandwidth * e)))
        times.append(total)
    return times


def fit(points, bandwidth, rounds=4):
    found = {p[0]: (0.83, 2.4e-6, 5.8e6) for _, parts, _ in points for p in parts}
    for _ in range(rounds):
        for family in sorted(found):
            times = predict(points, found, bandwidth, family)
            loss = sum(np.abs(np.log(t / measured)) for t, (measured, _, _) in zip(times, points))
            i, j, k = np.unravel_index(np.argmin(loss), loss.shape)
            found[family] = (float(EFFICIENCY[i]), float(FLOOR[j]), float(HALF[k]))
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+")
    parser.add_argument("--device", required=True)
    parser.add_argument("--device-file", action="append", default=[], help="a device profile TOML to load")
    parser.add_argument("--metric", default="cold_graph_time_s")
    args = parser.parse_args(argv)
    import castcore

    session = castcore.Session(device_files=args.device_file)
    points, bandwidth = calls(score.load(args.files), session, args.device, args.metric)
    found = fit(points, bandwidth)
    errors = [t / m - 1 for t, (m, _, _) in zip(predict(points, found, bandwidth), points)]
    print(f"# {len(points)} points, median |error| {np.median(np.abs(errors)):.1%}")
    for measured in FAMILIES:
        mine = [e for e, (_, _, f) in zip(errors, points) if f == measured]
        print(f"# {measured}: median |error| {np.median(np.abs(mine)):.1%}, bias {np.median(mine):+.1%}")
    for family in sorted({*found, *(f for f, same in SAME_AS.items() if same in found)}):
        e, f, h = found[SAME_AS.get(family, family)]
        print(f"{family} = {{efficiency = {e:.2f}, floor_s = {f:.2g}, half_bytes = {h:.3g}}}")
    return 0 if math.isfinite(float(np.median(np.abs(errors)))) else 1


if __name__ == "__main__":
    sys.exit(main())
