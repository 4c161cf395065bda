"""castcore serve against AIConfigurator's static mode (aiconfigurator 0.12.0 with its data wheel
aiconfigurator-core, SGLang backend: tables of SGLang 0.5.14) on the same static batches.

    python bench/peers_static.py [--quick] [--out bench/results/peers_static.json]

Each scenario is one static batch: B requests of 1024 prompt and 256 output tokens, prefilled together then decoded
together; each tool gives its TTFT (the batch's prefill) and its mean TPOT over the 256 steps. Models: Qwen3-235B-A22B
(fp8 in 128x128 blocks, as its -FP8 checkpoint), Qwen3-30B-A3B, DeepSeek-V3 (fp8 blocks, as shipped) and three dense
ones (Llama-3.1-8B, -70B, Qwen3-32B), on an H200 SXM and a B200, batches 1, 16 and 64, at the layouts the rows name
(MoE models: EP equal to TP, as AIConfigurator's moe_ep_size; castcore --ep). castcore runs its defaults (deployed
kernels, routing by the power law fitted for the model's family); AIConfigurator runs its own (its power-law
routing: exponent 1.2 for Qwen3, 1.01 for DeepSeek, the same law and fits). This is the MoE-decode comparison of the project's issue on mixture-of-experts decode run where this
project may run it: on AIConfigurator's SGLang tables, not its TensorRT-LLM ones, which are held out.

Only the peer's outputs for these scenarios are kept (bench/results/peers_static.json); nothing of its tables is
copied and no castcore constant is fitted to them. ``nox -s peers_static`` installs the peer and runs this.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

import figures  # bench/figures.py: this script runs with bench/ on its path
from peers_serving import quiet  # AIConfigurator's logging and prints kept off the output

PEERS = {"aiconfigurator": "0.12.0", "aiconfigurator-core": "0.12.0"}
BACKEND = ("sglang", "0.5.14")
ISL, OSL = 1024, 256
# castcore preset: (AIConfigurator model, mixture of experts, castcore --weights)
MODELS = {
    "qwen3-235b-a22b": ("Qwen/Qwen3-235B-A22B-FP8", True, "fp8-block"),
    "qwen3-30b-a3b": ("Qwen/Qwen3-30B-A3B", True, None),
    "deepseek-v3": ("deepseek-ai/DeepSeek-V3", True, "fp8-block"),
    "llama-3.1-8b": ("meta-llama/Meta-Llama-3.1-8B", False, None),
    "llama-3.1-70b": ("meta-llama/Meta-Llama-3.1-70B", False, None),
    "qwen3-32b": ("Qwen/Qwen3-32B", False, None),
}
LAYOUTS = {  # tensor parallel sizes (EP the same for MoE models)
    "qwen3-235b-a22b": (8,),
    "qwen3-30b-a3b": (1, 4),
    "deepseek-v3": (8,),
    "llama-3.1-8b": (1,),
    "llama-3.1-70b": (4,),
    "qwen3-32b": (2,),
}
DEVICES = {"h200-sxm": "h200_sxm", "b200": "b200_sxm"}
BATCHES = (1, 16, 64)


def scenarios(quick: bool) -> list[dict]:
    if quick:
        return [
            {"model": "qwen3-30b-a3b", "device": "h200-sxm", "tp": 1, "batch": 16},
            {"model": "llama-3.1-8b", "device": "h200-sxm", "tp": 1, "batch": 1},
        ]
    return [
        {"model": model, "device": device, "tp": tp, "batch": batch}
        for model in MODELS
        for device in DEVICES
        for tp in LAYOUTS[model]
        for batch in BATCHES
    ]


def castcore_run(s: dict) -> dict:
    import castcore

    _, moe, weights = MODELS[s["model"]]
    options = {"batch": s["batch"], "input_tokens": ISL, "output_tokens": OSL, "tp": s["tp"]}
    if moe and s["tp"] > 1:
        options["ep"] = s["tp"]
    if weights:
        options["weights"] = weights
    report = castcore.serve(s["model"], device=s["device"], **options)
    return {"ttft_ms": report.ttft_s * 1e3, "tpot_ms": report.tpot_s * 1e3}


def aiconfigurator_run(s: dict) -> dict:
    from aiconfigurator.cli.api import cli_estimate

    name, moe, _ = MODELS[s["model"]]
    with quiet():
        result = cli_estimate(
            name,
            DEVICES[s["device"]],
            mode="static",
            backend_name=BACKEND[0],
            backend_version=BACKEND[1],
            isl=ISL,
            osl=OSL,
            batch_size=s["batch"],
            tp_size=s["tp"],
            **({"moe_ep_size": s["tp"]} if moe else {}),
        )
    row = result.summary.get_summary_df().iloc[0].to_dict()
    return {"ttft_ms": float(row["ttft"]), "tpot_ms": float(row["tpot"])}


def run(s: dict, tool) -> dict:
    try:
        return tool(s)
    except Exception as exc:  # noqa: BLE001 - the reason goes in the table
        return {"error": f"{type(exc).__name__}: {str(exc)[:160]}"}


def summary(rows: list[dict]) -> dict:
    """Per family (MoE, dense) and metric: the median castcore/AIConfigurator ratio and median |ratio - 1|."""
    found: dict = {}
    for family in ("moe", "dense"):
        for metric in ("tpot_ms", "ttft_ms"):
            ratios = [
                r["castcore"][metric] / r["aiconfigurator"][metric]
                for r in rows
                if r["moe"] == (family == "moe") and metric in r["castcore"] and metric in r["aiconfigurator"]
            ]
            if ratios:
                found[f"{family} {metric[:-3].upper()}"] = {
                    "scenarios": len(ratios),
                    "median_ratio": statistics.median(ratios),
                    "median_abs_deviation": statistics.median(abs(x - 1) for x in ratios),
                    "min": min(ratios),
                    "max": max(ratios),
                }
    return found


def markdown(result: dict, machine: dict) -> str:
    v = result["versions"]
    lines = [
        "# castcore serve against AIConfigurator's static mode",
        "",
        f"castcore {v['castcore']}, AIConfigurator {v['aiconfigurator']} (aiconfigurator-core "
        f"{v['aiconfigurator-core']}, {BACKEND[0]} backend, tables of SGLang {BACKEND[1]}); {machine['machine']}, "
        f"{machine['cpus']} CPUs, Python {machine['python']}, {machine['date']}; {result['seconds']:.0f} s. "
        "`nox -s peers_static` (or `python bench/peers_static.py` beside the peer).",
        "",
        f"One static batch a row: B requests of {ISL} prompt and {OSL} output tokens. TTFT is the batch's prefill, "
        "TPOT the mean decode step. castcore runs its defaults (deployed kernels, routing by its family's power "
        "law, exponent 1.2 for Qwen3 and 1.01 for DeepSeek); AIConfigurator its own (the same law and exponents). "
        "Ratios are "
        "castcore / AIConfigurator.",
        "",
        "| family | metric | scenarios | median ratio | median \\|ratio - 1\\| | range |",
        "|---|---|---:|---:|---:|---|",
    ]
    for key, s in result["summary"].items():
        family, metric = key.split(" ")
        lines.append(
            f"| {family} | {metric} | {s['scenarios']} | {s['median_ratio']:.3f} | "
            f"{s['median_abs_deviation']:.3f} | {s['min']:.2f}-{s['max']:.2f} |"
        )
    lines += [
        "",
        "| scenario | castcore TTFT (ms) | AIC TTFT (ms) | ratio | castcore TPOT (ms) | AIC TPOT (ms) | ratio |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        c, a = r["castcore"], r["aiconfigurator"]
        if "error" in c or "error" in a:
            lines.append(f"| {r['label']} | {c.get('error') or a.get('error')} | | | | | |")
            continue
        lines.append(
            f"| {r['label']} | {c['ttft_ms']:,.1f} | {a['ttft_ms']:,.1f} | {c['ttft_ms'] / a['ttft_ms']:.2f} | "
            f"{c['tpot_ms']:.2f} | {a['tpot_ms']:.2f} | {c['tpot_ms'] / a['tpot_ms']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="two small scenarios only (a smoke test)")
    parser.add_argument(
        "--out",
        help="where to write the JSON (and the .md beside it); default bench/results/peers_static.json, or "
        "the temp directory with --quick",
    )
    args = parser.parse_args()
    out = args.out or (
        Path(tempfile.gettempdir()) / "peers-static-quick.json"
        if args.quick
        else "bench/results/peers_static.json"
    )
    versions = figures.peer_versions(PEERS, "bench/peers_static.py", "peers_static")
    versions["castcore"] = metadata.version("castcore")
    rows, started = [], time.perf_counter()
    todo = scenarios(args.quick)
    for i, s in enumerate(todo, 1):
        ep = f" EP{s['tp']}" if MODELS[s["model"]][1] and s["tp"] > 1 else ""
        row = {
            **s,
            "moe": MODELS[s["model"]][1],
            "label": f"{s['model']} {s['device']} TP{s['tp']}{ep} b{s['batch']}",
        }
        row["castcore"], row["aiconfigurator"] = run(s, castcore_run), run(s, aiconfigurator_run)
        rows.append(row)
        print(
            f"[{i}/{len(todo)}] {row['label']} ({time.perf_counter() - started:.0f} s)",
            file=sys.stderr,
            flush=True,
        )
    result = {"versions": versions, "backend": list(BACKEND), "isl": ISL, "osl": OSL, "rows": rows}
    result["seconds"] = time.perf_counter() - started
    result["summary"] = summary(rows)
    figures.write(out, result, lambda machine: markdown(result, machine))
    if any("error" in row["castcore"] for row in rows):
        sys.exit("bench/peers_static.py: castcore failed on some scenarios (see the table)")


if __name__ == "__main__":
    main()
