"""``castcore plan``: prints what castcore.sweeps.plan.plan finds, the best deployments of a model for a traffic
shape and latency objectives over the installed devices."""

from __future__ import annotations

import argparse
import json
from typing import Any

from castcore.cli.common import note
from castcore.cli.options import add_options, values
from castcore.options.catalog import AXIS, PLAN
from castcore.plugins.selection import PluginOptions

NONE_MEETS = 3  # the exit status when no layout fits and meets the objectives (plan --help says so)


def _seconds(value: float) -> str:
    from castcore.report.records import format_seconds

    return format_seconds(value)


def _layout(row: dict[str, Any], dtype: str) -> str:
    parts = [f"{k} {row[k]}" for k in ("tp", "pp", "ep") if row[k] > 1] or ["1 device"]
    return " x ".join(parts) + f", {row['weights'] or dtype} weights"


def format_plan(result: Any) -> str:
    from castcore.report.memory import format_bytes

    request = result.request
    slos = [f"TTFT <= {_seconds(request.ttft_s)}"] if request.ttft_s else []
    slos += [f"TPOT <= {_seconds(request.tpot_s)}"] if request.tpot_s else []
    lines = [f"{request.model}: requests of {request.input_tokens} input + {request.output_tokens} output tokens"
             + (f", {' and '.join(slos)}" if slos else ", no latency objective"),
             f"searched {result.layouts} layouts on {', '.join(request.devices)} ({len(result.rows)} serve points, "
             f"{len(result.refused)} layouts refused or not fitting at batch 1) in {result.seconds:.1f} s", ""]
    if result.best:
        header = ("#", "device", "devices", "layout", "batch", "TTFT", "TPOT", "tok/s/device", "peak/device")
        cells = [(str(n), r["device"], str(r["devices"]), _layout(r, request.dtype), str(r["served_batch"]),
                  _seconds(r["ttft_s"]), _seconds(r["tpot_s"]), f"{r['output_tokens_per_s_per_device']:,.1f}",
                  format_bytes(r["peak_bytes"])) for n, r in enumerate(result.best, 1)]
        widths = [max(len(row[i]) for row in [header, *cells]) for i in range(len(header))]
        lines.append(f"best {len(result.best)} by output tokens/s per device (fit in memory"
                     + (", meet the objectives)" if slos else ")"))
        lines += ["  ".join(c.ljust(w) if i in (1, 3) else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
                  .rstrip() for row in [header, *cells]]
    else:
        lines.append("no layout fits and meets the objectives: relax --ttft/--tpot, raise --max-devices, or add "
                     "--weights int4")
    if result.refused:
        lines += ["", "refused or not fitting at batch 1 (layouts: reason)"]
        reasons: dict[str, list[str]] = {}
        for row in result.refused:
            reasons.setdefault(row["error"], []).append(f"{row['device']} {_layout(row, request.dtype)}")
        lines += [f"  {'; '.join(where)}: {why if len(why) <= 200 else why[:197] + '...'}"
                  for why, where in reasons.items()]
    lines.append("")
    if result.fewest:
        lines.append("fewest devices that fit at all")
        lines += [f"  {r['device']}: {r['devices']} device{'s' if r['devices'] > 1 else ''} "
                  f"({_layout(r, request.dtype)}), up to batch {r['served_batch']}" for r in result.fewest]
    else:
        lines.append(f"no layout of at most {request.max_devices} devices holds even batch 1: raise --max-devices")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    note(f"planning {args.model}: serve points at each layout's largest batch, then smaller batches where an "
         "objective is missed ...")
    from castcore.sweeps.plan import plan

    options = {k: v for k, v in values(args, PLAN, AXIS).items() if k != "model"}
    result = plan(args.model, **options, plugins=PluginOptions.of(args), progress=None)
    if args.json:
        keep = ("device", "devices", "tp", "pp", "ep", "weights", "served_batch", "ttft_s", "tpot_s", "latency_s",
                "output_tokens_per_s", "output_tokens_per_s_per_device", "peak_bytes", "device_memory_bytes")
        print(json.dumps({"model": args.model, "input_tokens": args.input_tokens, "output_tokens": args.output_tokens,
                          "ttft_s": result.request.ttft_s, "tpot_s": result.request.tpot_s,
                          "devices": result.request.devices, "layouts": result.layouts, "points": len(result.rows),
                          "best": [{k: r[k] for k in keep} for r in result.best],
                          "fewest": [{k: r[k] for k in keep} for r in result.fewest]}, indent=2))
    else:
        print(format_plan(result))
    return 0 if result.best else NONE_MEETS


def add_parser(subparsers) -> None:
    cmd = subparsers.add_parser(
        "plan", help="which device, parallel layout, weights and batch serve a model best, and the fewest devices",
        description="Search the installed devices (or --device), tensor/pipeline/expert parallel layouts, weight "
                    "dtypes and batches for serving --model with requests of --input + --output tokens: print the "
                    "best by output tokens/s per device that fit in memory and meet --ttft/--tpot, and the fewest "
                    "devices that fit at all. Runs castcore serve points through the sweep machinery (and its "
                    "capture cache).",
        epilog=f"Exit status: 0 when a layout fits and meets the objectives; {NONE_MEETS} when none does (the "
               "output says what to relax); 2 for bad input (an option, a model that cannot be built, an unknown "
               "device).")
    add_options(cmd, PLAN)
    cmd.set_defaults(func=run)
