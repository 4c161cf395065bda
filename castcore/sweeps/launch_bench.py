"""The traffic's side of launch files (castcore.sweeps.launch): the engine's own benchmark client for one traffic
shape, and the castcore simulate command of the same run, whose JSON carries the benchmark's field names."""

from __future__ import annotations

from dataclasses import dataclass

from castcore.options.traffic import SIMULATE
from castcore.simulation.presets import PRESETS, EngineLimits
from castcore.sweeps.launch_server import Deployment

PERCENTILES = "50,90,95,99"  # castcore simulate reports the median, p90, p95 and p99


@dataclass(frozen=True)
class Traffic:
    """Requests of fixed lengths: at ``rate`` per second (gamma gaps of shape ``burstiness``, 1 Poisson), or a
    closed loop of ``concurrency``, or (neither) all at once."""

    input_tokens: int
    output_tokens: int
    requests: int = 500
    rate: float | None = None
    concurrency: int | None = None
    burstiness: float = 1.0
    seed: int = 0


def replica_traffic(traffic: Traffic, replicas: int) -> Traffic:
    """One replica's traffic when castcore's replicas run as separate servers."""
    if replicas == 1:
        return traffic
    return Traffic(
        traffic.input_tokens,
        traffic.output_tokens,
        max(1, traffic.requests // replicas),
        None if traffic.rate is None else traffic.rate / replicas,
        None if traffic.concurrency is None else max(1, traffic.concurrency // replicas),
        traffic.burstiness,
        traffic.seed,
    )


def bench_command(engine: str, model_id: str, traffic: Traffic, result: str, notes: list[str]) -> list[str]:
    lengths = [
        "--random-input-len",
        str(traffic.input_tokens),
        "--random-output-len",
        str(traffic.output_tokens),
    ]
    if traffic.rate is not None:
        arrivals = ["--request-rate", f"{traffic.rate:g}"]
        if traffic.burstiness != 1:
            if engine == "sglang":
                notes.append(
                    "sglang.bench_serving draws Poisson arrivals only: castcore's burstiness "
                    f"{traffic.burstiness:g} has no counterpart there"
                )
            else:
                arrivals += ["--burstiness", f"{traffic.burstiness:g}"]
    elif traffic.concurrency is not None:
        arrivals = ["--request-rate", "inf", "--max-concurrency", str(traffic.concurrency)]
    else:
        arrivals = ["--request-rate", "inf"]
    common = ["--num-prompts", str(traffic.requests), *arrivals, "--seed", str(traffic.seed)]
    percentiles = ["--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", PERCENTILES]
    if engine == "sglang":
        notes.append(
            "sglang.bench_serving appends one JSON line with vllm's ttft, tpot and itl names but "
            "*_e2e_latency_ms for castcore's *_e2el_ms, and no p90 or p95"
        )
        return [
            "python",
            "-m",
            "sglang.bench_serving",
            "--backend",
            "sglang",
            "--model",
            model_id,
            "--dataset-name",
            "random",
            *lengths,
            "--random-range-ratio",
            "1",
            *common,
            "--output-file",
            result,
        ]
    # vllm bench serve and TensorRT-LLM's client take the same flags after their own head
    if engine == "vllm":
        head = ["vllm", "bench", "serve", "--backend", "vllm"]
    else:
        head = ["python", "-m", "tensorrt_llm.serve.scripts.benchmark_serving", "--backend", "openai"]
    head += [
        "--model",
        model_id,
        "--dataset-name",
        "random",
        *(["--random-ids"] if engine == "trtllm" else []),
    ]
    return [
        *head,
        *lengths,
        "--random-range-ratio",
        "0",
        "--ignore-eos",
        *common,
        *percentiles,
        "--save-result",
        "--result-filename",
        result,
    ]


def simulate_command(
    engine: str,
    d: Deployment,
    traffic: Traffic,
    replicas: int,
    limits: EngineLimits,
    castcore_options: list[str],
) -> list[str]:
    argv = [
        "castcore",
        "simulate",
        "--model",
        d.model,
        *(["--device", d.device] if d.device else []),
        "--input",
        str(traffic.input_tokens),
        "--output",
        str(traffic.output_tokens),
        "--requests",
        str(traffic.requests),
    ]
    if traffic.rate is not None:
        gaps = ["--burstiness", f"{traffic.burstiness:g}"] if traffic.burstiness != 1 else []
        argv += ["--rate", f"{traffic.rate:g}", *gaps]
    elif traffic.concurrency is not None:
        argv += ["--concurrency", str(traffic.concurrency)]
    argv += ["--seed", str(traffic.seed), "--engine", engine]
    preset = PRESETS[engine]
    for name in (
        "max_running_requests",
        "max_batched_tokens",
        "block_size",
        "kv_memory_fraction",
        "kv_policy",
        "scheduler_steps",
        "chunked_prefill",
        "mixed_chunk",
    ):
        value = getattr(limits, name)
        if value != getattr(preset, name):
            if isinstance(value, bool):
                shown = "on" if value else "off"
            else:
                shown = value if isinstance(value, str) else f"{value:g}"
            argv += [SIMULATE[name].cli, shown]
    argv += [SIMULATE["enforce_eager"].cli] if limits.enforce_eager else []
    if limits.max_capture_size is not None:
        argv += [SIMULATE["max_capture_size"].cli, str(limits.max_capture_size)]
    argv += ["--dtype", d.dtype] if d.dtype != "bf16" else []
    for name in ("tp", "pp", "ep", "attention_dp"):
        argv += [SIMULATE[name].cli, str(getattr(d, name))] if getattr(d, name) > 1 else []
    argv += ["--dp", str(d.dp)] if d.dp > 1 and replicas == 1 else []
    for name in ("weights", "activations", "kv_cache"):
        argv += [SIMULATE[name].cli, getattr(d, name)] if getattr(d, name) else []
    return [*argv, *castcore_options, "--json"]
