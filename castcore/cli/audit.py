"""``castcore audit``: who wins each operator, statically from declared claims or for the ops a model runs."""

from __future__ import annotations

import argparse
import json

from castcore.cli.common import StrictFailure, make_session
from castcore.cli.options import add_options, values
from castcore.options.parts import AXIS
from castcore.options.tools import AUDIT


def run(args: argparse.Namespace) -> int:
    from castcore.plugins import audit
    from castcore.deploy.pipeline import capture_workload

    from castcore.workload.spec import build_workload

    options = {k: v for k, v in values(args, AUDIT, AXIS).items() if k != "model"}
    workload = build_workload(args.model, **options) if args.model else None
    # prints, among the session's notes, claims on device globs that match nothing
    session = make_session(args)
    if workload is not None:
        device = session.device(args.device)
        _, captured = capture_workload(session, workload, device)
        from castcore.plugins.replacements import replacements

        deployed = workload.fuse and workload.named and not workload.train
        rows = audit.dynamic_audit(
            session, captured, device.name, op=args.op, replaces=replacements() if deployed else None
        )
    else:
        devices = [session.device(args.device).name] if args.device else list(session.devices)
        if not devices:
            session.device()  # raises the "no device profiles" error with its fix
        rows = audit.static_audit(session, devices, op=args.op)
    print(
        json.dumps([r.to_dict() for r in rows], indent=2)
        if args.json
        else audit.format_audit(rows, bool(args.model))
    )
    bad = [r for r in rows if r.status in (audit.CONFLICT, audit.UNCOVERED)]
    if session.config.strict and bad:
        raise StrictFailure(f"{len(bad)} CONFLICT/UNCOVERED row(s) and --strict is on")
    return 0


def add_parser(subparsers) -> None:
    aud = subparsers.add_parser(
        "audit",
        help="show which plugin wins each operator, and conflicts, overrides, uncovered ops",
        description="Static (default): every operator any plugin claims, per device, with the candidates in call "
        "order, the winner, the shadowed ones and a status: ok, override (declared override=True), "
        "override (user) (your custom-op file or program wins over a pack) or CONFLICT (two plugins "
        "claim it and neither declares override). With --model: capture that model "
        "and list who answers each operator it runs; ops left to the memory-only fallback are UNCOVERED.",
    )
    add_options(aud, AUDIT)
    aud.set_defaults(func=run)
