"""``castcore report RESULTS --html FILE``: the page of a results file written earlier (castcore.report.html)."""

from __future__ import annotations

import argparse

from castcore.cli.common import note
from castcore.cli.options import add_options
from castcore.options.catalog import REPORT


def run(args: argparse.Namespace) -> int:
    from castcore.report.html.results import read_results
    from castcore.report.html.write import check_html, write_page

    target = check_html(args.html)  # an unwritable page or a missing plotly before the file is read
    data = read_results(args.results)
    write_page(data, target)
    note(f"wrote the HTML page {target} of {args.results} ({data['kind']}); it opens offline in any browser")
    return 0


def add_parser(subparsers) -> None:
    cmd = subparsers.add_parser(
        "report",
        help="render a results file (estimate, serve, simulate or plan --json; sweep --out) as one HTML page",
        description="Write one self-contained HTML page of results castcore wrote earlier: the JSON estimate, serve, "
        "simulate and plan print with --json, or the rows castcore sweep writes with --out (.jsonl, .csv, "
        ".parquet). The page inlines everything it needs (Plotly's charts, the tables' sorting and "
        "filtering), so it opens offline. A page made with --html on the run itself shows more: every "
        "call on the roofline, memory op by op, each simulated request and iteration.",
    )
    add_options(cmd, REPORT)
    cmd.set_defaults(func=run)
