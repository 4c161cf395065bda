"""The ``castcore`` command."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from . import audit
from .capture import CaptureError, capture
from .config import ConfigError
from .devices import DeviceError, dtype_name
from .estimate import EstimatorError
from .annotations import CustomOpError
from .measure import add_calibrate_parser
from .measure import add_parser as add_measure_parser
from .memory import kv_cache_bytes
from .partition import add_parser as add_partition_parser
from .models import DEFAULT_MODEL, DTYPES, PHASES, ModelError, build_workload, parse_dtype, preset_names
from .newpack import NewPackError, add_parser as add_new_pack_parser
from .parallel import tensor_parallel
from .plot import PlotError, plot_roofline
from .session import Session

USER_ERRORS = (ConfigError, DeviceError, ModelError, CaptureError, EstimatorError, PlotError, NewPackError,
               CustomOpError)


def _plugin_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("plugins and devices")
    group.add_argument("--custom-op-dir", action="append", metavar="DIR",
                       help="load every *.py in DIR as a plugin that beats installed packs (repeatable; "
                            "also CASTCORE_CUSTOM_OP_PATH)")
    group.add_argument("--device-file", action="append", metavar="TOML",
                       help="add a device profile from a TOML file (repeatable); the first is the default device")
    group.add_argument("--no-packs", action="store_true", help="load no installed packs (same as CASTCORE_LOAD_PACKS=)")
    group.add_argument("--strict", action="store_true", default=None,
                       help="fail on any plugin that did not load, and as each command says (also CASTCORE_STRICT=1)")
    group.add_argument("--debug", action="store_true", help="show tracebacks instead of one-line errors")


def _model_options(parser: argparse.ArgumentParser, default_model: str | None) -> None:
    group = parser.add_argument_group("model")
    group.add_argument("--model", default=default_model,
                       help=f"a preset ({', '.join(preset_names())}) or a transformers config.json path"
                            + (f" (default: {default_model})" if default_model else ""))
    group.add_argument("--batch", type=int, default=1, help="sequences per batch (default: 1)")
    group.add_argument("--seq", type=int, default=2048, help="tokens per sequence (default: 2048)")
    group.add_argument("--dtype", default="bf16", choices=sorted(DTYPES), help="weights and activations (default: bf16)")
    group.add_argument("--phase", default="prefill", choices=PHASES,
                       help="prefill: --seq tokens at once; decode: one new token per sequence over a KV cache "
                            "(default: prefill)")
    group.add_argument("--kv-len", type=int, help="tokens already in the KV cache for --phase decode (default: --seq)")
    group.add_argument("--train", action="store_true", help="a training step: forward and backward of the loss")
    group.add_argument("--fuse", action="store_true",
                       help="let packs swap model parts for their fused operators first (as the model would run "
                            "with the device vendor's kernels)")
    group.add_argument("--no-reuse", action="store_true",
                       help="run every one of a model's identical layers on fake tensors instead of capturing one "
                            "and replaying it for the rest (same totals, slower)")
    group.add_argument("--tp", type=int, default=1, metavar="N",
                       help="tensor parallel over N devices (torch's parallelize_module on a fake process group): "
                            "estimate one device's compute, memory and collectives (default: 1)")


class StrictFailure(RuntimeError):
    """--strict turned a reported problem into a failure."""


def _session(args: argparse.Namespace, **extra) -> Session:
    session = Session(custom_op_dirs=args.custom_op_dir, device_files=args.device_file,
                      load_packs=[] if args.no_packs else None, strict=args.strict, **extra)
    for warning in session.warnings:
        print(f"castcore: warning: {warning}", file=sys.stderr)
    if session.config.strict and session.warnings:
        raise StrictFailure(f"{len(session.warnings)} plugin problem(s) above and --strict is on")
    return session


def _progress(count: int) -> None:
    print(f"\rcastcore: {count} op calls captured", end="", file=sys.stderr, flush=True)


def _capture_workload(session: Session, args: argparse.Namespace):
    print(f"castcore: building {args.model} and capturing on fake tensors ...", file=sys.stderr)
    workload = build_workload(args.model, batch=args.batch, seq=args.seq, dtype=args.dtype, phase=args.phase,
                              kv_len=args.kv_len, train=args.train)
    for note in workload.notes:
        print(f"castcore: note: {note}", file=sys.stderr)
    if args.fuse:
        swaps = session.fuse(workload.model, args.device)
        for line in swaps:
            print(f"castcore: fused {line}", file=sys.stderr)
        if not swaps:
            print("castcore: --fuse: no installed pack fused anything for this model and device", file=sys.stderr)
        workload.description += " (fused)" if swaps else ""
    show = _progress if sys.stderr.isatty() else None
    with tensor_parallel(workload, args.tp):
        try:
            captured = capture(workload.model, *workload.args, train=args.train, inputs_fn=workload.inputs_fn,
                               progress=show, reuse=not args.no_reuse, **workload.kwargs)
        except RuntimeError as exc:
            if args.phase == "decode" and "index_copy_" in str(exc):
                # castcore's static cache gives every layer num_key_value_heads x head_dim keys and values.
                raise ModelError(f"{args.model}: its attention writes keys or values of another shape than "
                                 "castcore's decode cache (num_key_value_heads x head_dim per layer), as multi-query "
                                 "and latent (MLA) attention do; --phase decode does not support this model yet: "
                                 "use --phase prefill") from None
            raise
    if show:
        print(file=sys.stderr)
    return workload, captured


def cmd_estimate(args: argparse.Namespace) -> int:
    session = _session(args, on_error=args.on_error)
    device = session.device(args.device)
    started = time.perf_counter()
    workload, captured = _capture_workload(session, args)
    # A prefill fills a KV cache a server must hold; a decode step's cache is already in the capture.
    cache = (kv_cache_bytes(workload.config, args.batch, args.seq, parse_dtype(args.dtype))
             if workload.config and args.phase == "prefill" and not args.train else 0)
    report = session.estimate_capture(captured, device, description=workload.description, kv_cache_bytes=cache)
    print(f"castcore: {len(report.records)} op calls estimated in {time.perf_counter() - started:.1f} s",
          file=sys.stderr)
    for error in dict.fromkeys(session.resolver.errors):
        print(f"castcore: warning: {error} (fell back to the next plugin)", file=sys.stderr)
    if args.json:
        print(report.to_json())
    elif args.csv:
        print(report.to_csv(by=args.by), end="")
    else:
        print(report.format_table(top=args.top, by=args.by))
    if args.trace:
        Path(args.trace).write_text(json.dumps(report.to_trace()), encoding="utf-8")
        print(f"castcore: wrote {len(report.records)} slices to {args.trace} (open it in ui.perfetto.dev)",
              file=sys.stderr)
    if args.plot:
        print(f"castcore: wrote roofline chart {plot_roofline(report, args.plot)}", file=sys.stderr)
    if session.config.strict and session.resolver.errors:
        raise StrictFailure(f"{len(session.resolver.errors)} estimator error(s) and --strict is on")
    fallback = report.coverage()["fallback_ops"]
    if session.config.strict and fallback:
        raise StrictFailure(f"{len(fallback)} op(s) fell back to the memory-only estimate and --strict is on: "
                            f"{', '.join(fallback)}; give them an estimator or op_properties")
    return 0


def cmd_packs(args: argparse.Namespace) -> int:
    session = _session(args)
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


def cmd_audit(args: argparse.Namespace) -> int:
    session = _session(args)
    if args.model:
        device = session.device(args.device).name
        _, captured = _capture_workload(session, args)
        rows = audit.dynamic_audit(session, captured, device, op=args.op)
    else:
        devices = [session.device(args.device).name] if args.device else list(session.devices)
        if not devices:
            session.device()  # raises the "no device profiles" error with its fix
        rows = audit.static_audit(session, devices, op=args.op)
    print(json.dumps([r.to_dict() for r in rows], indent=2) if args.json else audit.format_audit(rows, bool(args.model)))
    bad = [r for r in rows if r.status in (audit.CONFLICT, audit.UNCOVERED)]
    if session.config.strict and bad:
        raise StrictFailure(f"{len(bad)} CONFLICT/UNCOVERED row(s) and --strict is on")
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
    _model_options(est, DEFAULT_MODEL)
    est.add_argument("--device", help="device profile name (castcore devices lists them; default: the "
                                      "configured default_device, else the first profile marked default)")
    est.add_argument("--top", type=int, default=30, help="rows in the table, slowest first (default: 30)")
    out = est.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print the whole report (every op and module row, "
                                                         "totals, coverage) as JSON")
    out.add_argument("--csv", action="store_true", help="print the rows (see --by) and a TOTAL row as CSV")
    est.add_argument("--by", choices=("op", "module"), default="op",
                     help="rows by operator, or by module (layer) that made the calls (default: op)")
    est.add_argument("--trace", metavar="FILE", help="write a Chrome trace (JSON) that Perfetto opens: one slice per op")
    est.add_argument("--plot", metavar="PNG", help="write a roofline chart (needs matplotlib: castcore[plot])")
    est.add_argument("--on-error", choices=("raise", "fallback"), default=None,
                     help="when a plugin raises or answers nonsense: stop (raise, the default) or record it and "
                          "ask the next plugin (fallback)")
    _plugin_options(est)
    est.set_defaults(func=cmd_estimate)

    aud = sub.add_parser(
        "audit", help="show which plugin wins each operator, and conflicts, overrides, uncovered ops",
        description="Static (default): every operator any plugin claims, per device, with the candidates in call "
                    "order, the winner, the shadowed ones and a status: ok, override (declared override=True) or "
                    "CONFLICT (two plugins claim it and neither declares override). With --model: capture that model "
                    "and list who answers each operator it runs; ops left to the memory-only fallback are UNCOVERED.")
    aud.add_argument("--device", help="audit this device only (default: every installed device; with --model, "
                                      "the default device)")
    aud.add_argument("--op", help="only this operator, e.g. aten::mm (every overload) or aten::add.Tensor")
    aud.add_argument("--json", action="store_true", help="print JSON")
    _model_options(aud, None)
    _plugin_options(aud)
    aud.set_defaults(func=cmd_audit)

    packs = sub.add_parser("packs", help="list plugins: packs, custom-op files, their status and claims",
                           description="Every plugin castcore found: the core, installed packs (entry points in "
                                       "group 'castcore') and custom-op files, with status loaded, disabled or "
                                       "failed: <reason>, the hooks each implements and how many ops it claims.")
    packs.add_argument("--json", action="store_true", help="print JSON")
    _plugin_options(packs)
    packs.set_defaults(func=cmd_packs)

    dev = sub.add_parser("devices", help="list installed device profiles",
                         description="List the device profiles installed packs provide, and any --device-file.")
    dev.add_argument("--json", action="store_true", help="print JSON")
    _plugin_options(dev)
    dev.set_defaults(func=cmd_devices)
    add_new_pack_parser(sub)
    add_partition_parser(sub)
    add_measure_parser(sub)
    add_calibrate_parser(sub)
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
    except StrictFailure as exc:
        print(f"castcore: error: {exc}", file=sys.stderr)
        return 1
    except USER_ERRORS as exc:
        if args.debug:
            raise
        print(f"castcore: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
