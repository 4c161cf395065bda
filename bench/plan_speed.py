"""castcore plan's speed as a user meets it (issue 41): Llama-3.1-70B on the H100 SXM profile under 5 requests/s of
ShareGPT-like traffic, bf16 and fp8 (weight-only and W8A8), p99 objectives; the whole ``castcore plan``
process timed from outside with an empty capture cache (cold) and again with the cache it filled (warm), its
validation simulations included (whatever the plan command runs is timed).

    python bench/plan_speed.py [--out bench/results/plan_speed.json]

Writes the JSON named and a .md beside it. Targets: <= 60 s cold and <= 15 s warm on a 2-core machine.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMMAND = [
    "plan",
    "--model",
    "llama-3.1-70b",
    "--device",
    "h100-sxm5-80gb",
    "--input",
    "lognormal:1000:1",
    "--output",
    "lognormal:250:1",
    "--rate",
    "5",
    "--ttft",
    "p99:1s",
    "--tpot",
    "p99:50ms",
    "--weights",
    "bf16",
    "fp8",
    "--activations",
    "bf16",
    "fp8",
]
TARGETS = {"cold": 60.0, "warm": 15.0}


def timed(env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "castcore", *COMMAND], check=True, capture_output=True, env=env)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "plan_speed.json"))
    args = parser.parse_args()
    load = os.getloadavg()[0]  # other work on the machine slows both runs: said beside the figures
    with tempfile.TemporaryDirectory() as cache:  # an empty capture cache: cold, then warm
        env = {**os.environ, "XDG_CACHE_HOME": cache}
        seconds = {"cold": timed(env), "warm": timed(env)}
    result = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}",
        "date": str(datetime.date.today()),
        "load_average_before": round(load, 2),
        "command": "castcore " + " ".join(COMMAND),
        "runs": {
            run: {"seconds": round(s, 1), "target_s": TARGETS[run], "met": s <= TARGETS[run]}
            for run, s in seconds.items()
        },
    }
    out = Path(args.out)
    out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    lines = [
        "# castcore plan: speed",
        "",
        f"{result['machine']}, {result['date']}, load average {load:.2f} before the runs; "
        "`python bench/plan_speed.py`",
        "",
        f"`{result['command']}`",
        "",
        "| run | seconds | target | met |",
        "|---|---|---|---|",
        *(
            f"| {run} ({'empty capture cache' if run == 'cold' else 'the captures cached'}) | {r['seconds']} "
            f"| <= {r['target_s']:g} s | {'yes' if r['met'] else 'no'} |"
            for run, r in result["runs"].items()
        ),
    ]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
