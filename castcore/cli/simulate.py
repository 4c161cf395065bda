"""``castcore simulate``: a deployment serving requests under traffic (castcore.serving.traffic), printed."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from castcore.cli.common import (
    announce_capture,
    capture_cache_from,
    chosen_device,
    make_session,
    note,
    report_capture_cache,
    warn,
)
from castcore.cli.options import add_options, values
from castcore.options.parts import AXIS
from castcore.options.traffic import SIMULATE
from castcore.cli.page import page_path, simulation_figures, write_page
from castcore.report.output_files import check_output, write_whole


def run(args: argparse.Namespace) -> int:
    from castcore.serving.simulation_plan import check
    from castcore.serving.traffic import simulate_traffic

    options = {k: v for k, v in values(args, SIMULATE, AXIS).items() if k not in ("model", "device")}
    # bad options, lengths or datasets fail before any plugin or model loads
    plan = check(args.model, **options)
    emitted = _emit(args, plan) if args.emit else None
    trace = check_output(args.trace, "trace") if args.trace else None
    plot = check_output(args.plot, "plot") if args.plot else None
    html = page_path(args)
    if plot:
        from castcore.report.plot import pyplot

        pyplot()  # matplotlib missing: said before the work, not after
    cache = capture_cache_from(args)
    session = make_session(args, capture_step=cache)
    chosen_device(session, args.device)
    note(f"simulating {len(plan.requests)} requests ...")
    announce_capture(cache, f"capturing {args.model} at the engine's token counts ...")
    started = time.perf_counter()
    report = simulate_traffic(session.pipeline, plan, device=args.device)
    note(f"simulated in {time.perf_counter() - started:.1f} s")
    report_capture_cache(cache)
    for line in report.notes:
        note(f"note: {line}")
    if report.never_fit:
        warn(
            f"{len(report.never_fit)} request(s) never fit and were not simulated: request "
            f"{report.never_fit[0]['index']}: {report.never_fit[0]['why']}"
        )
    if trace:  # the file first: when it cannot be written, no figures are printed as if all had worked
        events = json.dumps(report.to_trace())
        write_whole(trace, "trace", lambda path: path.write_text(events, encoding="utf-8"))
        note(f"wrote the trace of {report.iterations:,} iterations to {trace} (open it in ui.perfetto.dev)")
    if plot and report.finished:
        write_whole(plot, "plot", report.plot)
        note(f"wrote the TTFT/TPOT distributions and throughput over time to {plot}")
    elif plot:
        warn(f"no request finished, so nothing was drawn to {plot}")
    if html:
        from castcore.report.html.simulate import simulate_data

        write_page(
            html, "simulate", simulate_data(report, simulation_figures(report, args, session.pipeline.host))
        )
    _print(report, args, emitted, session.pipeline.host)
    if report.partial:
        warn(f"interrupted: the figures are of the {report.summary['completed']} requests finished by then")
        return 130
    return 0


def _print(report, args: argparse.Namespace, emitted=None, host=None) -> None:
    """The report, with its energy (when every pool's device profile gives its power) and its cost at
    --price-per-device-hour (castcore.report.energy), and the launch files of --emit."""
    from castcore.report.energy import format_lines

    cost = simulation_figures(report, args, host)
    if args.json and emitted:
        print(json.dumps({**report.to_dict(), **cost, "emit": emitted.to_dict()}, indent=2))
    elif args.json:
        print(json.dumps({**report.to_dict(), **cost}, indent=2) if cost else report.to_json())
    else:
        print("\n".join([report.format_text(), *format_lines(cost)]))
        if emitted:
            print(f"\nlaunch files on {args.emit}\n" + "\n".join(emitted.lines()))


def _emit(args: argparse.Namespace, checked) -> Any:
    """--emit's launch files (castcore.sweeps.launch) for this deployment and these requests."""
    from castcore.cli.plan import plugin_flags
    from castcore.errors import ModelError
    from castcore.options.catalog import say
    from castcore.sweeps.launch import launch_files
    from castcore.sweeps.launch_bench import Traffic
    from castcore.sweeps.launch_server import Deployment

    if args.emit != args.engine:
        raise ModelError(
            f"{say('emit', args.emit)} with {say('engine', args.engine)}: the simulation runs "
            f"{args.engine}'s scheduler; give {say('engine', args.emit)} too"
        )
    unwritten = [
        say(name)
        for name, given in (
            ("prefill_instances", checked.pools),
            ("spec_tokens", checked.speculation),
            ("prefix_len", args.prefix_len),
            ("lora_rank", args.lora_rank),
        )
        if given
    ]
    if unwritten:
        raise ModelError(
            f"{say('emit', args.emit)} writes an aggregated deployment's launch files, without "
            f"{', '.join(unwritten)} yet: drop {' and '.join(unwritten)} to write them"
        )
    if args.dataset or not (args.input_lengths.isdigit() and args.output_lengths.isdigit()):
        raise ModelError(
            f"{say('emit', args.emit)} prints a benchmark of random prompts of fixed lengths: give "
            f"{say('input_lengths')} and {say('output_lengths')} as numbers, without {say('dataset')}"
        )
    deployment = Deployment(
        args.model,
        args.device,
        args.tp,
        args.pp,
        args.ep,
        args.attention_dp,
        args.dp,
        args.dtype,
        args.weights,
        args.activations,
        args.kv_cache,
    )
    traffic = Traffic(
        int(args.input_lengths),
        int(args.output_lengths),
        len(checked.requests),
        args.rate,
        args.concurrency,
        args.burstiness,
        args.seed,
    )
    return launch_files(args.emit, deployment, traffic, checked.limits, plugin_flags(args))


def add_parser(subparsers) -> None:
    cmd = subparsers.add_parser(
        "simulate",
        help="what a deployment delivers under traffic: continuous batching, TTFT/TPOT percentiles, goodput",
        description="Simulate serving requests on a deployment as an engine runs them (vLLM, SGLang or TensorRT-LLM "
        "defaults): requests arrive all at once, at --rate or in a --concurrency closed loop; each "
        "iteration mixes prefill chunks and decode tokens within the engine's limits, over a KV cache of "
        "whole blocks (preempting when it runs out), and takes the time castcore estimates for that "
        "mixed batch. Prints vllm bench serve's figures (--json: its field names). castcore serve prices "
        "one static batch instead (a latency benchmark's setting).",
    )
    add_options(cmd, SIMULATE)
    cmd.set_defaults(func=run, quick_exit=True)
