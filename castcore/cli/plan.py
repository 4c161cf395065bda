"""``castcore plan``: the best deployments of a model for a traffic shape and latency objectives, over the
installed devices (castcore.sweeps.plan); and ``castcore.plan(...)``, the same from Python."""

from __future__ import annotations

import argparse
import json
import math
import re
from typing import Any

from castcore.cli.common import add_dtype_argument, add_plugin_options, make_session, note
from castcore.cli.sweep import commands, session_options
from castcore.workload.spec import WEIGHT_DTYPES, ModelError

_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6}
NONE_MEETS = 3  # the exit status when no layout fits and meets the objectives (plan --help says so)


def duration(text: Any, option: str) -> float:
    """Seconds from ``1s``, ``50ms``, ``200us`` or a plain number of seconds: above zero and finite."""
    if isinstance(text, (int, float)) and not isinstance(text, bool) and 0 < text < math.inf:
        return float(text)
    found = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e-?[0-9]+)?)\s*(s|ms|us|µs)?\s*", str(text))
    seconds = float(found.group(1)) * _UNITS[found.group(2) or "s"] if found else 0.0
    if not 0 < seconds < math.inf:
        raise ModelError(f"{option} {text!r}: give a time above zero such as 1s, 50ms, 200us or 0.5 (seconds)")
    return seconds


def plan(model: str, *, input_tokens: int = 2048, output_tokens: int = 256, ttft: Any = None, tpot: Any = None,
         devices: list[str] | None = None, max_devices: int = 8, top: int = 5, tp: list[int] | None = None,
         pp: list[int] | None = None, weights: list[str] | tuple[str, ...] = ("bf16", "int8"), dtype: str = "bf16",
         workers: int | None = None, backend: str = "local", ray_address: str | None = None,
         device_files: list[str] | None = None, packs: bool = True, progress: bool | None = False) -> Any:
    """The best deployments of ``model`` for requests of ``input_tokens`` + ``output_tokens`` (a PlanResult:
    ``best`` rows by output tokens/s per device that fit and meet ``ttft``/``tpot`` (seconds, or "50ms"),
    ``fewest`` devices that fit per device). See ``castcore plan --help``."""
    plugins = argparse.Namespace(custom_op_dir=None, device_file=device_files, no_packs=not packs, strict=None,
                                 no_default_custom_op_dirs=False)
    return _plan(plugins, model, input_tokens, output_tokens, ttft, tpot, devices, max_devices, top, tp, pp,
                 list(weights), dtype, workers, backend, ray_address, progress)


def _plan(plugins: argparse.Namespace, model: str, input_tokens: int, output_tokens: int, ttft: Any, tpot: Any,
          devices: list[str] | None, max_devices: int, top: int, tp: list[int] | None, pp: list[int] | None,
          weights: list[str], dtype: str, workers: int | None, backend: str, ray_address: str | None,
          progress: bool | None) -> Any:
    from castcore.sweeps.plan import PlanRequest, plan as search
    from castcore.sweeps.run import backend_for, run_points
    from castcore.sweeps.work import Settings
    from castcore.workload.serving import check_request

    for option, value in (("--max-devices", max_devices), ("--top", top), ("--workers", workers or 1),
                          *(("--tp", v) for v in tp or ()), *(("--pp", v) for v in pp or ())):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ModelError(f"{option} must be a whole number of at least 1 (got {value!r})")
    for kind in weights:
        if kind not in WEIGHT_DTYPES:
            raise ModelError(f"--weights {kind!r} is not supported; use some of {', '.join(WEIGHT_DTYPES)}")
    check_request(model, input_tokens, output_tokens, 1, dtype=dtype)  # the model and the request, as serve does
    request = PlanRequest(model=model, input_tokens=input_tokens, output_tokens=output_tokens,
                          ttft_s=None if ttft is None else duration(ttft, "--ttft"),
                          tpot_s=None if tpot is None else duration(tpot, "--tpot"), max_devices=max_devices,
                          top=top, tp=tp, pp=pp, dtype=dtype,
                          weights=list(dict.fromkeys(None if w == dtype else w for w in weights)))
    session = make_session(plugins)
    for name in devices or ():
        session.device(name)  # an unknown device fails here, naming the installed ones
    request.devices = list(devices or session.devices)
    if not request.devices:
        session.device(None)  # none installed: says how to install one
    settings = Settings(session=session_options(plugins), cwd=_cwd())
    serve = commands()["serve"]
    with backend_for(backend, workers, settings, ray_address) as runner:
        return search(request, serve, session.devices, lambda points: run_points(
            points, serve.axes(), settings, runner=runner, progress=progress))


def _cwd() -> str:
    import os

    return os.getcwd()


def _seconds(value: float) -> str:
    from castcore.report.records import format_seconds

    return format_seconds(value)


def _layout(row: dict[str, Any], dtype: str) -> str:
    parts = [f"{k} {row[k]}" for k in ("tp", "pp", "ep") if row[k] > 1] or ["1 device"]
    return " x ".join(parts) + f", {row['weights'] or dtype} weights"


def format_plan(result: Any) -> str:
    from castcore.report.memory import format_bytes

    request = result.request
    slos = [f"TTFT <= {_seconds(request.ttft_s)}"] if request.ttft_s else []
    slos += [f"TPOT <= {_seconds(request.tpot_s)}"] if request.tpot_s else []
    lines = [f"{request.model}: requests of {request.input_tokens} input + {request.output_tokens} output tokens"
             + (f", {' and '.join(slos)}" if slos else ", no latency objective"),
             f"searched {result.layouts} layouts on {', '.join(request.devices)} ({len(result.rows)} serve points, "
             f"{len(result.refused)} layouts refused or not fitting at batch 1) in {result.seconds:.1f} s", ""]
    if result.best:
        header = ("#", "device", "devices", "layout", "batch", "TTFT", "TPOT", "tok/s/device", "peak/device")
        cells = [(str(n), r["device"], str(r["devices"]), _layout(r, request.dtype), str(r["served_batch"]),
                  _seconds(r["ttft_s"]), _seconds(r["tpot_s"]), f"{r['output_tokens_per_s_per_device']:,.1f}",
                  format_bytes(r["peak_bytes"])) for n, r in enumerate(result.best, 1)]
        widths = [max(len(row[i]) for row in [header, *cells]) for i in range(len(header))]
        lines.append(f"best {len(result.best)} by output tokens/s per device (fit in memory"
                     + (", meet the objectives)" if slos else ")"))
        lines += ["  ".join(c.ljust(w) if i in (1, 3) else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
                  .rstrip() for row in [header, *cells]]
    else:
        lines.append("no layout fits and meets the objectives: relax --ttft/--tpot, raise --max-devices, or add "
                     "--weights int4")
    if result.refused:
        lines += ["", "refused or not fitting at batch 1 (layouts: reason)"]
        reasons: dict[str, list[str]] = {}
        for row in result.refused:
            reasons.setdefault(row["error"], []).append(f"{row['device']} {_layout(row, request.dtype)}")
        lines += [f"  {'; '.join(where)}: {why if len(why) <= 200 else why[:197] + '...'}"
                  for why, where in reasons.items()]
    lines.append("")
    if result.fewest:
        lines.append("fewest devices that fit at all")
        lines += [f"  {r['device']}: {r['devices']} device{'s' if r['devices'] > 1 else ''} "
                  f"({_layout(r, request.dtype)}), up to batch {r['served_batch']}" for r in result.fewest]
    else:
        lines.append(f"no layout of at most {request.max_devices} devices holds even batch 1: raise --max-devices")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    note(f"planning {args.model}: serve points at each layout's largest batch, then smaller batches where an "
         "objective is missed ...")
    result = _plan(args, args.model, args.input, args.output, args.ttft, args.tpot, args.device, args.max_devices,
                   args.top, args.tp, args.pp, args.weights, args.dtype, args.workers, args.backend, args.ray_address,
                   None)
    if args.json:
        keep = ("device", "devices", "tp", "pp", "ep", "weights", "served_batch", "ttft_s", "tpot_s", "latency_s",
                "output_tokens_per_s", "output_tokens_per_s_per_device", "peak_bytes", "device_memory_bytes")
        print(json.dumps({"model": args.model, "input_tokens": args.input, "output_tokens": args.output,
                          "ttft_s": result.request.ttft_s, "tpot_s": result.request.tpot_s,
                          "devices": result.request.devices, "layouts": result.layouts, "points": len(result.rows),
                          "best": [{k: r[k] for k in keep} for r in result.best],
                          "fewest": [{k: r[k] for k in keep} for r in result.fewest]}, indent=2))
    else:
        print(format_plan(result))
    return 0 if result.best else NONE_MEETS


def add_parser(subparsers) -> None:
    cmd = subparsers.add_parser(
        "plan", help="which device, parallel layout, weights and batch serve a model best, and the fewest devices",
        description="Search the installed devices (or --device), tensor/pipeline/expert parallel layouts, weight "
                    "dtypes and batches for serving --model with requests of --input + --output tokens: print the "
                    "best by output tokens/s per device that fit in memory and meet --ttft/--tpot, and the fewest "
                    "devices that fit at all. Runs castcore serve points through the sweep machinery (and its "
                    "capture cache).",
        epilog=f"Exit status: 0 when a layout fits and meets the objectives; {NONE_MEETS} when none does (the "
               "output says what to relax); 2 for bad input (an option, a model that cannot be built, an unknown "
               "device).")
    group = cmd.add_argument_group("request")
    group.add_argument("--model", required=True, help="a preset, a transformers config.json, or package.module:factory")
    group.add_argument("--input", type=int, default=2048, metavar="N", help="prompt tokens per request (default: 2048)")
    group.add_argument("--output", type=int, default=256, metavar="N",
                       help="tokens generated per request (default: 256)")
    group.add_argument("--ttft", metavar="TIME", help="time to first token at most TIME (1s, 500ms)")
    group.add_argument("--tpot", metavar="TIME", help="time per output token at most TIME (50ms)")
    add_dtype_argument(group)
    search = cmd.add_argument_group("search")
    search.add_argument("--device", nargs="+", metavar="NAME", help="devices to search (default: every installed one)")
    search.add_argument("--max-devices", type=int, default=8, metavar="N", help="devices in one replica at most "
                                                                                "(default: 8)")
    search.add_argument("--tp", type=int, nargs="+", metavar="N", help="tensor parallel sizes (default: the divisors "
                                                                       "of the attention heads within a node)")
    search.add_argument("--pp", type=int, nargs="+", metavar="N", help="pipeline stages (default: 1, and more beyond "
                                                                       "a node's tensor parallelism)")
    search.add_argument("--weights", nargs="+", default=["bf16", "int8"], metavar="DTYPE",
                        help=f"weight dtypes ({', '.join(WEIGHT_DTYPES)}; default: bf16 int8)")
    search.add_argument("--top", type=int, default=5, metavar="K", help="deployments to print (default: 5)")
    search.add_argument("--workers", type=int, metavar="N", help="local worker processes (default: the CPU count)")
    search.add_argument("--backend", choices=("local", "ray"), default="local", help="local processes or Ray tasks")
    search.add_argument("--ray-address", metavar="ADDR", help="the Ray cluster (default: RAY_ADDRESS, else local)")
    cmd.add_argument("--json", action="store_true", help="print the best and the fewest as JSON")
    add_plugin_options(cmd)
    cmd.set_defaults(func=run)
