"""A point's row: its parameters, the figures its estimate gives, ``error`` (one line, or None) and ``seconds``.

estimate rows: ``time_s`` (the report's total), ``step_s`` (the step: the pipeline's under --pp), tokens per
second (a prefill's or training step's batch x seq tokens, a decode step's batch; x --dp replicas) and per
device, FLOPs, bytes, calls, coverage, memory per device, ``fits``. serve rows: ServeReport.to_dict()'s figures
(``ttft_s``, ``tpot_s``, ``latency_s``, ``output_tokens_per_s``, ``output_tokens_per_s_per_device``, memory,
``fits``, ...), the batch served (``served_batch``: the one found under max_batch), FLOPs and bytes of the prefill
and the last decode step, and coverage over every step. simulate rows: vllm bench serve's figures and the engine's
(SimulationReport.to_dict()), requests that never fit, and output tokens/s per device.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from castcore.workload.spec import DEPLOYMENT

if TYPE_CHECKING:
    from castcore.report.records import Report
    from castcore.serving.serve_report import ServeReport
    from castcore.serving.simulation_report import SimulationReport
    from castcore.workload.spec import Workload

# The figures a plot and a plan read, per command: latency, and throughput per device.
LATENCY = {"estimate": "step_s", "serve": "latency_s", "simulate": "median_e2el_s"}
THROUGHPUT = {
    "estimate": "tokens_per_s_per_device",
    "serve": "output_tokens_per_s_per_device",
    "simulate": "output_tokens_per_s_per_device",
}
ESTIMATE = (
    "time_s",
    "step_s",
    "tokens_per_s",
    "tokens_per_s_per_device",
    "devices",
    "flops",
    "bytes",
    "calls",
    "fallback_calls",
    "ops",
    "fallback_ops",
    "fallback_time_share",
    "weight_bytes",
    "input_bytes",
    "kv_cache_bytes",
    "activation_peak_bytes",
    "peak_bytes",
    "device_memory_bytes",
    "fits",
)
# ServeReport.to_dict()'s keys that are parameters, not figures (the row has them as its axes).
_SERVE_PARAMETERS = {
    "model",
    "device",
    "input_tokens",
    "output_tokens",
    "batch",
    "max_batch",
    "price_per_device_hour",
    *DEPLOYMENT,
}


def estimate_figures(report: Report, workload: Workload) -> dict[str, Any]:
    from castcore.serving.serve_report import step_time

    step = step_time(report)
    tokens = workload.batch * (1 if workload.phase == "decode" else workload.seq)
    memory = report.memory
    capacity = int(report.device.memory_bytes)
    coverage = report.coverage()
    figures = {
        "time_s": report.time_s,
        "step_s": step,
        "tokens_per_s": tokens * workload.dp / step if step else None,
        "tokens_per_s_per_device": tokens / step / workload.devices if step else None,
        "devices": workload.devices * workload.dp,
        "flops": report.flops,
        "bytes": report.bytes,
        "calls": len(report.records),
        "fallback_calls": report.fallback_calls,
        "ops": coverage["ops"],
        "fallback_ops": " ".join(coverage["fallback_ops"]),
        "fallback_time_share": coverage["fallback_time_share"],
        "weight_bytes": memory.weight_bytes,
        "input_bytes": memory.input_bytes,
        "kv_cache_bytes": memory.kv_cache_bytes,
        "activation_peak_bytes": memory.activation_peak_bytes,
        "peak_bytes": memory.peak_bytes,
        "device_memory_bytes": capacity,
        "fits": memory.peak_bytes <= capacity,
    }
    return {k: figures[k] for k in ESTIMATE}


def serve_figures(report: ServeReport) -> dict[str, Any]:
    figures = {
        k: v
        for k, v in report.to_dict().items()
        if k not in _SERVE_PARAMETERS and (v is None or isinstance(v, (int, float, str, bool)))
    }
    steps = report.reports()
    last = report.decode[report.kv_points[-1]]
    fallback = sorted({op for step in steps for op in step.coverage()["fallback_ops"]})
    return {
        **figures,
        "served_batch": report.batch,
        "prefill_flops": report.prefill.flops,
        "prefill_bytes": report.prefill.bytes,
        "decode_flops": last.flops,
        "decode_bytes": last.bytes,
        "calls": sum(len(s.records) for s in steps),
        "fallback_calls": sum(s.fallback_calls for s in steps),
        "fallback_ops": " ".join(fallback),
    }


def simulate_figures(
    report: SimulationReport, price: float | None = None, host: Any = None
) -> dict[str, Any]:
    """vllm bench serve's figures and the engine's, per device the output throughput and the median latency in
    seconds (what a plot reads), the energy when every pool's device profile (from ``host``) gives its power, and
    with a price per device-hour the cost (castcore.report.energy)."""
    from castcore.report.energy import simulation_cost, simulation_energy

    data = report.to_dict()
    figures = {
        k: v
        for k, v in data.items()
        if k
        not in (
            "model",
            "device",
            "deployment",
            "engine_limits",
            "engine_overheads",
            "notes",
            "kv_usage",
            "never_fit",
            "rejected",  # counted as "failed"
            "engine",
            "slo_ttft_ms",
            "slo_tpot_ms",  # the point's own parameters
            "steady_state",  # flattened below: a row's values are scalars, for CSV and Parquet
            "kv_capacity",  # its scalars below
        )
    }
    kv = data["kv_capacity"] or {}
    every = sum(use.devices for use in report.pool_use)
    energy = (
        simulation_energy([(host.device(use.device), use) for use in report.pool_use], report.summary)
        if host
        else {}
    )
    return {
        **figures,
        "never_fit": len(report.never_fit),
        "devices": every,
        "median_e2el_s": data["median_e2el_ms"] / 1e3,
        "output_tokens_per_s_per_device": data["output_throughput"] / every,
        "kv_cache_gib": kv.get("kv_cache_gib"),
        "kv_tokens": kv.get("tokens"),
        "kv_concurrent_requests": kv.get("concurrent_requests"),
        **steady_figures(data["steady_state"]),
        **energy,
        **simulation_cost(price, report.pool_use, report.summary),
    }


def steady_figures(steady: dict[str, Any] | None) -> dict[str, Any]:
    """A simulation's steady state (castcore.simulation.steady) as a row's scalars: ``saturated``,
    ``steady_requests``, and per statistic of TTFT and TPOT ``steady_p99_ttft_ms`` with ``..._low`` and ``..._high``,
    its 95% interval; None throughout when the run has no steady window."""
    from castcore.simulation.steady import STATISTICS

    figures: dict[str, Any] = {
        "saturated": None if steady is None else steady["saturated"],
        "steady_requests": None if steady is None else steady["requests"],
    }
    for metric in ("ttft", "tpot"):
        for name in STATISTICS:
            found = None if steady is None or steady[metric] is None else steady[metric][name]
            for i, suffix in enumerate(("", "_low", "_high")):
                figures[f"steady_{name}_{metric}_ms{suffix}"] = None if found is None else found[i]
    return figures


def columns(rows: list[dict[str, Any]], parameters: list[str]) -> list[str]:
    """Every row's keys in one order: the parameters, the figures as they first appear, error, seconds."""
    seen = dict.fromkeys(parameters)
    for row in rows:
        seen.update(dict.fromkeys(k for k in row if k not in ("error", "seconds")))
    return [*seen, "error", "seconds"]


def parameter_key(row: dict[str, Any], parameters: list[str]) -> tuple[str, ...]:
    """A point's identity in any file format: its parameters as text (CSV holds nothing else)."""
    return tuple("" if row.get(p) is None else str(row.get(p)) for p in parameters)
