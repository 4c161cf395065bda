"""A stock transformers model passed as a module: castcore.estimate against torch's FlopCounterMode.

The model is what a user builds: ``AutoModelForCausalLM.from_config`` on the meta device, default
attention ("sdpa") and ``use_cache=True``, called with ``input_ids`` alone. In one process, every
path first runs once untimed on the same model with a short sequence (so imports and torch's lazy
set-up fall on no timed run), then each runs once, timed, with torch's fake-tensor dispatch cache
and castcore's estimate cache emptied, in this order:

  castcore.estimate(model, input_ids)   the model prepared as a preset (castcore's attention path,
                                        use_cache=False, so repeated layers are replayed)
  castcore, model as given              castcore.capture of the model unprepared (use_cache=True, a
                                        DynamicCache through every layer), then estimation: the path
                                        before castcore/workload/own_models.py, less the pipeline around it
  castcore preset                       the same config as a preset, with every position's logits
                                        (--all-logits), as the stock call computes them
  FlopCounterMode                       torch.utils.flop_counter over the model as given, on fake tensors

FLOPs are compared with the preset's. FlopCounterMode counts matmul and attention FLOPs only, and
on fake CPU tensors not even attention (it has no formula for SDPA's CPU kernel); castcore counts
every op, and causal attention over half the query-key pairs. Sessions load no packs and use the
--device-file profile; the preset is built in the model's dtype, so its records match op for op.

    python bench/stock.py [--model llama-3-70b] [--seq 2048] [--out bench/results/stock.json]
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

import figures  # bench/figures.py and bench/scale.py: this script runs with bench/ on its path
from scale import Paths, _cold

HERE = Path(__file__).parent
TARGET = 5.0  # FlopCounterMode seconds over castcore.estimate seconds, at least


def _stock_model(spec: str):
    """The model a user builds from the config: transformers' defaults, on the meta device."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from castcore.workload.spec import load_model_config

    fields = {k: v for k, v in load_model_config(spec).items() if not k.startswith("_")}
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config).eval()


def measure(spec: str, seq: int, warmup_seq: int, device_file: str) -> dict:
    import torch

    import castcore
    from castcore.workload.models import BuiltModel
    from castcore.workload.spec import build_workload

    session = castcore.Session(load_packs=[], device_files=[device_file])
    model = _stock_model(spec)
    settings = (model.config._attn_implementation, model.config.use_cache)
    dtype = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[model.dtype]

    def paths(tokens: int) -> dict:
        input_ids = torch.zeros((1, tokens), dtype=torch.long)
        as_given = Paths(BuiltModel(model=model, args=(input_ids,)), session)
        return {
            "castcore.estimate(model, input_ids)": lambda: session.estimate(model, input_ids).flops,
            "castcore, model as given": lambda: session.estimate_capture(as_given.capture(reuse=True)).flops,
            "castcore preset": lambda: (
                session.estimate(build_workload(spec, seq=tokens, dtype=dtype, all_logits=True)).flops
            ),
            "FlopCounterMode": as_given.flop_counter,
        }

    for run in paths(warmup_seq).values():
        run()
    rows: dict[str, dict] = {}
    for name, run in paths(seq).items():
        session.resolver.clear_cache()
        _cold()
        gc.collect()
        started = time.perf_counter()
        flops = run()
        rows[name] = {"seconds": time.perf_counter() - started, "flops": flops}
    preset = rows["castcore preset"]["flops"]
    for row in rows.values():
        row["flops_over_preset"] = row["flops"] / preset
    return {
        "model": spec,
        "seq": seq,
        "model_class": type(model).__name__,
        "dtype": dtype,
        "rows": rows,
        "flopcounter_over_estimate": rows["FlopCounterMode"]["seconds"]
        / rows["castcore.estimate(model, input_ids)"]["seconds"],
        "settings_restored": (model.config._attn_implementation, model.config.use_cache) == settings,
    }


def _markdown(result: dict, machine: dict) -> str:
    speedup = result["flopcounter_over_estimate"]
    lines = [
        "# A stock transformers model passed to castcore.estimate",
        "",
        f"{machine['date']}, {machine['machine']}, {machine['cpus']} CPUs, Python {machine['python']}",
        "",
        f"## {result['model_class']} from {result['model']}, meta device, {result['dtype']}, "
        f"batch 1, {result['seq']} tokens",
        "",
        "| run | seconds | TFLOPs | FLOPs / preset's |",
        "|---|---:|---:|---:|",
    ]
    lines += [
        f"| {name} | {row['seconds']:.3f} | {row['flops'] / 1e12:.3f} | {row['flops_over_preset']:.4f} |"
        for name, row in result["rows"].items()
    ]
    lines += [
        "",
        f"- FlopCounterMode / castcore.estimate: {speedup:.1f}x (target at least {TARGET:.0f}x: "
        f"{'met' if speedup >= TARGET else 'MISSED'})",
        f"- the model's attention implementation and use_cache unchanged afterwards: "
        f"{result['settings_restored']}",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model", default="llama-3-70b", help="a preset name or a transformers config.json path"
    )
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument(
        "--warmup-seq", type=int, default=16, help="sequence length of the untimed warm-up runs"
    )
    parser.add_argument("--out", default="bench/results/stock.json")
    parser.add_argument("--device-file", default=str(HERE.parent / "tests" / "data" / "h100-sxm.toml"))
    args = parser.parse_args()
    from castcore.workload.spec import ModelError

    try:
        result = measure(args.model, args.seq, args.warmup_seq, args.device_file)
    except ModelError as exc:  # a bad --model: one line; anything else keeps its traceback
        sys.exit(str(exc))
    figures.write(
        args.out,
        {"target_flopcounter_over_estimate": TARGET, "result": result},
        lambda machine: _markdown(result, machine),
    )


if __name__ == "__main__":
    main()
