"""The KV cache each serving engine gives a deployment, by the engine's own rule (``KvBudget``), and how many requests
it holds at once.

- vLLM (V1): ``gpu_memory_utilization`` x the device's memory, less the weights, the torch activation peak of its
  profile run (a dummy iteration of ``max_num_batched_tokens`` tokens over ``min(tokens, max_num_seqs)`` requests,
  each sampling one token) and, on NVIDIA devices from v0.21, its estimate of the CUDA graphs' memory.
- SGLang: ``mem_fraction_static`` x the device's memory holds the weights and the KV pool, nothing else; the
  fraction, unless given, is SGLang's own of the device's memory and TP (``sglang_fraction``).
- TensorRT-LLM: ``free_gpu_memory_fraction`` of the memory left free after the weights and the activation peak of
  its profiling run of ``max_num_tokens`` prompt tokens.

The weights and activation peak are castcore's own, from the step-time model's largest capture (a full token
budget, the LM head over the sequences that sample). Not counted: memory outside torch's allocator (NCCL buffers,
cuBLAS workspaces), the sampler's own tensors and allocator fragmentation.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from castcore.report.memory import format_bytes

MiB, GiB = 2**20, 2**30

RULES = {
    "vllm": "vLLM gpu_memory_utilization",
    "sglang": "SGLang mem_fraction_static",
    "trtllm": "TensorRT-LLM free_gpu_memory_fraction",
}
SOURCES = {
    "vllm": (
        "vllm-project/vllm vllm/v1/worker/gpu_worker.py Worker.determine_available_memory (requested memory less "
        "non_kv_cache_memory less cudagraph_memory_estimate_applied); CUDA graph memory profiling on by default "
        "since v0.21.0 (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS, vllm-project/vllm PR #30515, issue #45178); "
        "max_cudagraph_capture_size min(2 x max_num_seqs, 512): docs.vllm.ai/en/v0.19.0/api/vllm/config/compilation/"
    ),
    "sglang": (
        "sgl-project/sglang python/sglang/srt/server_args.py ServerArgs._handle_gpu_memory_settings and "
        "model_runner.profile_max_num_token (rest = free memory after the weights - total x (1 - "
        "mem_fraction_static)), v0.5 line"
    ),
    "trtllm": (
        "nvidia.github.io/TensorRT-LLM/examples/kvcacheconfig.html (free_gpu_memory_fraction 0.9 of the free "
        "memory); NVIDIA/TensorRT-LLM tensorrt_llm/_torch/pyexecutor/_util.py estimate_max_kv_cache_tokens "
        "(a profiling run of max_num_tokens prompt tokens before the free memory is read)"
    ),
}
# vLLM captures CUDA graphs of up to min(2 x max_num_seqs, 512) tokens; they share one memory pool, which holds the
# largest graph's activations.
VLLM_GRAPH_TOKENS = 512


def sglang_fraction(device_mib: float, tp: int = 1, pp: int = 1, attention_dp: int = 1) -> float:
    """SGLang's ``mem_fraction_static`` for a device of ``device_mib`` MiB: its chunked-prefill size and largest
    CUDA-graph batch by the memory and TP, then (memory - reserved) / memory, reserved in MiB being 512 + 1.5 per
    chunked-prefill token (at least 2048) + 2 per graph batch + 128 per device of TP x PP (+ 3, and above 300 a
    further 1.5, per graph batch and attention data-parallel group), at least 10 GiB above 60 GiB."""
    small = tp < 4
    if device_mib < 20 * 1024:
        chunk, graphs = 2048, 8
    elif device_mib < 35 * 1024:
        chunk, graphs = 2048, 24 if small else 80
    elif device_mib < 60 * 1024:
        chunk, graphs = 4096, 32 if small else 160
    elif device_mib < 160 * 1024:  # H100, A100 80GB, H20, H200: the same two rows
        chunk, graphs = 8192, 256 if small else 512
    else:
        chunk, graphs = 16384, 512
    reserved = 512 + max(chunk, 2048) * 1.5 + graphs * 2 + tp * pp / 8 * 1024
    if attention_dp > 1:
        reserved += graphs * attention_dp * (3 + (1.5 if graphs > 300 else 0))
    if device_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return round((device_mib - reserved) / device_mib, 3)


@dataclass(frozen=True)
class KvBudget:
    """The KV cache one device of a deployment gets: ``fraction`` of the device's memory (``share_of`` "device")
    less what ``taken`` names, or of what ``taken`` leaves free ("free"); whole blocks of ``block_size`` tokens
    of ``per_token`` bytes each."""

    engine: str
    device_bytes: float
    fraction: float
    fraction_given: bool  # False: the engine's own default (SGLang's from the device and TP)
    share_of: str
    taken: tuple[tuple[str, int], ...]  # (what, bytes) in the order the engine subtracts them
    per_token: int
    block_size: int
    blocks_with_draft: int | None = (
        None  # the blocks left when a draft model's weights and cache share the memory
    )
    mean_request_tokens: float = 0.0
    max_running_requests: int = 0
    per_request: int = 0  # a hybrid model's linear-attention or state-space state per request, bytes

    @property
    def state_blocks(self) -> int:
        """The blocks each request holds for its state, whatever its length (castcore.simulation.blocks)."""
        return -(-self.per_request // (self.block_size * self.per_token)) if self.per_request else 0

    @property
    def kv_bytes(self) -> float:
        taken = sum(b for _, b in self.taken)
        if self.share_of == "device":
            return self.fraction * self.device_bytes - taken
        return self.fraction * (self.device_bytes - taken)

    @property
    def blocks(self) -> int:
        return max(0, int(self.kv_bytes // (self.block_size * self.per_token)))

    @property
    def scheduled_blocks(self) -> int:
        """The blocks the scheduler gets: the draft's share taken, if any."""
        return self.blocks if self.blocks_with_draft is None else self.blocks_with_draft

    @property
    def tokens(self) -> int:
        return self.scheduled_blocks * self.block_size

    @property
    def concurrent_requests(self) -> int:
        """Requests of the mean prompt + output length whose whole KV fits at once, within the engine's running
        limit."""
        if self.mean_request_tokens <= 0:
            return 0
        fit = int(self.tokens // (self.mean_request_tokens + self.state_blocks * self.block_size))
        return min(fit, self.max_running_requests) if self.max_running_requests else fit

    def for_requests(self, requests: Any) -> KvBudget:
        """The budget with the mean prompt + output length of ``requests`` (castcore.simulation.requests.Request)."""
        mean = sum(r.input_tokens + r.output_tokens for r in requests) / len(requests) if requests else 0.0
        return replace(self, mean_request_tokens=mean)

    def formula(self) -> str:
        """'41.20 GiB = 0.90 x 80.00 GiB - weights 67.10 GiB - activations 2.30 GiB'."""
        parts = " - ".join(f"{what} {format_bytes(b)}" for what, b in self.taken)
        whole = f"{self.fraction:.3g} x {format_bytes(self.device_bytes)}"
        body = (
            f"{whole} - {parts}"
            if self.share_of == "device"
            else f"{self.fraction:.3g} x ({format_bytes(self.device_bytes)} - {parts})"
        )
        return f"{format_bytes(self.kv_bytes)} = {body}"

    def line(self) -> str:
        """The text line: the formula, the rule, the tokens and blocks and the requests they hold."""
        own = "" if self.fraction_given else ", its default"
        text = (
            f"KV cache {self.formula()} ({RULES[self.engine]}{own}): {self.tokens:,} tokens in "
            f"{self.scheduled_blocks:,} blocks"
        )
        if self.blocks_with_draft is not None:
            text += f" (of {self.blocks:,} before the draft model's weights and cache)"
        if self.per_request:
            text += (
                f"; each request also holds {self.state_blocks:,} blocks for its recurrent state "
                f"({format_bytes(self.per_request)})"
            )
        if self.mean_request_tokens > 0:
            text += f"; {self.concurrent_requests:,} requests at once at the mean {self.mean_request_tokens:,.0f} tokens"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {
            "rule": RULES[self.engine],
            "source": SOURCES[self.engine],
            "fraction": self.fraction,
            "fraction_given": self.fraction_given,
            "share_of": self.share_of,
            "device_memory_bytes": self.device_bytes,
            "taken_bytes": {what: b for what, b in self.taken},
            "kv_cache_bytes": self.kv_bytes,
            "kv_cache_gib": round(self.kv_bytes / GiB, 4),
            "bytes_per_token": self.per_token,
            "block_size": self.block_size,
            "blocks": self.scheduled_blocks,
            "tokens": self.tokens,
            "blocks_before_draft": self.blocks if self.blocks_with_draft is not None else None,
            "mean_request_tokens": self.mean_request_tokens,
            "concurrent_requests": self.concurrent_requests,
            "state_bytes_per_request": self.per_request,
            "state_blocks_per_request": self.state_blocks,
        }


def budget(
    engine: str,
    limits: Any,
    profile: Any,
    base: Any,
    weight_bytes: int,
    activation_bytes: int,
    per_token: int,
    per_request: int = 0,
) -> KvBudget:
    """The KvBudget of ``engine`` (a preset's name) under ``limits`` (EngineLimits) for one device (``profile``) of
    ``base``'s deployment, whose weights and full-token-budget activation peak castcore captured; ``per_request``:
    the state bytes each request of a hybrid model holds."""
    fraction, given = limits.kv_memory_fraction, limits.kv_memory_fraction_given
    taken: list[tuple[str, int]] = [("weights", weight_bytes)]
    if engine == "sglang":
        if not given:
            fraction = sglang_fraction(profile.memory_bytes / MiB, base.tp, base.pp, base.attention_dp)
    else:
        taken.append(("activations", activation_bytes))
    if engine == "vllm" and profile.vendor.lower() == "nvidia" and not limits.enforce_eager:
        graph = min(
            limits.max_capture_size or VLLM_GRAPH_TOKENS,
            2 * limits.max_running_requests,
            limits.max_batched_tokens,
        )
        taken.append(("CUDA graphs", round(activation_bytes * graph / limits.max_batched_tokens)))
    return KvBudget(
        engine=engine,
        device_bytes=profile.memory_bytes,
        fraction=fraction,
        fraction_given=given,
        share_of=limits.memory_share_of,
        taken=tuple(taken),
        per_token=per_token,
        block_size=limits.block_size,
        max_running_requests=limits.max_running_requests,
        per_request=per_request,
    )
