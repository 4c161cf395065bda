"""``castcore plan``: prints what castcore.sweeps.plan.plan finds, the best deployments of a model for a traffic
shape and latency objectives over the installed devices."""

from __future__ import annotations

import argparse
import json
from typing import Any

from castcore.cli.common import note
from castcore.cli.options import add_options, values
from castcore.cli.page import page_path, write_page
from castcore.cli.plan_text import format_frontier, format_layout, format_plan
from castcore.options.parts import AXIS
from castcore.options.plan import PLAN
from castcore.plugins.selection import PluginOptions
from castcore.report.html.plan import named

ENERGY_AND_COST = (
    "energy_j",
    "output_tokens_per_joule",
    "joules_per_output_token",
    "power_w_per_device",
    "usd_per_hour",
    "usd_per_million_input_tokens",
    "usd_per_million_output_tokens",
)
NONE_MEETS = 3  # the exit status when no layout fits and meets the objectives (plan --help says so)


def plan_json(result: Any) -> dict[str, Any]:
    """The request, the best and the fewest, each row with the figures a script compares."""
    request = result.request
    if request.traffic:
        keep = (
            "device",
            "devices",
            "tp",
            "pp",
            "ep",
            "dp",
            "weights",
            "activations",
            "kv_cache",
            "max_batched_tokens",
            "max_running_requests",
            "prefill_instances",
            "decode_instances",
            "decode_deployment",
            "mean_kv_transfer_ms",
            "rate",
            "concurrency",
            "completed",
            "request_throughput",
            "output_throughput",
            "output_tokens_per_s_per_device",
            "preemptions",
            *(
                f"{stat}_{metric}_ms"
                for metric in ("ttft", "tpot")
                for stat in ("mean", "median", "p90", "p95", "p99")
            ),
            *(("max_rate",) if request.max_rate else ()),
            "saturated",
            "steady_requests",
            *(
                f"steady_{stat}_{metric}_ms{end}"
                for metric in ("ttft", "tpot")
                for stat in ("median", "p90", "p99")
                for end in ("", "_low", "_high")
            ),
            "margins",
        )
    else:
        keep = (
            "device",
            "devices",
            "tp",
            "pp",
            "ep",
            "weights",
            "activations",
            "kv_cache",
            "served_batch",
            "ttft_s",
            "tpot_s",
            "latency_s",
            "output_tokens_per_s",
            "output_tokens_per_s_per_device",
            "peak_bytes",
            "device_memory_bytes",
        )
    keep = (*keep, *(k for k in ENERGY_AND_COST if any(k in r for r in (*result.best, *result.fewest))))

    def pick(row: dict[str, Any], every: bool = True) -> dict[str, Any]:
        named_row = named(row, request.dtype)  # weights in the model's dtype: its name
        return {k: named_row.get(k) for k in keep if every or k in row}

    objectives = {
        name: None if objective is None else {"statistic": objective.statistic, "s": objective.seconds}
        for name, objective in (("ttft", request.ttft), ("tpot", request.tpot))
    }
    traffic = (
        {
            "rate": request.rate,
            "concurrency": request.concurrency,
            "max_rate": request.max_rate,
            "requests": request.requests,
            "engine": request.engine,
            "max_batched_tokens": request.max_batched_tokens,
            "max_running_requests": request.max_running_requests,
            **request.shared,
        }
        if request.traffic
        else {}
    )
    return {
        "model": request.model,
        "input_tokens": request.input_tokens,
        "output_tokens": request.output_tokens,
        "objective": request.objective,
        "price_per_device_hour": request.price_per_device_hour,
        "device_prices": request.device_prices,
        "ttft_s": request.ttft_s,
        "tpot_s": request.tpot_s,
        "objectives": objectives,
        **traffic,
        "devices": request.devices,
        "layouts": result.layouts,
        "points": len(result.rows),
        "skipped": result.skipped,
        "best": [pick(r) for r in result.best],
        # with --frontier: each best row's curve, in the order of best
        **({"frontier": result.frontier} if result.frontier is not None else {}),
        "fewest": [pick(r) for r in result.fewest],
        # per device type searched, its best under the objective and its figure against the winner's
        "by_device": [
            {
                "device": e["device"],
                "figure": e["figure"],
                "ratio": e["ratio"],
                "best": e["row"] and pick(e["row"]),
            }
            for e in result.by_device
        ],
        **(
            {"missed": [{**pick(r, every=False), "why": r["missed"]} for r in result.missed]}
            if request.traffic
            else {}
        ),
        **(
            {
                "verdict": {
                    "winner": result.verdict["winner"],
                    "why": result.verdict["why"],
                    **{
                        kind: None if result.verdict[kind] is None else pick(result.verdict[kind])
                        for kind in ("aggregated", "disaggregated")
                    },
                }
            }
            if result.verdict
            else {}
        ),
    }


def run(args: argparse.Namespace) -> int:
    _check_emit(args)
    html = page_path(args)
    if args.rate is not None or args.concurrency is not None or args.max_rate:
        served = f"{args.requests} requests" if args.dataset is None else "the dataset's requests"
        note(
            f"planning {args.model}: each layout simulated under the traffic ({served}, {args.engine} engine), "
            + (
                "bisecting each one's rate ..."
                if args.max_rate
                else "with more replicas where an objective is missed ..."
            )
        )
    else:
        note(
            f"planning {args.model}: serve points at each layout's largest batch, then smaller batches where an "
            "objective is missed ..."
        )
    from castcore.sweeps.plan import plan

    options = {k: v for k, v in values(args, PLAN, AXIS).items() if k != "model"}
    result = plan(args.model, **options, plugins=PluginOptions.of(args), progress=None)
    emitted = _emit(args, result) if args.emit else None  # before anything is printed: all of it, or an error
    if html:
        from castcore.report.html.plan import plan_data

        write_page(html, "plan", plan_data(result, plan_json(result)))
    if args.json:
        print(json.dumps({**plan_json(result), **({"emit": emitted.to_dict()} if emitted else {})}, indent=2))
    else:
        print(format_plan(result))
        if result.frontier is not None:
            print(format_frontier(result))
        if emitted:
            best = _launched(result)
            number = result.best.index(best) + 1
            print(
                f"\nlaunch files for #{number} ({best['device']}, {format_layout(best, result.request.dtype)}) on "
                f"{args.emit}"
                + (
                    ", the best aggregated deployment (disaggregated pools have none yet)"
                    if number > 1
                    else ""
                )
                + "\n"
                + "\n".join(emitted.lines())
            )
    return 0 if result.best else NONE_MEETS


def _check_emit(args: argparse.Namespace) -> None:
    from castcore.errors import ModelError
    from castcore.options.catalog import say

    traffic = args.rate is not None or args.concurrency is not None or args.max_rate
    if args.emit and traffic and args.emit != args.engine:
        raise ModelError(
            f"{say('emit', args.emit)} with {say('engine', args.engine)}: the plan simulates "
            f"{args.engine}'s scheduler; give {say('engine', args.emit)} to plan for {args.emit}"
        )
    # the launch files benchmark random prompts of fixed lengths, without a shared prefix or a draft model
    unwritten = [say(name) for name in ("input_tokens", "output_tokens") if not args.__dict__[name].isdigit()]
    unwritten += [
        say(name) for name in ("dataset", "prefix_len", "spec_tokens") if args.__dict__[name] is not None
    ]
    if args.emit and unwritten:
        raise ModelError(
            f"{say('emit', args.emit)} prints a benchmark of random prompts of fixed lengths, which "
            f"{', '.join(unwritten)} cannot be: give {say('input_tokens')} and {say('output_tokens')} as "
            f"numbers, without {say('dataset')}, {say('prefix_len')} or {say('spec_tokens')}"
        )


def _emit(args: argparse.Namespace, result: Any) -> Any:
    """The launch files of the best deployment (castcore.sweeps.launch)."""
    from castcore.errors import ModelError
    from castcore.options.catalog import say
    from castcore.sweeps.launch import launch_files
    from castcore.sweeps.launch_bench import Traffic
    from castcore.simulation.presets import limits
    from castcore.sweeps.launch_server import Deployment

    request = result.request
    if not result.best:
        raise ModelError(
            f"{say('emit', args.emit)}: no deployment meets the objectives, so there is none to launch "
            "(run the plan without it to see what to relax)"
        )
    row = _launched(result)
    if request.traffic:
        rate = row["max_rate"] if request.max_rate else request.rate
        traffic = Traffic(
            int(request.input_tokens),
            int(request.output_tokens),
            row.get("requests") or request.requests,  # the confirming run's, which gave the row's figures
            rate,
            request.concurrency,
            request.shared["burstiness"],
            request.shared["seed"],
        )
    else:  # a static batch: its requests sent at once
        traffic = Traffic(request.input_tokens, request.output_tokens, row["served_batch"])
    # the engine limits the plan searched, as the best row ran them (the rest: the preset's)
    searched = {k: row[k] for k in ("max_batched_tokens", "max_running_requests") if row.get(k)}
    return launch_files(
        args.emit,
        Deployment.of({**row, "model": request.model}, request.dtype),
        traffic,
        limits(request.engine, **searched) if searched else None,
        castcore_options=plugin_flags(args),
    )


def _launched(result: Any) -> dict[str, Any]:
    """The best deployment launch files are written for: the best aggregated one (disaggregated pools have none
    yet); ModelError when no aggregated one meets the objectives."""
    from castcore.errors import ModelError
    from castcore.options.catalog import say

    row = next((r for r in result.best if not r.get("prefill_instances")), None)
    if row is None:
        raise ModelError(
            f"{say('emit')} writes an aggregated deployment's launch files, and only disaggregated "
            f"layouts meet the objectives: run the plan without {say('disaggregated', True)} to emit one"
        )
    return row


def plugin_flags(args: argparse.Namespace) -> list[str]:
    """The plugin options given, as flags: a castcore command printed for this run loads the same devices."""
    flags = [f for d in args.custom_op_dir or () for f in ("--custom-op-dir", d)]
    flags += [f for d in args.device_file or () for f in ("--device-file", d)]
    return (
        flags
        + ["--no-default-custom-op-dirs"] * args.no_default_custom_op_dirs
        + ["--no-packs"] * args.no_packs
    )


def add_parser(subparsers) -> None:
    cmd = subparsers.add_parser(
        "plan",
        help="which device, parallel layout, weights and batch serve a model best, and the fewest devices",
        description="Search the installed devices (or --device), tensor/pipeline/expert parallel layouts, weight "
        "dtypes and batches for serving --model with requests of --input + --output tokens: print the "
        "best by output tokens/s per device (or by --objective cost or energy) that fit in memory and "
        "meet --ttft/--tpot, and the fewest "
        "devices that fit at all. Runs castcore serve points through the sweep machinery (and its "
        "capture cache). With --rate or --concurrency each layout is simulated under that traffic "
        "instead (castcore simulate), replicas added until --ttft/--tpot (percentiles such as p99:500ms) "
        "are met; --max-rate finds each layout's highest request rate within them.",
        epilog=f"Exit status: 0 when a layout fits and meets the objectives; {NONE_MEETS} when none does (the "
        "output says what to relax); 2 for bad input (an option, a model that cannot be built, an unknown "
        "device).",
    )
    add_options(cmd, PLAN)
    cmd.set_defaults(func=run)
