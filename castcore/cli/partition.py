"""``castcore partition``: the legal splits of a register_op operator over N devices, with estimates."""

from __future__ import annotations

import argparse

from castcore.cli.common import make_session
from castcore.cli.options import add_options
from castcore.options.tools import PARTITION


def run(args: argparse.Namespace) -> int:
    from castcore.operator_tools.command_line_op import example_inputs, load_target
    from castcore.operator_tools.partition import partition

    session = make_session(args)
    record = load_target(args.op)
    values, kwargs = example_inputs(record, args.input, args.arg, args.dtype)
    plan = partition(record, *values, ways=args.ways, session=session, device=args.device, **kwargs)
    print(plan.to_json() if args.json else plan.format_table())
    return 0


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "partition",
        help="list the legal splits of a register_op operator over N devices, with estimates",
        description="Import MODULE:FUNCTION (or file.py:FUNCTION), a function registered with "
        "castcore.register_op, and split each of its named dims --ways ways: legal or not and why, "
        "each device's shapes and estimated time, and for '+' dims the all_reduce that completes the "
        "partial sums (timed by castpack-collectives when installed, else shown as unestimated).",
    )
    add_options(parser, PARTITION)
    parser.set_defaults(func=run)
