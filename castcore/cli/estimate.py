"""``castcore estimate``: a model or workload on a device, by operator or module, as a table, JSON or CSV."""

from __future__ import annotations

import argparse
import json
import sys
import time

from castcore.cli.common import (
    StrictFailure,
    announce_capture,
    capture_cache_from,
    chosen_device,
    fail_on_fallback,
    make_session,
    note,
    progress_printer,
    report_capture_cache,
    warn,
)
from castcore.cli.options import add_options, values
from castcore.options.catalog import AXIS, ESTIMATE
from castcore.cli.page import page_path, write_page
from castcore.report.output_files import check_output, write_whole
from castcore.workload.spec import build_workload


def run(args: argparse.Namespace) -> int:
    options = {k: v for k, v in values(args, ESTIMATE, AXIS).items() if k not in ("model", "device")}
    # bad options and unwritable files fail before anything loads
    workload = build_workload(args.model, **options)
    trace = check_output(args.trace, "trace") if args.trace else None
    plot = check_output(args.plot, "plot") if args.plot else None
    html = page_path(args)
    cache = capture_cache_from(args)
    session = make_session(args, on_error=args.on_error, capture_step=cache)
    device = chosen_device(session, args.device)
    announce_capture(cache, f"building {args.model} and capturing on fake tensors ...")
    started = time.perf_counter()
    show = progress_printer()
    report = session.estimate(workload, device=device, progress=show)
    if show:
        print(file=sys.stderr)
    report_capture_cache(cache)
    for line in report.warnings:
        warn(line)
    for line in report.notes:
        note(line if line.startswith("deployed kernels") else f"note: {line}")
    note(f"{len(report.records)} op calls estimated in {time.perf_counter() - started:.1f} s")
    for error in dict.fromkeys(session.resolver.errors):
        note(f"warning: {error} (fell back to the next plugin)")
    # Files first: when one cannot be written, no report is printed as if all had worked.
    if trace:
        events = json.dumps(report.to_trace())
        write_whole(trace, "trace", lambda path: path.write_text(events, encoding="utf-8"))
        note(f"wrote {len(report.records)} slices to {trace} (open it in ui.perfetto.dev)")
    if plot:
        from castcore.report.plot import plot_roofline

        write_whole(plot, "plot", lambda path: plot_roofline(report, path))
        note(f"wrote roofline chart {plot}")
    if html:
        from castcore.report.html.estimate import estimate_data

        write_page(html, "estimate", estimate_data(report, session))
    if args.json:
        print(report.to_json())
    elif args.csv:
        print(report.to_csv(by=args.by), end="")
    else:
        print(report.format_table(top=args.top, by=args.by))
    if session.config.strict and session.resolver.errors:
        raise StrictFailure(f"{len(session.resolver.errors)} estimator error(s) and --strict is on")
    fail_on_fallback(session, report.coverage()["fallback_ops"])
    return 0


def add_parser(subparsers) -> None:
    est = subparsers.add_parser(
        "estimate",
        help="capture a model on fake tensors and estimate every operator call",
        description="Capture a model on fake tensors (no weights are allocated) and estimate each operator "
        "call on a device. With no arguments: Llama-3-8B prefill, batch 1, 2048 tokens, bf16, "
        "on the default installed device.",
    )
    add_options(est, ESTIMATE)
    est.set_defaults(func=run, quick_exit=True)
