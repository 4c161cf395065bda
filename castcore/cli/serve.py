"""``castcore serve``: what serving a model costs: TTFT, TPOT, latency, throughput and memory of a request batch."""

from __future__ import annotations

import argparse
import time

from castcore.cli.common import (
    announce_capture,
    capture_cache_from,
    chosen_device,
    fail_on_fallback,
    make_session,
    note,
    report_capture_cache,
    warn,
)
from castcore.cli.options import add_options
from castcore.cli.page import page_path, write_page
from castcore.options.catalog import SERVE
from castcore.workload.spec import DEPLOYMENT


def run(args: argparse.Namespace) -> int:
    from castcore.report.memory import format_bytes
    from castcore.serving.static import check_request, decode_points

    batch = "max" if args.max_batch else args.batch
    # Bad options fail before any plugin or model loads.
    deployment = {name: getattr(args, name) for name in DEPLOYMENT}
    check_request(args.model, args.input_tokens, args.output_tokens, batch, **deployment)
    SERVE["price_per_device_hour"].check(args.price_per_device_hour)
    html = page_path(args)
    cache = capture_cache_from(args)
    session = make_session(args, capture_step=cache)
    chosen_device(session, args.device)
    announce_capture(
        cache,
        f"capturing {args.model}: a prefill and decode steps at KV lengths "
        f"{', '.join(map(str, decode_points(args.input_tokens, args.output_tokens)))}"
        + (", at the batches the --max-batch search needs" if args.max_batch else "")
        + " ...",
    )
    started = time.perf_counter()
    report = session.serve(
        args.model,
        input_tokens=args.input_tokens,
        output_tokens=args.output_tokens,
        batch=batch,
        device=args.device,
        price_per_device_hour=args.price_per_device_hour,
        **deployment,
    )
    note(f"estimated in {time.perf_counter() - started:.1f} s")
    report_capture_cache(cache)
    for line in dict.fromkeys(line for step in report.reports() for line in step.warnings):
        warn(line)
    for line in report.notes:
        note(f"note: {line}")
    memory = report.memory()
    if not memory["fits"]:
        warn(
            f"does not fit: needs {format_bytes(memory['peak_bytes'])} of "
            f"{format_bytes(memory['device_memory_bytes'])} per device; try a larger --tp, a smaller --batch, "
            "more devices, or --max-batch"
        )
    if html:
        from castcore.report.html.serve import serve_data

        write_page(html, "serve", serve_data(report))
    print(report.to_json() if args.json else report.format_text())
    fail_on_fallback(
        session, sorted({op for step in report.reports() for op in step.coverage()["fallback_ops"]})
    )
    return 0


def add_parser(subparsers) -> None:
    cmd = subparsers.add_parser(
        "serve",
        help="serving figures: TTFT, TPOT, latency, throughput and memory of a batch of requests",
        description="Estimate serving a causal LM: one prefill of --batch x --input tokens (TTFT), then --output "
        "decode steps (TPOT, captured at the first, middle and last KV length and fitted as affine in "
        "it), the request latency, output tokens/s, and memory at the longest context: a static batch, "
        "as a latency benchmark runs one. For requests arriving over time and continuous batching "
        "(percentiles, goodput), use castcore simulate.",
    )
    add_options(cmd, SERVE)
    cmd.set_defaults(func=run, quick_exit=True)
