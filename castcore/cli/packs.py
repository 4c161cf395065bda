"""``castcore packs``: every plugin found (the core, packs, custom-op files), its status, hooks and claims."""

from __future__ import annotations

import argparse
import json

from castcore.cli.common import make_session
from castcore.cli.options import add_options
from castcore.options.tools import PACKS


def _status(info) -> str:
    return f"{info.status}: {info.error}" if info.status in ("failed", "skipped") else info.status


def _directories(session) -> list[str]:
    """Where custom-op files were looked for, first (winning) first, the default places included when absent
    or turned off, so a user learns where the per-user directory lives."""
    from castcore.plugins.config import default_custom_op_locations

    defaults = {path.resolve(): f"{which} default" for which, path in default_custom_op_locations()}
    searched = [d.resolve() for d in session.config.custom_op_dirs]
    lines = [f"  {d} ({defaults.get(d, 'named')})" for d in searched]
    why = "absent" if session.config.default_custom_op_dirs else "turned off"
    lines += [f"  {path} ({which}, {why})" for path, which in defaults.items() if path not in searched]
    return ["custom-op directories, the first wins:", *lines]


def run(args: argparse.Namespace) -> int:
    session = make_session(args)
    infos = session.plugins.infos
    rows = [
        {
            "name": i.name,
            "kind": i.kind,
            "distribution": i.distribution,
            "version": i.version,
            "origin": i.origin,
            "status": _status(i),
            "hooks": i.hooks,
            "claims": len(i.claims),
            "warnings": i.warnings,
            "notes": i.notes,
        }
        for i in infos
    ]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for row in rows:
        who = (
            f"{row['distribution']} {row['version'] or ''}".strip() if row["kind"] == "pack" else row["kind"]
        )
        print(
            f"{row['name']:<14} {who:<28} {row['status']:<10} hooks: {', '.join(row['hooks']) or '-'}; "
            f"{row['claims']} claims; from {row['origin']}"
        )
        for line in row["warnings"] + row["notes"]:
            print(f"{'':<14} {line}")
    print("\n".join(_directories(session)))
    return 0


def add_parser(subparsers) -> None:
    packs = subparsers.add_parser(
        "packs",
        help="list plugins: packs, custom-op files, their status and claims",
        description="Every plugin castcore found: the core, installed packs (entry points in group 'castcore') and "
        "custom-op files, with status loaded, disabled, skipped: <reason> or failed: <reason>, the hooks "
        "each implements and how many ops it claims; then the custom-op directories searched.",
    )
    add_options(packs, PACKS)
    packs.set_defaults(func=run)
