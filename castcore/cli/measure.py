"""``castcore measure`` (an op run for real here, against its estimate) and ``castcore calibrate`` (this
machine's profile)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from castcore.cli.common import make_session
from castcore.cli.options import add_options
from castcore.options.tools import CALIBRATE, MEASURE


def run_measure(args: argparse.Namespace) -> int:
    from castcore.ops.register import lookup
    from castcore.operator_tools.command_line_op import example_inputs, load_callable
    from castcore.operator_tools.timing import measure

    session = make_session(args)
    target = load_callable(args.op)
    try:
        record = lookup(target)
    except KeyError:
        record = None
    values, kwargs = example_inputs(record, args.input, args.arg, args.dtype, name=args.op)
    report = measure(
        target, *values, session=session, device=args.device, warmup=args.warmup, repeat=args.repeat, **kwargs
    )
    print(report.to_json() if args.json else report.format_table())
    return 0


def run_calibrate(args: argparse.Namespace) -> int:
    from castcore.operator_tools.timing import calibrate, profile_toml

    cal = calibrate(quick=args.quick)
    text = profile_toml(cal, name=args.name)
    if args.output == "-":
        print(text, end="")
    else:
        Path(args.output).write_text(text, encoding="utf-8")
        bf16 = cal.mma_flops.get("bfloat16", 0.0)
        print(
            f"castcore: wrote {args.output}: fp32 matmul {cal.mma_flops.get('float32', 0) / 1e9:.1f} GFLOP/s, "
            f"bf16 {bf16 / 1e9:.1f} GFLOP/s, copy {cal.memory_bandwidth / 1e9:.1f} GB/s; use it with "
            f"--device-file {args.output}",
            file=sys.stderr,
        )
    return 0


def add_parsers(subparsers) -> None:
    parser = subparsers.add_parser(
        "measure",
        help="run an operator or function for real here and compare with the estimate",
        description="Import MODULE:FUNCTION (or file.py:FUNCTION): a castcore.register_op operator or any "
        "function of tensors. Capture it on fake tensors, run each distinct operator call for real on "
        "this machine (CUDA when present, else CPU) with the op's input_gen_fn or random inputs, and "
        "print the median measured time against the estimate on --device (e.g. a profile written by "
        "castcore calibrate, passed with --device-file).",
    )
    add_options(parser, MEASURE)
    parser.set_defaults(func=run_measure)

    parser = subparsers.add_parser(
        "calibrate",
        help="measure this machine and write its device profile as TOML",
        description="Measure matmul throughput (fp32, bf16), vector throughput, memory copy bandwidth and per-op "
        "overhead on this machine (CUDA when present, else CPU) and write a device profile whose "
        "sources read 'measurement, <date>, castcore calibrate'.",
    )
    add_options(parser, CALIBRATE)
    parser.set_defaults(func=run_calibrate)
