"""The ``castcore`` command."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence

from .capture import CaptureError
from .config import ConfigError
from .devices import DeviceError, dtype_name
from .estimate import EstimatorError
from .models import DEFAULT_MODEL, DTYPES, ModelError, build_workload, preset_names
from .session import Session

USER_ERRORS = (ConfigError, DeviceError, ModelError, CaptureError, EstimatorError)


def _plugin_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("plugins and devices")
    group.add_argument("--custom-op-dir", action="append", metavar="DIR",
                       help="load every *.py in DIR as a plugin that beats installed packs (repeatable; "
                            "also CASTCORE_CUSTOM_OP_PATH)")
    group.add_argument("--device-file", action="append", metavar="TOML",
                       help="add a device profile from a TOML file (repeatable); the first is the default device")
    group.add_argument("--no-packs", action="store_true", help="load no installed packs (same as CASTCORE_LOAD_PACKS=)")
    group.add_argument("--debug", action="store_true", help="show tracebacks instead of one-line errors")


def _session(args: argparse.Namespace) -> Session:
    session = Session(custom_op_dirs=args.custom_op_dir, device_files=args.device_file,
                      load_packs=[] if args.no_packs else None)
    for warning in session.warnings:
        print(f"castcore: warning: {warning}", file=sys.stderr)
    return session


def cmd_estimate(args: argparse.Namespace) -> int:
    session = _session(args)
    device = session.device(args.device)
    started = time.perf_counter()
    print(f"castcore: building {args.model} and capturing on fake tensors ...", file=sys.stderr)
    workload = build_workload(args.model, batch=args.batch, seq=args.seq, dtype=args.dtype)
    report = session.estimate(workload.model, *workload.args, kwargs=workload.kwargs, device=device,
                              description=workload.description)
    print(f"castcore: {len(report.records)} op calls estimated in {time.perf_counter() - started:.1f} s",
          file=sys.stderr)
    print(report.to_json() if args.json else report.format_table(top=args.top))
    return 0


def cmd_devices(args: argparse.Namespace) -> int:
    session = _session(args)
    rows = [{"name": d.name, "vendor": d.vendor, "memory_bytes": d.memory_bytes,
             "memory_bandwidth": d.memory_bandwidth,
             "mma_flops": {dtype_name(k): v for k, v in d.mma_flops.items()},
             "interconnect": [lvl.name for lvl in d.interconnect], "default": d.default, "origin": d.origin}
            for d in session.devices.values()]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print("no device profiles installed: pip install castpack-ascend, or pass --device-file my.toml")
        return 0
    for row in rows:
        bf16 = row["mma_flops"].get("bfloat16")
        peak = f"bf16 {bf16 / 1e12:7.1f} TFLOP/s" if bf16 else "no bf16 matrix rate"
        print(f"{row['name']:<20} {row['vendor']:<10} {row['memory_bytes'] / 2**30:7.1f} GiB  "
              f"{row['memory_bandwidth'] / 1e12:5.2f} TB/s  {peak}"
              f"{'  (default)' if row['default'] else ''}  from {row['origin']}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="castcore",
        description="Estimate how fast a PyTorch model runs on an accelerator you may not have.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    est = sub.add_parser(
        "estimate", help="capture a model on fake tensors and estimate every operator call",
        description="Capture a model on fake tensors (no weights are allocated) and estimate each operator "
                    "call on a device. With no arguments: Llama-3-8B prefill, batch 1, 2048 tokens, bf16, "
                    "on the default installed device.")
    est.add_argument("--model", default=DEFAULT_MODEL,
                     help=f"a preset ({', '.join(preset_names())}) or a transformers config.json path "
                          f"(default: {DEFAULT_MODEL})")
    est.add_argument("--batch", type=int, default=1, help="sequences per batch (default: 1)")
    est.add_argument("--seq", type=int, default=2048, help="tokens per sequence (default: 2048)")
    est.add_argument("--dtype", default="bf16", choices=sorted(DTYPES), help="weights and activations (default: bf16)")
    est.add_argument("--device", help="device profile name (castcore devices lists them; default: the "
                                      "configured default_device, else the first profile marked default)")
    est.add_argument("--top", type=int, default=30, help="rows in the table, slowest first (default: 30)")
    est.add_argument("--json", action="store_true", help="print the whole report as JSON")
    _plugin_options(est)
    est.set_defaults(func=cmd_estimate)

    dev = sub.add_parser("devices", help="list installed device profiles",
                         description="List the device profiles installed packs provide, and any --device-file.")
    dev.add_argument("--json", action="store_true", help="print JSON")
    _plugin_options(dev)
    dev.set_defaults(func=cmd_devices)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return args.func(args)
    except USER_ERRORS as exc:
        if args.debug:
            raise
        print(f"castcore: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
