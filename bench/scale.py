"""castcore at scale: its estimate against a bare fake-tensor capture and torch's FlopCounterMode.

For each model (a subprocess each, so peak RSS is that model's), in one process and one run
each, each run starting with torch's shared fake-tensor dispatch cache emptied (as in a fresh
process), in this order: castcore's estimate (repeated-layer reuse on), castcore's estimate with
reuse off, a bare capture with reuse off (no estimation), and FlopCounterMode over the same
model on fake tensors. Writes wall times, ratios, op calls per second and peak RSS to JSON and
prints a table.

    python bench/scale.py --out bench-results/scale.json [--models llama-3-8b llama-3-70b] [--seq 2048]
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).parent


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def _timed(fn):
    # torch's fake-tensor dispatch cache is shared by every FakeTensorMode: empty it so each run
    # starts cold, as a user's fresh process does, whatever ran before it.
    from torch._subclasses.fake_tensor import FakeTensorMode

    FakeTensorMode.cache_clear()
    started = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - started


def measure(model_name: str, seq: int, device_file: str) -> dict:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.flop_counter import FlopCounterMode

    import castcore
    from castcore.models import build_workload

    session = castcore.Session(load_packs=[], device_files=[device_file])
    workload = build_workload(model_name, seq=seq)
    rows: dict[str, dict] = {}

    def estimate(reuse: bool):
        captured = castcore.capture(workload.model, reuse=reuse, **workload.kwargs)
        return session.estimate_capture(captured)

    report, seconds = _timed(lambda: estimate(True))
    rows["castcore estimate"] = {"seconds": seconds, "calls": len(report.records), "flops": report.flops,
                                 "peak_rss_mib": _rss_mib()}
    session.resolver._estimates.clear()  # the no-reuse run resolves from scratch too
    session.resolver._properties.clear()
    report_full, seconds = _timed(lambda: estimate(False))
    rows["castcore estimate --no-reuse"] = {"seconds": seconds, "calls": len(report_full.records),
                                            "flops": report_full.flops, "peak_rss_mib": _rss_mib()}
    captured, seconds = _timed(lambda: castcore.capture(workload.model, reuse=False, **workload.kwargs))
    rows["bare capture (no reuse)"] = {"seconds": seconds, "calls": len(captured.invokes), "flops": None,
                                       "peak_rss_mib": _rss_mib()}
    del captured

    def flop_counter():
        with FakeTensorMode(allow_non_fake_inputs=True):
            state = {n: torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cpu")
                     for n, t in (*workload.model.named_parameters(), *workload.model.named_buffers())}
            ids = torch.zeros(workload.kwargs["input_ids"].shape, dtype=torch.long)
            with torch.no_grad(), FlopCounterMode(display=False) as counter:
                torch.func.functional_call(workload.model, state, (), {"input_ids": ids, "use_cache": False})
        return counter.get_total_flops()

    flops, seconds = _timed(flop_counter)
    rows["FlopCounterMode"] = {"seconds": seconds, "calls": None, "flops": flops, "peak_rss_mib": _rss_mib()}
    for row in rows.values():
        row["calls_per_s"] = row["calls"] / row["seconds"] if row["calls"] else None
    return {
        "model": model_name, "seq": seq, "rows": rows,
        "totals_identical_with_reuse": (report.time_s, report.flops, report.memory.peak_bytes)
        == (report_full.time_s, report_full.flops, report_full.memory.peak_bytes),
        "estimate_over_bare_capture": rows["castcore estimate --no-reuse"]["seconds"]
        / rows["bare capture (no reuse)"]["seconds"] - 1,
        "flopcounter_over_estimate": rows["FlopCounterMode"]["seconds"] / rows["castcore estimate"]["seconds"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["llama-3-8b", "llama-3-70b"])
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--out", default="bench-results/scale.json")
    parser.add_argument("--device-file", default=str(HERE.parent / "tests" / "data" / "h100-sxm.toml"))
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: measure one model in this process
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.one, args.seq, args.device_file)))
        return
    results = []
    for model in args.models:
        done = subprocess.run([sys.executable, __file__, "--one", model, "--seq", str(args.seq), "--device-file",
                               args.device_file], capture_output=True, text=True, check=True)
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": platform.platform(), "python": platform.python_version(),
                               "results": results}, indent=2))
    for result in results:
        print(f"\n{result['model']} prefill {result['seq']} tokens")
        print(f"{'':32} {'seconds':>8} {'calls':>7} {'calls/s':>9} {'peak RSS MiB':>13}")
        for name, row in result["rows"].items():
            print(f"{name:32} {row['seconds']:8.2f} {row['calls'] or '':>7} "
                  f"{row['calls_per_s'] or 0:9.0f} {row['peak_rss_mib']:13.0f}")
        print(f"estimation over bare capture: {result['estimate_over_bare_capture']:+.1%}; "
              f"FlopCounterMode / castcore estimate: {result['flopcounter_over_estimate']:.1f}x; "
              f"totals identical with reuse: {result['totals_identical_with_reuse']}")
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
