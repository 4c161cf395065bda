"""castcore's fidelity report: estimates against real timings on this machine and against published figures.

Local part: calibrate this machine (castcore calibrate's code), estimate an operator suite (matmuls,
pointwise, norms, softmax, attention) on that profile and time each op for real (warm-up, repeats,
median). Published part: the cited figures in bench/fidelity_published.json estimated on their
device profiles. Writes JSON and Markdown and prints the Markdown.

    python bench/fidelity.py --out bench/results/fidelity.json [--quick] [--no-local] [--no-published]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

HERE = Path(__file__).parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="bench/results/fidelity.json", help="JSON file; the Markdown goes next to it")
    parser.add_argument("--quick", action="store_true", help="small sizes and a quick calibration (seconds; "
                                                              "numbers far from this machine's best)")
    parser.add_argument("--budget", type=float, default=0.5, help="seconds of timed calls per op (default: 0.5)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads for calibrating and timing (default: 1; 0: torch's default)")
    parser.add_argument("--no-local", action="store_true", help="skip calibrating and timing this machine")
    parser.add_argument("--no-published", action="store_true", help="skip the published figures")
    args = parser.parse_args()

    from fidelity_report import fidelity_report, format_markdown, run_local, run_published, write_report

    started = time.perf_counter()

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    local = None if args.no_local else run_local(quick=args.quick, budget_s=args.budget, threads=args.threads or None,
                                                   progress=progress)
    published = None if args.no_published else run_published(root=HERE.parent)
    report = fidelity_report(local, published)
    out_json, out_md = write_report(report, args.out)
    print(format_markdown(report))
    print(f"wrote {out_json} and {out_md} in {time.perf_counter() - started:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
