"""Score castcore's estimate of each kernel gpu_measure.py timed: per family, how far off and which way.

``python bench/kernels/score.py kernels-nvidia-h200-2026-01-01.jsonl [more.jsonl] [--out results/kernels.md]``

Each row is rebuilt as the same torch call on meta tensors (gpu_measure.build) and priced with
``Session.estimate(fn, *inputs, device=profile)``; the error is estimate / measured - 1.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # gpu_measure sits beside this file
import gpu_measure  # noqa: E402

# torch.cuda.get_device_name -> castpack-nvidia's profile
GPU_PROFILES = {
    "NVIDIA H200": "h200-sxm",
    "NVIDIA H100 80GB HBM3": "h100-sxm5-80gb",
    "NVIDIA H100 PCIe": "h100-pcie-80gb",
    "NVIDIA A100-SXM4-80GB": "a100-sxm4-80gb",
    "NVIDIA L40S": "l40s",
    "NVIDIA B200": "b200",
}
WITHIN = 0.20


def load(paths: list[str]) -> list[dict]:
    rows = []
    for path in paths:
        with open(path) as file:
            rows += [json.loads(line) for line in file if line.strip()]
    return rows


def score(
    rows: list[dict], session, device: str | None = None, metric: str = "time_s", eager: bool = False
) -> list[dict]:
    """One result per row: the measured and estimated seconds and the error, or why there is no estimate."""
    import castcore

    results = []
    for row in rows:
        profile = device or GPU_PROFILES.get(row.get("gpu", ""))
        result = {
            "gpu": row.get("gpu"),
            "profile": profile,
            "family": row["family"],
            "point": describe(row),
            **{f: row[f] for f in gpu_measure.SHAPE_FIELDS + ["gqa", "backend"] if f in row},
            "measured_s": row.get(metric),
        }
        if profile is None:
            result["skipped"] = f"no castcore profile for GPU {row.get('gpu')!r}: pass --device"
        elif not result["measured_s"]:
            result["skipped"] = f"no {metric} measured"
        else:
            fn, inputs = gpu_measure.build(row, "meta")
            try:
                # The default (deployed) view rewrites nothing in a plain function, but keeps F.rms_norm whole,
                # as the one kernel CUDA runs; fuse=False prices its eager decomposition instead.
                report = session.estimate(fn, *inputs, device=profile, fuse=not eager)
            except castcore.CastcoreError as exc:
                result["skipped"] = f"castcore refused it: {exc}"
            else:
                result.update(
                    estimated_s=report.time_s,
                    error=report.time_s / result["measured_s"] - 1,
                    ops=[r.invoke.name for r in report.records if r.estimate.time_s > 0],
                )
        results.append(result)
    return results


def describe(row: dict) -> str:
    text = gpu_measure.label(row)
    return f"{text} ({row['layer']})" if "layer" in row else text


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    at = q * (len(ordered) - 1)
    low = int(at)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)


def summarise(results: list[dict]) -> list[dict]:
    """One line per (GPU, family): points, median and p90 |error|, bias, share within 20%, the 5 worst."""
    groups: dict[tuple, list[dict]] = {}
    for r in results:
        groups.setdefault((r["gpu"], r["profile"], r["family"]), []).append(r)
    lines = []
    for (gpu, profile, family), members in groups.items():
        done = [r for r in members if "error" in r]
        errors = [abs(r["error"]) for r in done]
        line = {
            "gpu": gpu,
            "profile": profile,
            "family": family,
            "points": len(done),
            "skipped": len(members) - len(done),
        }
        if done:
            line.update(
                median_abs_error=statistics.median(errors),
                p90_abs_error=quantile(errors, 0.9),
                bias=statistics.median(r["error"] for r in done),
                within_20=sum(e <= WITHIN for e in errors) / len(errors),
                worst=sorted(done, key=lambda r: -abs(r["error"]))[:5],
            )
        lines.append(line)
    return lines


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.2f} us"


def markdown(
    lines: list[dict], results: list[dict], metric: str, eager: bool, fitted: frozenset[str] = frozenset()
) -> str:
    """The tables; a family in ``fitted`` had profile constants fitted on these points, so it is no held-out
    figure."""
    out = [
        "# castcore against measured kernels",
        "",
        f"Measured: `{metric}` ({'CUDA graph replay' if 'graph' in metric else 'CUDA events'}"
        f"{', inputs cycled past L2' if metric.startswith('cold') else ''}, median). "
        f"Error: castcore / measured - 1; bias: the median error. castcore priced each call "
        f"{'eagerly (fuse=False)' if eager else 'in its default view (F.rms_norm as one kernel)'}.",
        "",
    ]
    if fitted:
        out += [
            f"Fitted, not held out: {', '.join(sorted(fitted))} (the profile's constants for them were fitted "
            "on these points); the other families are held out.",
            "",
        ]
    for gpu, profile in dict.fromkeys((line["gpu"], line["profile"]) for line in lines):
        mine = [line for line in lines if (line["gpu"], line["profile"]) == (gpu, profile)]
        out += [
            f"## {gpu} as `{profile}`",
            "",
            "| family | set | points | median \\|error\\| | p90 \\|error\\| | bias | within 20% |",
            "|---|---|---:|---:|---:|---:|---:|",
        ]
        for line in mine:
            kind = "fitted" if line["family"] in fitted else "held out"
            if not line["points"]:
                out.append(f"| {line['family']} | {kind} | 0 ({line['skipped']} skipped) | | | | |")
                continue
            skipped = f" ({line['skipped']} skipped)" if line["skipped"] else ""
            out.append(
                f"| {line['family']} | {kind} | {line['points']}{skipped} | {line['median_abs_error']:.1%} | "
                f"{line['p90_abs_error']:.1%} | {line['bias']:+.1%} | {line['within_20']:.0%} |"
            )
        for line in mine:
            if line["points"]:
                out += [
                    "",
                    f"{line['family']}, the 5 worst:",
                    "",
                    "| point | measured | castcore | error |",
                    "|---|---:|---:|---:|",
                ]
                out += [
                    f"| {r['point']} | {_us(r['measured_s'])} | {_us(r['estimated_s'])} | {r['error']:+.1%} |"
                    for r in line["worst"]
                ]
        out.append("")
    reasons = sorted({r["skipped"] for r in results if "skipped" in r})
    if reasons:
        out += ["Skipped: " + "; ".join(reasons), ""]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", help="JSONL written by gpu_measure.py")
    parser.add_argument("--device", help="castcore profile for every row (default: from each row's GPU name)")
    parser.add_argument("--device-file", action="append", default=[], help="a device profile TOML to load")
    parser.add_argument(
        "--metric", choices=["time_s", "graph_time_s", "cold_time_s", "cold_graph_time_s"], default="time_s"
    )
    parser.add_argument(
        "--fitted", default="", help="comma-separated families the profile was fitted on (labelled so)"
    )
    parser.add_argument("--eager", action="store_true", help="price with fuse=False (F.rms_norm decomposed)")
    parser.add_argument(
        "--out", help="write the tables here as markdown, and the per-point rows beside it as .json"
    )
    args = parser.parse_args(argv)

    import castcore

    session = castcore.Session(device_files=args.device_file)  # one session: plugins load once
    results = score(load(args.files), session, args.device, args.metric, args.eager)
    fitted = frozenset(f for f in args.fitted.split(",") if f)
    text = markdown(summarise(results), results, args.metric, args.eager, fitted)
    print(text)
    if args.out:
        out = Path(args.out).with_suffix(".md")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        out.with_suffix(".json").write_text(json.dumps(results, indent=1) + "\n")
    return 0 if any("error" in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
