"""The ``castcore`` command: parse, run one subcommand, turn a user's error into one line and exit 2.

Every subcommand module imports torch only inside its run function, so ``--help`` and ``--version`` are quick.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from castcore.cli import audit, devices, estimate, measure, new_pack, packs, partition, serve
from castcore.cli import cache, plan, sweep
from castcore.cli.common import StrictFailure
from castcore.errors import CastcoreError


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("castcore")
    except PackageNotFoundError:
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="castcore",
        description="Estimate how fast a PyTorch model runs on an accelerator you may not have.")
    parser.add_argument("--version", action="version", version=f"castcore {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    estimate.add_parser(sub)
    serve.add_parser(sub)
    audit.add_parser(sub)
    packs.add_parser(sub)
    devices.add_parser(sub)
    new_pack.add_parser(sub)
    partition.add_parser(sub)
    measure.add_parsers(sub)
    sweep.add_parser(sub)
    plan.add_parser(sub)
    cache.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return args.func(args)
    except BrokenPipeError:  # output piped into head & co: not an error
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        print("castcore: interrupted", file=sys.stderr)
        return 130
    except StrictFailure as exc:
        print(f"castcore: error: {exc}", file=sys.stderr)
        return 1
    except CastcoreError as exc:
        if args.debug:
            raise
        print(f"castcore: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
