"""Continuous-batching points (category ``simulate``): ``castcore.simulate`` run as the source's deployment ran.

Each point names the model, device, TP/DP, dtypes, request lengths (fixed, or a distribution for a dataset), the
request count, the arrivals (all at once for an offline maximum-throughput run, a Poisson rate, or a closed loop of
a given concurrency) and the engine whose documented defaults the source's framework ran with (TensorRT-LLM and
NIM -> ``trtllm``, vLLM -> ``vllm``, SGLang -> ``sglang``), plus any engine limit the source states
(``workload.engine_limits``). The estimate is read from the SimulationReport's ``summary`` under the vLLM
``--save-result`` name the point's ``workload.metric`` gives (``output_throughput``, ``mean_ttft_ms``,
``median_itl_ms``, ...), in the source's unit; an output throughput is compared per GPU or for the whole system as
``measured.per`` says.

Request counts are capped (``MAX_REQUESTS`` per data-parallel replica) so each point simulates in seconds to a
minute; a point whose source ran more says so in its notes. Points read from one run of the source (TTFT, ITL and
throughput of one table row) share one simulation. A model's rest runs in its config's ``torch_dtype`` unless the
source states another (``workload.dtype``); an FP8 weight format is fp8 weights with fp8 GEMM inputs; a KV dtype
the source does not state is left at the model dtype, and said so.

A mixture-of-experts deployment states its expert and attention parallelism as castcore's options do
(``workload.ep``, ``workload.attention_dp``: TensorRT-LLM's and SGLang's DP attention over ``tp`` x ``attention_dp``
devices, ``workload.ep_kernels``, ``workload.expert_skew``), speculation as ``workload.spec_tokens`` with
``acceptance`` and ``draft_model`` (``mtp``: the model's own MTP layers), and disaggregation as
``prefill_instances``, ``decode_instances`` and their ``prefill_deployment`` / ``decode_deployment``; each is
passed to ``castcore.simulate`` as given. The request cap counts every attention data-parallel group as a replica,
and a per-GPU throughput divides by every device the run used (both pools when disaggregated).
"""

from __future__ import annotations

import json
import os
from typing import Any

from fidelity.ops import NotExpressible
from fidelity.serving import MODEL_FILES, MODELS, SHORT_DTYPE, quantized_dtypes

# workload.metric -> (unit, family); the family is what the report's continuous-batching summary groups by.
METRICS = {
    "output_throughput": ("tokens/s", "output throughput"),
    "mean_ttft_ms": ("ms", "TTFT"),
    "median_ttft_ms": ("ms", "TTFT"),
    "p99_ttft_ms": ("ms", "TTFT"),
    "mean_itl_ms": ("ms", "ITL/TPOT"),
    "median_itl_ms": ("ms", "ITL/TPOT"),
    "p99_itl_ms": ("ms", "ITL/TPOT"),
    "mean_tpot_ms": ("ms", "ITL/TPOT"),
    "median_tpot_ms": ("ms", "ITL/TPOT"),
    "p99_tpot_ms": ("ms", "ITL/TPOT"),
}
FAMILIES = ("output throughput", "TTFT", "ITL/TPOT")
# workload fields passed to castcore.simulate as given: expert and attention parallelism, speculation, disaggregation
PASSED = (
    "ep",
    "attention_dp",
    "ep_kernels",
    "expert_skew",
    "spec_tokens",
    "acceptance",
    "draft_model",
    "prefill_instances",
    "decode_instances",
    "prefill_deployment",
    "decode_deployment",
)
MAX_REQUESTS = 1500  # per data-parallel replica
SEED = 0
_RUNS: dict[str, Any] = {}  # one simulation per distinct set of options and device, shared by its points


def family(metric: str) -> str:
    return METRICS[metric][1]


def _lengths(w: dict[str, Any], name: str) -> str | None:
    fixed = w.get(f"{name}_tokens")
    return str(fixed) if fixed is not None else w.get(f"{name}_lengths")


def plan_simulate(point: dict[str, Any]) -> dict[str, Any] | NotExpressible:
    """``castcore.simulate`` keyword arguments, the metric and notes, or why the point is not expressible."""
    w = point["workload"]
    if w["model"] not in MODEL_FILES:
        return NotExpressible(f"no config shipped under bench/fidelity/models/ for {w['model']}")
    if w.get("metric") not in METRICS:
        return NotExpressible(f"metric {w.get('metric')!r} is none of {', '.join(METRICS)}")
    inputs, outputs = _lengths(w, "input"), _lengths(w, "output")
    if inputs is None or outputs is None:
        return NotExpressible("the source gives neither fixed lengths nor a length distribution")
    path = MODELS / MODEL_FILES[w["model"]]
    config = json.loads(path.read_text(encoding="utf-8"))
    dp = w.get("dp", 1)
    options: dict[str, Any] = {
        "model": os.path.relpath(path),
        "dtype": w.get("dtype") or SHORT_DTYPE[config["torch_dtype"]],
        "tp": w.get("tp", 1),
        "pp": w.get("pp", 1),
        "dp": dp,
        "engine": w["engine"],
        "seed": SEED,
    }
    notes: list[str] = []
    refused = quantized_dtypes(w, options, notes)
    if refused is not None:
        return refused
    passed = {k: w[k] for k in PASSED if w.get(k) is not None}
    options.update(passed)
    requests = min(w["requests"], MAX_REQUESTS * dp * w.get("attention_dp", 1))
    if requests < w["requests"]:
        notes.append(f"{requests:,} of the source's {w['requests']:,} requests simulated")
    options.update(requests=requests, input_lengths=inputs, output_lengths=outputs)
    if w.get("rate") is not None:
        options["rate"] = w["rate"]
    if w.get("concurrency") is not None:
        options["concurrency"] = w["concurrency"]
    limits = dict(w.get("engine_limits") or {})
    options.update(limits)
    arrivals = (
        f"rate {w['rate']}/s"
        if w.get("rate") is not None
        else f"concurrency {w['concurrency']}"
        if w.get("concurrency") is not None
        else "offline"
    )
    deploy = ", ".join(
        f"{k} {v}"
        for k, v in options.items()
        if k in ("tp", "pp", "dp", "weights", "kv_cache", *PASSED) and v not in (1, None)
    )
    describe = (
        f"simulate {path.stem} {w['engine']}, {requests} requests {inputs} in + {outputs} out, {arrivals}"
        + (f", {deploy}" if deploy else "")
        + "".join(f", {k} {'on' if v is True else 'off' if v is False else v}" for k, v in limits.items())
    )
    return {"options": options, "metric": w["metric"], "notes": notes, "describe": describe}


def _gpus(options: dict[str, Any], report=None) -> int:
    """Every device the run used: the report's count when disaggregated, else tp x pp x attention_dp x dp."""
    devices = (report.summary.get("devices") if report is not None else None) or (
        options.get("tp", 1) * options.get("pp", 1) * options.get("attention_dp", 1) * options.get("dp", 1)
    )
    return int(devices)


def estimate_simulate(session, profile, point: dict[str, Any], plan: dict[str, Any]) -> dict[str, Any]:
    """Run (or reuse) the simulation and read the point's metric in its unit and per what it counts."""
    options = plan["options"]
    key = json.dumps([profile.name, options], sort_keys=True)
    shared = key in _RUNS
    if not shared:
        try:
            _RUNS[key] = session.simulate(device=profile, **options)
        except ValueError as exc:  # castcore.simulation.metrics.summarize when no request finished: say so
            _RUNS[key] = exc
    if isinstance(_RUNS[key], ValueError):
        from castcore.workload.spec import ModelError

        raise ModelError(
            f"castcore.simulate failed: ValueError: {_RUNS[key]} (simulate(device={profile.name!r}, "
            + ", ".join(f"{k}={v!r}" for k, v in options.items())
            + "))"
        )
    report = _RUNS[key]
    summary = report.summary
    metric = plan["metric"]
    value = summary[metric]
    if metric == "output_throughput" and point["measured"].get("per") == "device":
        value /= _gpus(options, report)
    notes = list(plan["notes"])
    if summary.get("preemptions"):
        notes.append(f"{summary['preemptions']} preemptions")
    if report.never_fit:
        notes.append(f"{len(report.never_fit)} request(s) never fit the KV cache")
    if summary.get("completed") != options["requests"]:
        notes.append(f"{summary.get('completed')} of {options['requests']} requests completed")
    how = {
        "kv_blocks": report.kv_blocks,
        "block_size": report.limits.block_size,
        "mean_running_batch": report.mean_running,
        "iterations": report.iterations,
        "duration_s": summary.get("duration"),
        "output_throughput": summary.get("output_throughput"),
        "mean_ttft_ms": summary.get("mean_ttft_ms"),
        "median_itl_ms": summary.get("median_itl_ms"),
        "mean_tpot_ms": summary.get("mean_tpot_ms"),
        "shared_run": shared,
    }
    return {"estimated": value, "estimated_s": summary.get("duration"), "notes": notes, "how": how}
