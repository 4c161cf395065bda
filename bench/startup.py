"""Wall clock of whole castcore processes, as a user runs them: ``castcore estimate`` (the 8B preset) and
``castcore serve --model llama-3-70b --tp 8 --batch 32``, from launch to exit.

    python bench/startup.py [--runs 5] [--out bench/results/startup.json]

Each command runs cold (an empty capture cache: imports, building the model, fusing, sharding, capturing) and
warm (the cache filled by an earlier run, as every later run with the same options finds it), ``--runs`` times
each after one untimed run, and the figure is the median. ``python -c "import torch"`` is timed the same way, as
the part of every run the machine's speed that day sets. Packs are not
loaded and the device is the H100 test profile, as in the other benchmarks. Writes the JSON and a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import figures  # bench/figures.py: this script runs with bench/ on its path

HERE = Path(__file__).parent
DEVICE = os.path.relpath(HERE.parent / "tests" / "data" / "h100-sxm.toml")
PLUGINS = ["--no-packs", "--device-file", DEVICE]
COMMANDS = {  # name: (argv after python -m castcore, target seconds warm)
    "estimate": (["estimate", *PLUGINS, "--json"], 2.0),
    "serve": (["serve", "--model", "llama-3-70b", "--tp", "8", "--batch", "32", *PLUGINS, "--json"], 3.5),
}


def timed(argv: list[str], cache: Path) -> float:
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, *argv],
        capture_output=True,
        text=True,
        env={**os.environ, "XDG_CACHE_HOME": str(cache)},
    )
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        last = (done.stderr.strip() or "no output").splitlines()[-1]
        sys.exit(f"{' '.join(argv)} failed ({done.returncode}): {last}")
    if argv[:2] == ["-m", "castcore"]:
        json.loads(done.stdout)  # the whole answer came out
    return seconds


def measure(argv: list[str], runs: int, warm: bool, folder: Path) -> list[float]:
    """``runs`` timings of ``argv``: each with a cache that already holds its capture (warm), or a new one."""
    caches = [folder / f"cache-{i}" for i in range(runs + 1)]
    if warm:
        caches = [folder / "cache"] * (runs + 1)
    timed(argv, caches[0])  # untimed: the file-system cache, and for warm runs the capture cache, filled
    return [timed(argv, cache) for cache in caches[1:]]


def _markdown(results: dict, machine: dict) -> str:
    lines = [
        "# Start-up: whole castcore processes",
        "",
        f"{machine['date']}, {machine['machine']}, {machine['cpus']} CPUs, Python {machine['python']}",
        "",
        "| command | cold (no cached capture) | warm (capture cached) | target (warm) |",
        "|---|---:|---:|---:|",
    ]
    for name, row in results["commands"].items():
        met = "met" if row["warm_median_s"] <= row["target_s"] else "MISSED"
        lines.append(
            f"| `castcore {' '.join(row['argv'][2:])}` | {row['cold_median_s']:.2f} s | "
            f"{row['warm_median_s']:.2f} s | {row['target_s']:.1f} s: {met} |"
        )
    lines += [
        "",
        f'`python -c "import torch"` alone: {results["import_torch_median_s"]:.2f} s (median; runs '
        + ", ".join(f"{s:.2f}" for s in results["import_torch_s"])
        + "), the interpreter's exit included, "
        "which estimate and serve skip (tearing torch down takes about 0.4 s)",
        "",
    ]
    for name, row in results["commands"].items():
        lines.append(
            f"- {name}: cold "
            + ", ".join(f"{s:.2f}" for s in row["cold_s"])
            + "; warm "
            + ", ".join(f"{s:.2f}" for s in row["warm_s"])
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--runs", type=int, default=5, help="timed runs of each, after one untimed (default: 5)"
    )
    parser.add_argument("--out", default="bench/results/startup.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="castcore-startup-") as folder:
        torch_s = measure(["-c", "import torch"], args.runs, False, Path(folder) / "torch")
        commands = {}
        for name, (argv, target) in COMMANDS.items():
            argv = ["-m", "castcore", *argv]
            cold = measure(argv, args.runs, False, Path(folder) / f"{name}-cold")
            warm = measure(argv, args.runs, True, Path(folder) / f"{name}-warm")
            commands[name] = {
                "argv": argv,
                "cold_s": cold,
                "warm_s": warm,
                "cold_median_s": statistics.median(cold),
                "warm_median_s": statistics.median(warm),
                "target_s": target,
            }
    results = {
        "import_torch_s": torch_s,
        "import_torch_median_s": statistics.median(torch_s),
        "commands": commands,
    }
    figures.write(args.out, {"results": results}, lambda machine: _markdown(results, machine))


if __name__ == "__main__":
    main()
