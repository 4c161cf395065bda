"""``castcore packs``: every plugin found (the core, packs, custom-op files), its status, hooks and claims."""

from __future__ import annotations

import argparse
import json

from castcore.cli.common import add_plugin_options, make_session


def run(args: argparse.Namespace) -> int:
    session = make_session(args)
    rows = [{"name": i.name, "kind": i.kind, "distribution": i.distribution, "version": i.version,
             "origin": i.origin, "status": i.status if i.status != "failed" else f"failed: {i.error}",
             "hooks": i.hooks, "claims": len(i.claims)} for i in session.plugins.infos]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for row in rows:
        who = f"{row['distribution']} {row['version'] or ''}".strip() if row["kind"] == "pack" else row["kind"]
        print(f"{row['name']:<14} {who:<28} {row['status']:<10} hooks: {', '.join(row['hooks']) or '-'}; "
              f"{row['claims']} claims; from {row['origin']}")
    return 0


def add_parser(subparsers) -> None:
    packs = subparsers.add_parser(
        "packs", help="list plugins: packs, custom-op files, their status and claims",
        description="Every plugin castcore found: the core, installed packs (entry points in group 'castcore') and "
                    "custom-op files, with status loaded, disabled or failed: <reason>, the hooks each implements "
                    "and how many ops it claims.")
    packs.add_argument("--json", action="store_true", help="print JSON")
    add_plugin_options(packs)
    packs.set_defaults(func=run)
