"""Wall clock of a whole ``castcore serve`` process, as a user runs it: start-up, imports, plugin loading, the
prefill and three decode-step captures, and printing.

    python bench/serve.py [--model llama-3-70b] [--tp 8] [--batch 32] [--input 2048] [--output 256] [--runs 3]
                          [--out bench/results/serve.json]

Each run is ``python -m castcore serve ... --json`` in a subprocess, timed from launch to exit. One untimed run
comes first (so the file-system cache is warm, as on a second invocation); the figure is the median of the timed
runs. Packs are not loaded and the device is --device-file's (the H100 test profile), as in the other benchmarks,
so the figures do not depend on which packs are installed. Writes the JSON and a Markdown table beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import figures  # bench/figures.py: this script runs with bench/ on its path

HERE = Path(__file__).parent
TARGET = 5.0  # seconds, the whole process


def command(args: argparse.Namespace) -> list[str]:
    return ["castcore", "serve", "--model", args.model, "--tp", str(args.tp), "--batch", str(args.batch),
            "--input", str(args.input), "--output", str(args.output), "--no-packs", "--device-file", args.device_file,
            "--json"]


def run_once(argv: list[str]) -> tuple[float, dict]:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", *argv], capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        last = (done.stderr.strip() or "no output").splitlines()[-1]
        sys.exit(f"{' '.join(argv)} failed ({done.returncode}): {last}")
    return seconds, json.loads(done.stdout)


def _markdown(result: dict, machine: dict) -> str:
    figures = result["figures"]
    median = result["median_seconds"]
    lines = ["# castcore serve, the whole process", "",
             f"{machine['date']}, {machine['machine']}, {machine['cpus']} CPUs, Python {machine['python']}", "",
             f"`{result['command']}`", "",
             "| run | seconds |", "|---|---:|"]
    lines += [f"| {i} | {seconds:.2f} |" for i, seconds in enumerate(result["seconds"], 1)]
    lines += ["", f"- median {median:.2f} s (target under {TARGET:.0f} s: {'met' if median < TARGET else 'MISSED'})",
              f"- figures: TTFT {figures['ttft_s']:.3f} s, TPOT {figures['tpot_s'] * 1e3:.2f} ms, latency "
              f"{figures['latency_s']:.2f} s, {figures['output_tokens_per_s']:.1f} output tokens/s "
              f"({figures['output_tokens_per_s_per_device']:.1f} per device), peak {figures['peak_bytes'] / 2**30:.2f} "
              f"GiB per device of {figures['device_memory_bytes'] / 2**30:.2f} GiB on {figures['device']}"]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="llama-3-70b")
    parser.add_argument("--tp", type=int, default=8)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--input", type=int, default=2048)
    parser.add_argument("--output", type=int, default=256)
    parser.add_argument("--runs", type=int, default=3, help="timed runs, after one untimed (default: 3)")
    parser.add_argument("--device-file", default=os.path.relpath(HERE.parent / "tests" / "data" / "h100-sxm.toml"))
    parser.add_argument("--out", default="bench/results/serve.json")
    args = parser.parse_args()
    argv = command(args)
    run_once(argv)
    timed = [run_once(argv) for _ in range(args.runs)]
    seconds = [s for s, _ in timed]
    result = {"command": " ".join(argv), "seconds": seconds, "median_seconds": statistics.median(seconds),
              "target_seconds": TARGET, "figures": timed[-1][1]}
    figures.write(args.out, {"result": result}, lambda machine: _markdown(result, machine))


if __name__ == "__main__":
    main()
