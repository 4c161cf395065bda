"""The large presets as whole processes: wall clock and peak memory of ``castcore estimate`` (a 2048-token prefill)
and ``castcore serve --tp 8`` for DeepSeek-V3 (671B, latent attention, 256 experts) and Kimi K2 (1T, 384 experts),
each with an empty capture cache, on castpack-nvidia's H200 profile when the pack is installed (else the H100 test
profile).

    python bench/models_speed.py [--out bench/results/models_speed.md]

Targets (issue 27): DeepSeek-V3's prefill estimate <= 10 s and ``serve --tp 8`` <= 15 s as whole processes on a
2-core machine, peak memory under 1 GiB.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SERVE = [
    "--tp",
    "8",
    "--batch",
    "32",
    "--input",
    "2048",
    "--output",
    "256",
]  # both presets ship fp8 in blocks
TARGETS = {"estimate": 10.0, "serve": 15.0}
MEMORY_TARGET_MIB = 1024

# Runs one command and prints its wall clock and the peak resident memory of that child alone.
_MEASURE = """
import resource, subprocess, sys, time
started = time.perf_counter()
done = subprocess.run(sys.argv[1:], capture_output=True, text=True)
seconds = time.perf_counter() - started
if done.returncode:
    sys.exit(done.stderr)
print(seconds, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)
"""


def device() -> list[str]:
    if importlib.util.find_spec("castpack_nvidia") is not None:
        return ["--device", "h200-sxm"]
    return ["--no-packs", "--device-file", str(ROOT / "tests" / "data" / "h100-sxm.toml")]


def measure(argv: list[str], cache: str) -> tuple[float, float]:
    done = subprocess.run(
        [sys.executable, "-c", _MEASURE, sys.executable, "-m", "castcore", *argv],
        capture_output=True,
        text=True,
        env={**os.environ, "XDG_CACHE_HOME": cache},
    )
    if done.returncode:
        raise SystemExit(f"castcore {' '.join(argv)} failed: {done.stderr.strip()}")
    seconds, mib = done.stdout.split()
    return float(seconds), float(mib)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "models_speed.md"))
    args = parser.parse_args()
    where = device()
    rows = []
    for model in ("deepseek-v3", "kimi-k2"):
        for command, more in (("estimate", ["--seq", "2048"]), ("serve", SERVE)):
            with tempfile.TemporaryDirectory() as cache:
                seconds, mib = measure([command, "--model", model, *where, *more], cache)
            target = TARGETS[command] if model == "deepseek-v3" else None
            met = (
                ""
                if target is None
                else ("met" if seconds <= target and mib < MEMORY_TARGET_MIB else "**missed**")
            )
            rows.append(
                f"| {model} | castcore {command} {' '.join(more)} | {seconds:.1f} | {mib:.0f} | "
                f"{'' if target is None else f'<= {target:.0f} s, < {MEMORY_TARGET_MIB} MiB: {met}'} |"
            )
            print(rows[-1], flush=True)
    lines = [
        "# Large presets: whole-process speed and memory",
        "",
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}, {datetime.date.today()}; `python bench/models_speed.py`, "
        f"{' '.join(where)}, an empty capture cache for each run",
        "",
        "| model | command | seconds | peak MiB | target |",
        "|---|---|---:|---:|---|",
        *rows,
    ]
    Path(args.out).write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
