"""The held-out medians of a kernel-table run, and the check that none has risen against the committed ones.

A family's held-out median |error| is the figure users meet on kernels no constant was fitted to; CI fails when
one rises by more than ``TOLERANCE`` (two percentage points) against ``bench/results/aic_tables.json``, or when a
family scored before has no held-out points now. Families new since the committed run pass and are reported.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

TOLERANCE = 0.02
# The report's families as a profile's [error_bands] names them (castcore.report.bands): the plain bf16 attention
# rows set the attention bands, both routings the MoE band.
BAND_OF = {
    "GEMM bf16": "gemm_bf16",
    "GEMM fp8": "gemm_fp8",
    "GEMM fp8 block-scaled": "gemm_fp8_block",
    "fused MoE bf16, balanced routing": "moe",
    "fused MoE bf16, power law routing": "moe",
    "attention context": "attention_prefill",
    "attention generation": "attention_decode",
    "engine all-reduce": "engine_allreduce",
    "DeepEP low-latency": "low_latency_a2a",
}


def held_out_medians(results: list[dict]) -> dict[str, dict]:
    """Per family: the held-out points' count and median |error|."""
    medians = {}
    for family in dict.fromkeys(r["family"] for r in results):
        errors = [abs(r["error"]) for r in results if r["family"] == family and r["split"] == "held out"]
        if errors:
            medians[family] = {"points": len(errors), "median": round(statistics.median(errors), 4)}
    return medians


def bands(results: list[dict]) -> dict[str, dict[str, float]]:
    """Per GPU and error-band family: the held-out median |error|, what a profile's [error_bands] carries."""
    errors: dict[str, dict[str, list[float]]] = {}
    for r in results:
        band = BAND_OF.get(r["family"])
        if band and r["split"] == "held out":
            errors.setdefault(r["gpu"], {}).setdefault(band, []).append(abs(r["error"]))
    return {
        gpu: {band: round(statistics.median(e), 3) for band, e in sorted(found.items())}
        for gpu, found in sorted(errors.items())
    }


def rises(committed: dict[str, dict], fresh: dict[str, dict], tolerance: float = TOLERANCE) -> list[str]:
    """One line per family whose held-out median rose by more than ``tolerance``, or that lost its points."""
    problems = []
    for family, before in committed.items():
        now = fresh.get(family)
        if now is None:
            problems.append(
                f"{family}: no held-out points now (was {before['median']:.1%} over {before['points']})"
            )
        elif now["median"] > before["median"] + tolerance:
            problems.append(
                f"{family}: held-out median {now['median']:.1%}, was {before['median']:.1%} "
                f"(more than {tolerance * 100:.0f} points worse)"
            )
    return problems


def write(
    path: str | Path, medians: dict[str, dict], per_gpu: dict[str, dict[str, float]] | None = None
) -> None:
    data = {"held_out": medians, "bands": per_gpu or {}}
    Path(path).write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def read(path: str | Path) -> dict[str, dict]:
    return json.loads(Path(path).read_text(encoding="utf-8"))["held_out"]
