"""``castcore serve``: what serving a model costs: TTFT, TPOT, latency, throughput and memory of a request batch."""

from __future__ import annotations

import argparse
import time

from castcore.cli.common import (add_cache_option, add_deployment_options, add_dtype_argument, add_model_argument,
                                 add_plugin_options, deployment_from, fail_on_fallback, make_session, note,
                                 report_capture_cache, use_capture_cache, warn)
from castcore.workload.spec import DEFAULT_MODEL


def run(args: argparse.Namespace) -> int:
    from castcore.report.memory import format_bytes
    from castcore.workload.serving import check_request, decode_points

    batch = "max" if args.max_batch else args.batch
    # Bad options fail before any plugin or model loads.
    deployment = deployment_from(args)
    check_request(args.model, args.input, args.output, batch, **deployment)
    session = make_session(args)
    cache = use_capture_cache(session, args)
    note(f"capturing {args.model}: a prefill and decode steps at KV lengths "
         f"{', '.join(map(str, decode_points(args.input, args.output)))}"
         + (", at the batches the --max-batch search needs" if args.max_batch else "") + " ...")
    started = time.perf_counter()
    report = session.serve(args.model, input_tokens=args.input, output_tokens=args.output, batch=batch,
                           device=args.device, **deployment)
    note(f"estimated in {time.perf_counter() - started:.1f} s")
    report_capture_cache(cache)
    for line in dict.fromkeys(line for step in report.reports() for line in step.warnings):
        warn(line)
    for line in report.notes:
        note(f"note: {line}")
    memory = report.memory()
    if not memory["fits"]:
        warn(f"does not fit: needs {format_bytes(memory['peak_bytes'])} of "
             f"{format_bytes(memory['device_memory_bytes'])} per device; try a larger --tp, a smaller --batch, "
             "more devices, or --max-batch")
    print(report.to_json() if args.json else report.format_text())
    fail_on_fallback(session, sorted({op for step in report.reports() for op in step.coverage()["fallback_ops"]}))
    return 0


def add_parser(subparsers) -> None:
    cmd = subparsers.add_parser(
        "serve", help="serving figures: TTFT, TPOT, latency, throughput and memory of a batch of requests",
        description="Estimate serving a causal LM: one prefill of --batch x --input tokens (TTFT), then --output "
                    "decode steps (TPOT, captured at the first, middle and last KV length and fitted as affine in "
                    "it), the request latency, output tokens/s, and memory at the longest context.")
    group = cmd.add_argument_group("request")
    add_model_argument(group, DEFAULT_MODEL)
    group.add_argument("--input", type=int, default=2048, metavar="N", help="prompt tokens per request (default: 2048)")
    group.add_argument("--output", type=int, default=256, metavar="N",
                       help="tokens each request generates (default: 256)")
    sizes = group.add_mutually_exclusive_group()
    sizes.add_argument("--batch", type=int, default=1, metavar="N", help="requests served together (default: 1)")
    sizes.add_argument("--max-batch", action="store_true",
                       help="use the largest batch whose memory fits the device (bisection over peak memory per "
                            "batch, confirmed by capture)")
    add_dtype_argument(group)
    add_deployment_options(cmd)
    cmd.add_argument("--device", help="device profile name (castcore devices lists them; default: the configured "
                                      "default_device, else the first profile marked default)")
    cmd.add_argument("--json", action="store_true",
                     help="print the figures as JSON (ttft_s, tpot_s, latency_s, output_tokens_per_s, memory, ...)")
    add_cache_option(cmd)
    add_plugin_options(cmd)
    cmd.set_defaults(func=run, quick_exit=True)
