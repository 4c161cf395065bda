"""castcore's fidelity report: published measurements (fitted and held out) and this machine, calibrated then timed.

Published: every point in bench/fidelity/published.json estimated the way it ran on its device's profile
(castpack-nvidia, castpack-ascend; collectives priced by castpack-collectives), split into the points a profile
constant was set from ("fitted") and the rest ("held out"), summarised per category (see published.py, split.py).
Local: see local.py. Writes the JSON and its Markdown (bench/figures.py) and prints the Markdown.

    python bench/fidelity/run.py [--out bench/results/fidelity.json] [--no-local] [--no-published]
                                 [--only ID ...] [--device NAME ...] [--budget 0.3]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BENCH))  # figures.py and the fidelity package

import figures  # noqa: E402
from fidelity.published import load_points, make_session, run_published  # noqa: E402
from fidelity.report import device_coverage, markdown, summarize  # noqa: E402
from fidelity.split import used_for_fitting  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--out", default="bench/results/fidelity.json", help="JSON file; the Markdown goes next to it"
    )
    parser.add_argument("--no-local", action="store_true", help="skip calibrating and timing this machine")
    parser.add_argument("--no-published", action="store_true", help="skip the published points")
    parser.add_argument("--only", nargs="+", metavar="ID", help="estimate only these published points")
    parser.add_argument(
        "--device",
        nargs="+",
        metavar="NAME",
        help="estimate only the published points on these device profiles",
    )
    parser.add_argument(
        "--budget", type=float, default=0.3, help="seconds of timed calls per local op (default 0.3)"
    )
    args = parser.parse_args()

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    started = time.perf_counter()
    local = None
    if not args.no_local:  # first, on a machine not yet busy with the published captures
        from fidelity.local import run_local

        local = run_local(budget_s=args.budget, progress=progress)
    published_started = time.perf_counter()
    rows = []
    session = make_session()
    if not args.no_published:
        points = load_points()
        if args.only:
            points = [p for p in points if p["id"] in set(args.only)]
        if args.device:
            points = [p for p in points if p["device"] in set(args.device)]
        rows = run_published(points, session=session, progress=progress)
    report = {
        "summary": summarize(rows),
        "fitting_documents": used_for_fitting(rows),
        "devices": device_coverage(rows, session.devices) if rows else [],
        "rows": rows,
        "local": local,
        "published_wall_s": time.perf_counter() - published_started,
    }
    report["wall_s"] = time.perf_counter() - started
    figures.write(args.out, report, lambda machine: markdown(report, machine))


if __name__ == "__main__":
    main()
