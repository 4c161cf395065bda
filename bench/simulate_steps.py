"""How close castcore simulate's step-time model (castcore.serving.step_time) is to a direct capture of the same
mixed batch, on deployments users simulate: 20 random mixed batches each (decode tokens at KV lengths up to 4,096,
most batches with a prefill chunk), the model built from its ladder of captures up to an 8,192-token budget.

    python bench/simulate_steps.py [--out bench/results/simulate_steps.md]

Every figure is castcore's own (no measurement is involved): the table says how much the fast model departs from
capturing each iteration, which a simulation of thousands of iterations cannot afford.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import time
from pathlib import Path

import castcore
from castcore.serving.mixed_batch import Chunk
from castcore.serving.step_time import StepTimes, agreement, random_batches

ROOT = Path(__file__).resolve().parent.parent
DEVICE_FILE = ROOT / "tests" / "data" / "h100-sxm.toml"
DEPLOYMENTS = [("llama-3-8b", {}), ("llama-3-70b", {"tp": 4}), ("mixtral-8x7b", {"tp": 2})]


def batches(count: int, seed: int = 0) -> list[list[Chunk]]:
    """Up to 200 decode tokens at KV lengths to 4,096, most batches with a prompt chunk of up to 2,048 tokens."""
    return random_batches(count, seed, sequences=200, kv=(16, 4096), chunk=(16, 2048), chunk_cached=(0, 2048))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "simulate_steps.md"))
    args = parser.parse_args()
    session = castcore.Session(load_packs=[], device_files=[str(DEVICE_FILE)])
    lines = [
        "# castcore simulate: the step-time model against direct captures of 20 mixed batches each",
        "",
        f"{platform.processor() or platform.machine()}, Python {platform.python_version()}, "
        f"{datetime.date.today()}; `python bench/simulate_steps.py`; device profile tests/data/h100-sxm.toml, "
        "no packs.",
        "",
        "| deployment | model made (s) | batches | mean abs. error | max abs. error | direct capture per batch (s) "
        "| model per batch (us) |",
        "|---|---|---|---|---|---|---|",
    ]
    for model, options in DEPLOYMENTS:
        started = time.perf_counter()
        steps = StepTimes(session.pipeline, castcore.build_workload(model, **options), "h100-sxm", 8192, 256)
        # the ladder captures these batches need, made on first use
        for chunks in batches(20) + batches(20, seed=1):
            steps(chunks)
        built = time.perf_counter() - started
        started = time.perf_counter()
        rows = agreement(steps, batches(20))
        direct = (time.perf_counter() - started) / len(rows)
        started = time.perf_counter()
        for chunks in batches(20, seed=1):
            steps(chunks)
        fast = (time.perf_counter() - started) / 20 * 1e6
        errors = [abs(r["error"]) for r in rows]
        name = model + "".join(f" {k} {v}" for k, v in options.items())
        lines.append(
            f"| {name} | {built:.1f} | {len(rows)} | {sum(errors) / len(errors):.2%} | {max(errors):.2%} | "
            f"{direct:.2f} | {fast:.0f} |"
        )
        print(lines[-1], flush=True)
    Path(args.out).write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
