"""``castcore cache info|clear``: the captures sweeps keep on disk (castcore.sweeps.store). Torch-free."""

from __future__ import annotations

import argparse
import json

from castcore.cli.options import add_options
from castcore.options.tools import CACHE


def run(args: argparse.Namespace) -> int:
    from castcore.sweeps import store

    if args.action == "clear":
        removed = store.clear()
        print(
            f"removed {removed.captures} captures and {removed.fused} device rewrites "
            f"({removed.bytes / 2**20:,.1f} MiB) from {removed.location}"
        )
        return 0
    found = store.info()
    if args.json:
        print(
            json.dumps(
                {
                    "location": str(found.location),
                    "captures": found.captures,
                    "fused": found.fused,
                    "bytes": found.bytes,
                },
                indent=2,
            )
        )
    else:
        print("\n".join(found.lines()))
    return 0


def add_parser(subparsers) -> None:
    cmd = subparsers.add_parser(
        "cache",
        help="the capture cache sweeps keep on disk: where, how big; clear it",
        description="castcore sweep and castcore plan keep each capture on disk ($XDG_CACHE_HOME/castcore/captures, "
        "else ~/.cache/castcore/captures), keyed by the model and its configuration, the workload, what "
        "the device's packs do before a capture, and castcore's, torch's, transformers' and the packs' "
        "versions, so a later sweep over new devices captures nothing again.",
    )
    add_options(cmd, CACHE)
    cmd.set_defaults(func=run, debug=False)
