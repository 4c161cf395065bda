"""castcore simulate's speed on the models people serve under traffic (issue 43): each ``castcore simulate``
process timed from outside, with an empty capture cache (cold) and again with the one it filled (warm).

    python bench/simulate_models_speed.py [--out bench/results/simulate_models_speed.md]

Targets on a 2-core machine: DeepSeek (its V3 architecture, which R1 shares) on 8 H200s with attention data
parallel 8 and expert parallel 8, 2,000 requests at a rate, <= 20 s cold; Qwen3-Next at TP 4 the same in <= 15 s.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import tempfile
from pathlib import Path

from simulate_speed import timed  # bench/ is the script's own folder on its path

ROOT = Path(__file__).resolve().parent.parent
H200 = str(ROOT / "packs" / "castpack-nvidia" / "castpack_nvidia" / "profiles" / "h200-sxm.toml")


def _simulate(model: str, *options: str) -> list[str]:
    return [
        "simulate",
        "--model",
        model,
        *options,
        "--rate",
        "20",
        "--requests",
        "2000",
        "--device-file",
        H200,
        "--no-packs",
    ]


RUNS = {
    "DeepSeek-V3, attention DP 8 x EP 8 on 8 H200s (target <= 20 s cold)": _simulate(
        "deepseek-v3", "--attention-dp", "8", "--ep", "8"
    ),
    "Qwen3-Next 80B-A3B, TP 4 on 4 H200s (target <= 15 s cold)": _simulate("qwen3-next-80b-a3b", "--tp", "4"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "simulate_models_speed.md"))
    args = parser.parse_args()
    lines = [
        "# castcore simulate: speed on the models served in 2026",
        "",
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}, {datetime.date.today()}; `python bench/simulate_models_speed.py` "
        "(castpack-nvidia's H200 profile as a file, no packs)",
        "",
        "| run | command | cold s | warm s |",
        "|---|---|---:|---:|",
    ]
    for name, command in RUNS.items():
        with tempfile.TemporaryDirectory() as cache:
            env = {**os.environ, "XDG_CACHE_HOME": cache}
            cold, warm = (timed(command, env) for _ in range(2))
        shown = " ".join(a for a in command if a not in (H200, "--device-file", "--no-packs"))
        lines.append(f"| {name} | `castcore {shown}` | {cold:.1f} | {warm:.1f} |")
    Path(args.out).write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
