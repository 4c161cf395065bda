"""What a deployed causal LM costs: time to first token, time per output token, latency, throughput, memory.

A request batch is one prefill of ``batch`` x ``input`` tokens, then ``output`` decode steps over KV lengths
``input`` .. ``input + output - 1`` (one new token per sequence each). Every step goes through the pipeline
``castcore estimate`` uses (castcore.deploy.pipeline). The decode steps are captured at a few KV
lengths only: for standard attention a step's cost is affine in the KV length (attention reads and multiplies
every cached token once; nothing else depends on it), so time(kv) = a + b * kv fitted by least squares over
those points and summed over every step in closed form equals stepping every token. The steps are the
kernels' time: an engine's own CPU work and CUDA graphs depend on the engine, and ``castcore simulate`` prices them.

Under ``--pp`` a step's time is the pipeline's (castcore.deploy.parallel.pipeline_stages): TTFT is the GPipe prefill of
``--micro-batches`` micro-batches, (M + N - 1) x the slowest stage + the transfers; a decode step is N stage
times of a micro-batch of batch/N (N micro-batches in flight) + the transfers. ``--dp`` replicas multiply the
system's throughput; every other figure is one replica's, per device.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from castcore.options.catalog import SERVE, say
from castcore.options.option import current_terms
from castcore.report.memory import config_field, format_bytes, language_config
from castcore.report.records import Report, format_seconds
from castcore.deploy.parallel.parallelize import check_interconnect
from castcore.workload.models import load_factory
from castcore.deploy.parallel.pipeline_stages import stage_figures
from castcore.deploy.pipeline import Pipeline
from castcore.serving.serve_report import ServeReport, memory_figures
from castcore.workload.spec import (
    DEFAULT_MODEL,
    DEPLOYMENT,
    ModelError,
    build_workload,
    is_factory,
    load_model_config,
)

if TYPE_CHECKING:
    from castcore.devices.profile import DeviceProfile


def check_request(
    model: Any, input_tokens: Any, output_tokens: Any, batch: Any, **deployment: Any
) -> dict[str, Any] | None:
    """Refuse a request castcore cannot serve, naming the option and its fix; the model's config, when it has one."""
    if not isinstance(model, str):
        raise ModelError(
            "serve builds a model's prefill and decode steps itself: name a preset, a config.json or "
            f"package.module:factory (got {type(model).__name__})"
        )
    for name, value, what in (
        ("input_tokens", input_tokens, "prompt tokens per request"),
        ("output_tokens", output_tokens, "tokens each request generates"),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ModelError(f"{say(name, value)}: must be a whole number of at least 1, the {what}")
    if batch != "max" and (isinstance(batch, bool) or not isinstance(batch, int) or batch < 1):
        largest = say("batch", "max") if current_terms() == "python" else say("max_batch", True)
        raise ModelError(
            f"{say('batch', batch)}: must be a whole number of at least 1, the requests served "
            f"together; or use {largest}"
        )
    # The model and the deployment options as estimate checks them.
    build_workload(model, seq=input_tokens, batch=1 if batch == "max" else batch, **deployment)
    if is_factory(model):
        load_factory(model)  # a factory that cannot be imported fails here, before any capture or search
        return None
    config = language_config(load_model_config(model))
    context = config_field(config, "max_position_embeddings")
    if isinstance(context, int):
        if input_tokens >= context:
            shorter = say("input_tokens", max(context - output_tokens, 1))
            raise ModelError(
                f"{say('input_tokens', input_tokens)} is longer than {model}'s context of {context} "
                f"tokens (max_position_embeddings): use {shorter} or less, leaving room for "
                f"{say('output_tokens', output_tokens)}"
            )
        if input_tokens + output_tokens > context:
            raise ModelError(
                f"{say('input_tokens', input_tokens)} + {say('output_tokens', output_tokens)} tokens "
                f"exceed {model}'s context of {context} (max_position_embeddings): use "
                f"{say('output_tokens', context - input_tokens)} or less"
            )
    return config


def decode_points(input_tokens: int, output_tokens: int) -> list[int]:
    """The KV lengths whose decode steps are captured: the first, middle and last of the request."""
    last = input_tokens + output_tokens - 1
    return sorted({input_tokens, input_tokens + (output_tokens - 1) // 2, last})


def fit_line(points: dict[int, float]) -> tuple[float, float]:
    """Least-squares (a, b) of time = a + b * kv; one point gives a flat line."""
    n = len(points)
    mean_x, mean_y = sum(points) / n, sum(points.values()) / n
    spread = sum((x - mean_x) ** 2 for x in points)
    b = sum((x - mean_x) * (y - mean_y) for x, y in points.items()) / spread if spread else 0.0
    return mean_y - b * mean_x, b


def serve(
    pipeline: Pipeline,
    model: str = DEFAULT_MODEL,
    *,
    input_tokens: int = 2048,
    output_tokens: int = 256,
    batch: int | str = 1,
    device: str | DeviceProfile | None = None,
    price_per_device_hour: float | None = None,
    **deployment: Any,
) -> ServeReport:
    """Serving figures for ``batch`` requests of ``input_tokens`` + ``output_tokens``; ``batch="max"`` takes the
    largest batch whose memory fits the device (see ``largest_batch``); ``price_per_device_hour`` adds the cost."""
    price = SERVE["price_per_device_hour"].check(price_per_device_hour)
    config = check_request(model, input_tokens, output_tokens, batch, **deployment)
    profile = pipeline.host.device(device)
    check_interconnect(
        profile, build_workload(model, seq=input_tokens, batch=1 if batch == "max" else batch, **deployment)
    )
    reports: dict[tuple, Report] = {}  # each step is captured once, however often the batch search asks

    def step(batch_size: int, kv_len: int | None = None) -> Report:
        key = (batch_size, kv_len)
        if key not in reports:
            workload = build_workload(
                model,
                batch=batch_size,
                seq=input_tokens,
                kv_len=kv_len,
                phase="prefill" if kv_len is None else "decode",
                **deployment,
            )
            try:
                reports[key] = pipeline.run(workload, profile)
            except ModelError as exc:
                if kv_len is None:
                    raise
                # The batch's prefill is always captured first, so what fails here is the decode step's own.
                raise ModelError(f"serving needs decode steps, and {exc}") from None
        return reports[key]

    points = decode_points(input_tokens, output_tokens)
    found = ""
    if batch == "max":
        batch, found = largest_batch(
            lambda b: memory_figures(step(b), step(b, points[-1]))["peak_bytes"], int(profile.memory_bytes)
        )
    batch = int(batch)  # "max" is a number now
    prefill = step(batch)
    missing = [kv for kv in points if (batch, kv) not in reports]
    if missing:  # the decode steps share one built, fused and sharded model
        workload = build_workload(
            model, batch=batch, seq=input_tokens, kv_len=missing[0], phase="decode", **deployment
        )
        try:
            done = pipeline.run_decode_steps(workload, missing, profile)
        except ModelError as exc:
            raise ModelError(f"serving needs decode steps, and {exc}") from None
        reports.update({(batch, kv): r for kv, r in done.items()})
    decode = {kv: step(batch, kv) for kv in points}
    report = ServeReport(
        model=model,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        batch=batch,
        deployment={k: (prefill.workload or {})[k] for k in DEPLOYMENT},
        prefill=prefill,
        decode=decode,
        fit=(0.0, 0.0),
        max_batch=found,
        price_per_device_hour=price,
    )
    report.fit = fit_line({kv: report.tpot_at(kv) for kv in decode})
    report.notes = _notes(report, config)
    return report


def largest_batch(peak_at: Callable[[int], int], capacity: int) -> tuple[int, str]:
    """The largest batch whose peak memory fits ``capacity``, and a line saying how it was found.

    Memory grows by a fixed amount per sequence (its KV cache and activations), so peak(batch) = fixed + batch x
    per_sequence, fitted from captures at batch 1 and 2; bisection finds the largest batch that model fits, and
    captures at that batch and the next confirm it (stepping by one where the peak op moved by a few bytes)."""
    one, two = peak_at(1), peak_at(2)
    if one > capacity:
        largest = say("batch", "max") if current_terms() == "python" else say("max_batch", True)
        raise ModelError(
            f"{largest}: even batch 1 needs {format_bytes(one)} of {format_bytes(capacity)} per "
            f"device; use a larger {say('tp')} or a shorter {say('input_tokens')}/{say('output_tokens')}"
        )
    per_sequence = max(two - one, 1)
    fixed = one - per_sequence
    low, high = 1, 2  # bisect between a batch that fits the model and one that does not
    while fixed + high * per_sequence <= capacity:
        low, high = high, high * 2
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fixed + middle * per_sequence <= capacity else (low, middle)
    while low > 1 and peak_at(low) > capacity:
        low -= 1
    while peak_at(low + 1) <= capacity:
        low += 1
    return low, (
        f"{low}: bisection over peak(batch) = {format_bytes(fixed)} + batch x {format_bytes(per_sequence)} "
        f"(fitted from batch 1 and 2), confirmed by capturing batch {low} (fits) and {low + 1} (does not)"
    )


def _notes(report: ServeReport, config: dict[str, Any] | None) -> list[str]:
    """How the figures were made, and where they do not hold."""
    points = report.kv_points
    a, b = report.fit
    notes = [
        f"TPOT: decode steps captured at KV lengths {', '.join(map(str, points))} and fitted as "
        f"{format_seconds(a)} + {format_seconds(b) if b >= 1e-6 else f'{b * 1e9:.3f} ns'} per cached token, "
        f"summed over KV "
        f"{report.input_tokens}..{report.input_tokens + report.output_tokens - 1} (exact when every op's time "
        "is affine in the KV length, as standard attention's is on the roofline)"
    ]
    residual = max(abs(report.tpot_at(kv) - (a + b * kv)) / report.tpot_at(kv) for kv in points)
    if residual > 1e-9:
        notes.append(
            f"the captured decode steps are not affine in the KV length (largest residual "
            f"{residual * 100:.2g}% of a step): TPOT is a least-squares fit, not exact"
        )
    window = config_field(config, "sliding_window") if config is not None else None
    if isinstance(window, int) and config_field(config, "use_sliding_window") is not False:
        last = points[-1]
        notes.append(
            f"{report.model} sets sliding_window = {window}: its sliding-window layers read at most {window} "
            f"cached tokens, so a step's cost is affine in the KV length only up to {window}; "
            + (
                f"this request's KV lengths (to {last}) stay within it"
                if last <= window
                else f"this request's KV lengths (to {last}) pass it, so the fit is an approximation"
            )
        )
    notes.append(
        "throughput is one static batch (batch x output tokens over the request latency), not continuous "
        "batching; latency counts output decode steps after the prefill (TTFT + output x TPOT)"
        + (f"; x {report.deployment['dp']} replicas (--dp)" if report.deployment["dp"] > 1 else "")
    )
    staged, last_stage = stage_figures(report.prefill), stage_figures(report.decode[points[-1]])
    if staged is not None and last_stage is not None:
        notes.append(
            f"--pp {staged.stages}: layers per stage {staged.layers}; prefill {staged.formula}; decode at KV "
            f"{points[-1]}: {last_stage.formula}"
        )
    prefill, *decode = report.reports()  # the pipeline's per-step lines are summed up above
    notes += [line for line in prefill.notes if line not in notes and not line.startswith("--pp ")]
    for step in decode:  # a decode step's own line (its kernels include the cache writes) says whose it is
        notes += [
            f"decode steps: {line}"
            for line in step.notes
            if line not in prefill.notes
            and f"decode steps: {line}" not in notes
            and not line.startswith("--pp ")
        ]
    return notes
