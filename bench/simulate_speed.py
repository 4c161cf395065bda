"""castcore simulate's speed as a user meets it: 2,000 requests of Llama-3-70B at TP 4 on the H100 profile at 10
requests/s (1,024 input and 256 output tokens each), the whole ``castcore simulate`` process timed from outside,
and in one process the parts: checking and making the requests, the ladder captures and the KV probe, the engine's
loop.

    python bench/simulate_speed.py [--out bench/results/simulate_speed.md]

Then ``castcore plan --rate`` over the H100 profile for the same model (every layout simulated under 4 requests/s
of 500 requests, p99 objectives), timed from outside with an empty capture cache (cold) and again with the cache it
filled (warm); the simulate process is timed both ways too.

Targets (issue 26): the whole simulate process <= 10 s, the loop <= 2 s; plan --rate <= 120 s cold and <= 20 s
warm; on a 2-core machine.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import castcore
from castcore.simulation import engine
from castcore.serving import traffic as simulation
from castcore.serving.kv_capacity import kv_capacity
from castcore.serving.step_time import StepTimes

ROOT = Path(__file__).resolve().parent.parent
DEVICE_FILE = str(ROOT / "tests" / "data" / "h100-sxm.toml")
ARGS = {"requests": 2000, "input_lengths": "1024", "output_lengths": "256", "rate": 10.0, "tp": 4}
PLAN = [
    "plan",
    "--model",
    "llama-3-70b",
    "--input",
    "1024",
    "--output",
    "256",
    "--rate",
    "4",
    "--ttft",
    "p99:1s",
    "--tpot",
    "p99:60ms",
    "--device-file",
    DEVICE_FILE,
    "--no-packs",
    "--json",
]
COMMAND = [
    "simulate",
    "--model",
    "llama-3-70b",
    "--tp",
    "4",
    "--requests",
    "2000",
    "--input",
    "1024",
    "--output",
    "256",
    "--rate",
    "10",
    "--device-file",
    DEVICE_FILE,
    "--no-packs",
]


def parts() -> dict[str, float]:
    session = castcore.Session(load_packs=[], device_files=[DEVICE_FILE])
    started = time.perf_counter()
    plan = simulation.check("llama-3-70b", **ARGS)
    checked = time.perf_counter()
    steps = StepTimes(
        session.pipeline,
        plan.base,
        "h100-sxm",
        plan.limits.max_batched_tokens,
        min(plan.limits.max_running_requests, plan.limits.max_batched_tokens),
    )
    blocks, _ = kv_capacity(session.pipeline, steps, plan.limits, steps.profile)
    engine.run_engine(plan.requests, plan.limits, blocks, steps)  # makes the ladder captures it needs
    first = time.perf_counter()
    # every capture made: the loop and its step times
    engine.run_engine(plan.requests, plan.limits, blocks, steps)
    looped = time.perf_counter()
    return {"check": checked - started, "captures and first run": first - checked, "loop": looped - first}


def timed(command: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "castcore", *command], check=True, capture_output=True, env=env)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "simulate_speed.md"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as cache:  # an empty capture cache: cold, then warm
        env = {**os.environ, "XDG_CACHE_HOME": cache}
        whole = [timed(COMMAND, env) for _ in range(2)]
        planned = [timed(PLAN, env) for _ in range(2)]
    split = parts()
    lines = [
        "# castcore simulate: speed",
        "",
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}, {datetime.date.today()}; `python bench/simulate_speed.py`",
        "",
        f"`castcore {' '.join(COMMAND[:-3])} ...` (the H100 profile of tests/data, no packs)",
        "",
        "| part | seconds |",
        "|---|---|",
        f"| the whole process, cold (empty capture cache) | {whole[0]:.1f} |",
        f"| the whole process, warm (the captures cached) | {whole[1]:.1f} |",
        *(f"| {name} (in one process, cold) | {seconds:.2f} |" for name, seconds in split.items()),
        "",
        f"`castcore {' '.join(PLAN[:-5])} ...` (the same profile, no packs)",
        "",
        "| run | seconds |",
        "|---|---|",
        f"| cold (empty capture cache) | {planned[0]:.1f} |",
        f"| warm (the captures cached) | {planned[1]:.1f} |",
    ]
    Path(args.out).write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
