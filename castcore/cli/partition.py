"""``castcore partition``: the legal splits of a register_op operator over N devices, with estimates."""

from __future__ import annotations

import argparse

from castcore.cli.common import add_plugin_options, make_session
from castcore.devices.dtypes import TENSOR_DTYPES


def add_input_options(parser: argparse.ArgumentParser) -> None:
    """--input, --arg and --dtype: the example call of an operator (also used by ``castcore measure``)."""
    parser.add_argument("--input", action="append", default=[], metavar="SPEC",
                        help="one positional argument, in order: a tensor 4096x1024 or 4096x1024:bf16, 'scalar', "
                             "'none', or a literal such as 0.5; a bare 8 is a tensor of 8 elements, so pass integers "
                             "with --arg (repeatable)")
    parser.add_argument("--arg", action="append", default=[], metavar="NAME=VALUE",
                        help="a named argument, e.g. h=8 for a hidden dim (h t); numbers stay numbers, a tensor "
                             "is written 4096x1024[:dtype] (repeatable)")
    parser.add_argument("--dtype", default="bf16", choices=sorted(TENSOR_DTYPES),
                        help="dtype of tensors given without one (default: bf16)")


def run(args: argparse.Namespace) -> int:
    from castcore.optools.partition import example_inputs, load_target, partition

    session = make_session(args)
    record = load_target(args.op)
    values, kwargs = example_inputs(record, args.input, args.arg, args.dtype)
    plan = partition(record, *values, ways=args.ways, session=session, device=args.device, **kwargs)
    print(plan.to_json() if args.json else plan.format_table())
    return 0


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "partition", help="list the legal splits of a register_op operator over N devices, with estimates",
        description="Import MODULE:FUNCTION (or file.py:FUNCTION), a function registered with "
                    "castcore.register_op, and split each of its named dims --ways ways: legal or not and why, "
                    "each device's shapes and estimated time, and for '+' dims the all_reduce that completes the "
                    "partial sums (timed by castpack-collectives when installed, else shown as unestimated).")
    parser.add_argument("op", metavar="OP", help="module:function or path/to/file.py:function")
    parser.add_argument("--ways", type=int, required=True, help="number of devices to split over")
    add_input_options(parser)
    parser.add_argument("--device", help="device profile (default: the default device)")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    add_plugin_options(parser)
    parser.set_defaults(func=run)
