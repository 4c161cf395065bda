"""``castcore devices``: the installed device profiles.

Packs ship their profiles as data (entry-point group ``castcore.profiles``). When no custom-op directory
is asked for and every enabled pack is known, from an earlier load of the same version, to compute no
profiles in a ``device_profiles`` hook, this reads that data and any ``--device-file`` without importing a
pack or torch. Otherwise it loads the plugins as every other command does.
"""

from __future__ import annotations

import argparse
import json

from castcore.cli.common import make_session
from castcore.cli.options import add_options
from castcore.options.tools import DEVICES
from castcore.plugins.selection import PluginOptions, profiles_without_plugins


def run(args: argparse.Namespace) -> int:
    devices = profiles_without_plugins(PluginOptions.of(args))
    if devices is None:
        devices = make_session(args).devices
    rows = [
        {
            "name": d.name,
            "vendor": d.vendor,
            "memory_bytes": d.memory_bytes,
            "memory_bandwidth": d.memory_bandwidth,
            "mma_flops": dict(d.mma_flops),
            "interconnect": [lvl.name for lvl in d.interconnect],
            "default": d.default,
            "origin": d.origin,
        }
        for d in devices.values()
    ]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print("no device profiles installed: pip install castpack-ascend, or pass --device-file my.toml")
        return 0
    for row in rows:
        bf16 = row["mma_flops"].get("bfloat16")
        peak = f"bf16 {bf16 / 1e12:7.1f} TFLOP/s" if bf16 else "no bf16 matrix rate"
        print(
            f"{row['name']:<20} {row['vendor']:<10} {row['memory_bytes'] / 2**30:7.1f} GiB  "
            f"{row['memory_bandwidth'] / 1e12:5.2f} TB/s  {peak}"
            f"{'  (default)' if row['default'] else ''}  from {row['origin']}"
        )
    return 0


def add_parser(subparsers) -> None:
    dev = subparsers.add_parser(
        "devices",
        help="list installed device profiles",
        description="List the device profiles installed packs provide, and any --device-file.",
    )
    add_options(dev, DEVICES)
    dev.set_defaults(func=run)
