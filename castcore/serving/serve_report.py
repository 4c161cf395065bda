"""A static batch's figures: ``ServeReport`` (TTFT, TPOT, latency, throughput, memory, energy and cost, in text
and JSON), with the step time and memory figures it reads off each step's Report. castcore.serving.static makes it."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from castcore.report.energy import (
    DeviceTime,
    PhaseTime,
    busy_s,
    cost_figures,
    energy_figures,
    fitted_sum,
    format_lines,
)
from castcore.report.memory import format_bytes
from castcore.report.records import Report, format_seconds
from castcore.deploy.parallel.layout import Layout
from castcore.deploy.parallel.pipeline_stages import stage_figures

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
    # build_workload's deployment options (dtype, fuse, weights, tp, ep, pp, dp, ...)
    deployment: dict[str, Any]
    prefill: Report
    decode: dict[int, Report]
    fit: tuple[float, float]
    notes: list[str] = field(default_factory=list)
    max_batch: str = ""  # how the batch was found, when it was asked for as "max"
    price_per_device_hour: float | None = None  # dollars a device-hour, for the cost figures

    def energy_and_cost(self) -> dict[str, Any]:
        """Energy (when the profile gives power numbers) and cost (with a price) of one batch on every replica
        (castcore.report.energy): the prefill's device time is the input tokens', the decode's the output's, at
        the batch's tokens/s per user."""
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
            **cost_figures(  # a static batch works all its time: nothing idle
                self.price_per_device_hour,
                self.devices,
                DeviceTime(
                    self.devices * self.latency_s, self.devices * self.ttft_s, self.devices * self.decode_s
                ),
                tokens * self.input_tokens,
                tokens * self.output_tokens,
                self.output_tokens_per_s_per_user,
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
    def output_tokens_per_s_per_user(self) -> float:
        """The interactivity each request is served at: 1 / its mean TPOT."""
        return 1 / self.tpot_s

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
            "output_tokens_per_s_per_user": self.output_tokens_per_s_per_user,
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
        staged = stage_figures(self.prefill)
        decode = {
            kv: stages for kv in self.kv_points if (stages := stage_figures(self.decode[kv])) is not None
        }
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
                "decode_micro_batches_in_flight": decode[self.kv_points[0]].micro_batches,
                "decode_stage_times_s": [
                    {"kv_len": kv, "stage_times_s": decode[kv].stage_times_s} for kv in self.kv_points
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
            + f"), {self.output_tokens_per_s_per_user:,.1f} per user",
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
    staged = stage_figures(report)
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
