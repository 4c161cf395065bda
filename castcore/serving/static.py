"""What a deployed causal LM costs: time to first token, time per output token, latency, throughput, memory.

A request batch is one prefill of ``batch`` x ``input`` tokens, then ``output`` decode steps over KV lengths
``input`` .. ``input + output - 1`` (one new token per sequence each). Every step goes through the pipeline
``castcore estimate`` uses (castcore.deploy.pipeline). The decode steps are captured at a few KV
lengths only: for standard attention a step's cost is affine in the KV length (attention reads and multiplies
every cached token once; nothing else depends on it), so time(kv) = a + b * kv fitted by least squares over
those points and summed over every step in closed form equals stepping every token.

Under ``--pp`` a step's time is the pipeline's (castcore.deploy.parallel.pipeline_stages): TTFT is the GPipe prefill of
``--micro-batches`` micro-batches, (M + N - 1) x the slowest stage + the transfers; a decode step is N stage
times of a micro-batch of batch/N (N micro-batches in flight) + the transfers. ``--dp`` replicas multiply the
system's throughput; every other figure is one replica's, per device.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from castcore.options.catalog import SERVE, say
from castcore.options.option import current_terms
from castcore.report.energy import PhaseTime, busy_s, cost_figures, energy_figures, fitted_sum, format_lines
from castcore.report.memory import config_field, format_bytes, language_config
from castcore.report.records import Report, format_seconds
from castcore.deploy.parallel.parallelize import check_interconnect
from castcore.deploy.parallel.layout import Layout
from castcore.workload.models import load_factory
from castcore.deploy.pipeline import Pipeline
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


@dataclass
class ServeReport:
    """Serving figures for one batch of identical requests on one device (per device under tensor parallelism).

    ``prefill`` is the batch's prefill Report, ``decode`` the decode step's Report at each captured KV length;
    ``fit`` is (a, b) of time(kv) = a + b * kv over them. Memory is at the longest context: weights, a KV cache
    of ``input + output`` tokens per sequence, and the larger activation peak of the prefill and the last step.
    """

    model: str
    input_tokens: int
    output_tokens: int
    batch: int
    deployment: dict[
        str, Any
    ]  # build_workload's deployment options (dtype, fuse, weights, tp, ep, pp, dp, ...)
    prefill: Report
    decode: dict[int, Report]
    fit: tuple[float, float]
    notes: list[str] = field(default_factory=list)
    max_batch: str = ""  # how the batch was found, when it was asked for as "max"
    price_per_device_hour: float | None = None  # dollars a device-hour, for the cost figures

    def energy_and_cost(self) -> dict[str, Any]:
        """Energy (when the profile gives power numbers) and cost (with a price) of one batch on every replica
        (castcore.report.energy): the prefill's device time is the input tokens', the decode's the output's."""
        tokens = self.deployment["dp"] * self.batch
        decode_busy = fitted_sum(
            {kv: busy_s(r) for kv, r in self.decode.items()}, self.input_tokens, self.output_tokens
        )
        return {
            **energy_figures(
                self.device,
                self.devices,
                PhaseTime(self.ttft_s, busy_s(self.prefill), tokens * self.input_tokens),
                PhaseTime(self.decode_s, decode_busy, tokens * self.output_tokens),
            ),
            **cost_figures(
                self.price_per_device_hour,
                self.devices,
                self.ttft_s,
                self.decode_s,
                tokens * self.input_tokens,
                tokens * self.output_tokens,
            ),
        }

    @property
    def dtype(self) -> str:
        return self.deployment["dtype"]

    @property
    def tp(self) -> int:
        return self.deployment["tp"]

    @property
    def devices(self) -> int:
        """Every device of the deployment: tensor or expert parallel x pipeline stages x replicas."""
        d = self.deployment
        return max(d["tp"], d["ep"]) * d["pp"] * d["dp"]

    @property
    def device(self) -> DeviceProfile:
        return self.prefill.device

    @property
    def layout(self) -> Layout:
        d = self.deployment
        return Layout(
            tp=d["tp"], sp=d["sp"], ep=d["ep"], pp=d["pp"], micro_batches=d["micro_batches"], dp=d["dp"]
        )

    @property
    def ttft_s(self) -> float:
        return step_time(self.prefill)

    @property
    def decode_s(self) -> float:
        """Every decode step of the request, the fit summed over kv = input .. input + output - 1."""
        a, b = self.fit
        n, first = self.output_tokens, self.input_tokens
        return n * a + b * (n * first + n * (n - 1) / 2)

    @property
    def tpot_s(self) -> float:
        return self.decode_s / self.output_tokens

    def tpot_at(self, kv_len: int) -> float:
        """The captured step's time at a captured KV length (first, middle, last)."""
        return step_time(self.decode[kv_len])

    @property
    def kv_points(self) -> list[int]:
        return sorted(self.decode)

    @property
    def latency_s(self) -> float:
        return self.ttft_s + self.decode_s

    @property
    def output_tokens_per_s(self) -> float:
        """The system's: every replica (--dp) serves a batch like this one at once."""
        return self.deployment["dp"] * self.batch * self.output_tokens / self.latency_s

    def memory(self) -> dict[str, Any]:
        return memory_figures(self.prefill, self.decode[self.kv_points[-1]])

    def reports(self) -> list[Report]:
        return [self.prefill, *(self.decode[kv] for kv in self.kv_points)]

    def to_dict(self) -> dict[str, Any]:
        points = self.kv_points
        return {
            "model": self.model,
            "device": self.device.name,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "batch": self.batch,
            **self.deployment,
            "devices": self.devices,
            "ttft_s": self.ttft_s,
            "tpot_s": self.tpot_s,
            "first_tpot_s": self.tpot_at(points[0]),
            "middle_tpot_s": self.tpot_at(points[len(points) // 2]),
            "last_tpot_s": self.tpot_at(points[-1]),
            "decode_s": self.decode_s,
            "latency_s": self.latency_s,
            "output_tokens_per_s": self.output_tokens_per_s,
            "output_tokens_per_s_per_device": self.output_tokens_per_s / self.devices,
            **self.memory(),
            **self.energy_and_cost(),
            "decode_points": [{"kv_len": kv, "time_s": self.tpot_at(kv)} for kv in points],
            "tpot_fit": {"a_s": self.fit[0], "b_s_per_token": self.fit[1]},
            "max_batch": self.max_batch or None,
            **self._pipeline(),
            "notes": self.notes,
        }

    def _pipeline(self) -> dict[str, Any]:
        """Under --pp: the prefill's stage times and bubble, and each captured decode step's stage times."""
        staged = getattr(self.prefill, "pipeline", None)
        if staged is None:
            return {}
        return {
            "pipeline": {
                "stages": staged.stages,
                "layers_per_stage": staged.layers,
                "micro_batches": staged.micro_batches,
                "prefill_stage_times_s": staged.stage_times_s,
                "prefill_bubble_s": staged.bubble_s,
                "transfer_s": staged.transfer_s,
                "transfer_bytes": staged.transfer_bytes,
                "decode_micro_batches_in_flight": self.decode[self.kv_points[0]].pipeline.micro_batches,
                "decode_stage_times_s": [
                    {"kv_len": kv, "stage_times_s": self.decode[kv].pipeline.stage_times_s}
                    for kv in self.kv_points
                ],
            }
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)

    @property
    def kernels(self) -> str:
        """The dtypes and the kernel view, as the first line says them: "bf16, int8 weights, fp8 KV cache"."""
        d = self.deployment
        parts = [d["dtype"]]
        if d.get("weights"):
            parts.append(f"{d['weights']} weights" + (" and activations" if d.get("activations") else ""))
        if d.get("kv_cache"):
            parts.append(f"{d['kv_cache']} KV cache")
        if d.get("kv_reads") == "head":
            parts.append("K/V read per query head")
        parts.append("deployed kernels" if d.get("fuse", True) else "eager")
        return ", ".join(parts)

    def format_text(self) -> str:
        points, mem = self.kv_points, self.memory()
        layout = self.layout
        parallel = f", {layout.describe()} (figures per device)" if self.devices > 1 else ""
        steps = ", ".join(
            f"{name} {format_seconds(self.tpot_at(kv))} (KV {kv})"
            for name, kv in (("first", points[0]), ("middle", points[len(points) // 2]), ("last", points[-1]))
        )
        capacity = mem["device_memory_bytes"]
        lines = [
            f"{self.model} serving {self.batch} requests of {self.input_tokens} input + {self.output_tokens} output "
            f"tokens, {self.kernels}, on {self.device.name}{parallel}",
            "",
            f"TTFT         {format_seconds(self.ttft_s)}  (prefill of {self.batch} x {self.input_tokens} tokens"
            + (f" in {layout.micro_batches} micro-batches over {layout.pp} stages" if layout.pp > 1 else "")
            + ")",
            f"TPOT         {format_seconds(self.tpot_s)}  (mean of {self.output_tokens} steps; {steps})",
            f"latency      {format_seconds(self.latency_s)}  (TTFT + {self.output_tokens} decode steps)",
            f"throughput   {self.output_tokens_per_s:,.1f} output tokens/s, {self.output_tokens_per_s / self.devices:,.1f} "
            f"per device ({self.devices} device{'s' if self.devices > 1 else ''}"
            + (f", {layout.dp} replicas" if layout.dp > 1 else "")
            + ")",
            "",
            f"memory per device at the longest context ({self.input_tokens + self.output_tokens} tokens)",
            f"weights      {format_bytes(mem['weight_bytes'])}",
            f"KV cache     {format_bytes(mem['kv_cache_bytes'])}",
            f"activations  {format_bytes(mem['activation_bytes'])}",
            f"free         {format_bytes(mem['free_bytes'])}",
            f"peak         {format_bytes(mem['peak_bytes'])} of {format_bytes(capacity)} "
            f"({mem['peak_bytes'] / capacity:.1%}): {'fits' if mem['fits'] else 'does NOT fit'}",
        ]
        if self.max_batch:
            lines.append(f"max batch    {self.max_batch}")
        more = format_lines(self.energy_and_cost())
        return "\n".join(lines + ([""] + more if more else []))


def step_time(report: Report) -> float:
    """A step's time: the pipeline's under --pp (TTFT or TPOT, see castcore.deploy.parallel.pipeline_stages), else the report's."""
    staged = getattr(report, "pipeline", None)
    return staged.step_s if staged is not None else report.time_s


def memory_figures(prefill: Report, last_step: Report) -> dict[str, Any]:
    """Bytes per device a batch needs: the KV cache is static, allocated for the whole request from the prefill
    on (as the last decode step holds it), and activations (with the inputs) peak in one phase or the other."""
    prefill_mem, step_mem = prefill.memory, last_step.memory
    activations = max(
        prefill_mem.activation_peak_bytes + prefill_mem.input_bytes,
        step_mem.activation_peak_bytes + step_mem.input_bytes,
    )
    peak = step_mem.weight_bytes + step_mem.kv_cache_bytes + activations
    capacity = int(prefill.device.memory_bytes)
    return {
        "weight_bytes": step_mem.weight_bytes,
        "kv_cache_bytes": step_mem.kv_cache_bytes,
        "activation_bytes": activations,
        "peak_bytes": peak,
        "device_memory_bytes": capacity,
        "free_bytes": capacity - peak,
        "fits": peak <= capacity,
    }


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
        deployment={k: prefill.workload[k] for k in DEPLOYMENT},
        prefill=prefill,
        decode=decode,
        fit=fit_line({kv: step_time(r) for kv, r in decode.items()}),
        max_batch=found,
        price_per_device_hour=price,
    )
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
    residual = max(abs(step_time(r) - (a + b * kv)) / step_time(r) for kv, r in report.decode.items())
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
    staged = getattr(report.prefill, "pipeline", None)
    if staged is not None:
        last = report.decode[points[-1]].pipeline
        notes.append(
            f"--pp {staged.stages}: layers per stage {staged.layers}; prefill {staged.formula}; decode at KV "
            f"{points[-1]}: {last.formula}"
        )
    for step in report.reports():  # the pipeline's per-step lines are summed up above
        notes += [line for line in step.notes if line not in notes and not line.startswith("--pp ")]
    return notes
