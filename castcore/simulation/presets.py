"""Serving-engine presets for ``castcore simulate --engine vllm|sglang|trtllm``: each engine's documented scheduler
and KV-cache defaults, every number with where it comes from, and ``limits`` to take one with overrides.

Where an engine derives a default from the device, the preset holds the value for an 80 GB H100-class GPU and
``for_device`` takes the device's own (vLLM's batch limits below 70 GiB and on an A100, vllm-ascend's block size on
Ascend); every field is overridable by its own option, and a given value stays.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from castcore.errors import ModelError
from castcore.options.catalog import say


@dataclasses.dataclass(frozen=True)
class EngineLimits:
    """What an engine's scheduler and KV cache allow.

    ``max_running_requests``: requests scheduled at once. ``max_batched_tokens``: the per-iteration token budget
    (prefill chunks plus one token per decode). ``chunked_prefill``: whether a prompt may be split over iterations.
    ``block_size``: KV tokens per block (page). ``kv_memory_fraction``: the share of memory the engine takes for
    weights, KV cache and activations, read as ``memory_share_of`` says: ``"device"``, a share of the whole
    device memory (weights included); ``"free"``, a share of what is free after the weights and buffers, all of it
    for the KV cache. ``kv_policy``: "preempt" takes KV blocks as a request's tokens come and preempts when they run
    out; "reserve" admits a request only when blocks for its whole prompt and output are free, and holds them until
    it finishes, so none is ever preempted. ``scheduler_steps``: iterations run per scheduling decision (vLLM
    0.6's multi-step scheduling, ``--num-scheduler-steps``); requests are admitted only at a decision. ``sources``:
    where each number comes from. ``enforce_eager``: no CUDA graphs; ``max_capture_size``: the largest decode batch
    captured in one (None: the engine's rule); both priced by castcore.simulation.overheads.
    ``kv_memory_fraction_given``: the fraction was given, not the preset's (SGLang derives its own from the device
    and TP otherwise: castcore.serving.engine_memory). ``given``: the fields given as options, which the device
    does not change (``for_device``). ``mixed_chunk``: decodes run in the same iteration as prompt chunks (vLLM
    and TensorRT-LLM always); off, an iteration with prompt work to do runs only that, and the decodes wait for
    an iteration without (SGLang's default, ``--enable-mixed-chunk`` off).
    """

    max_running_requests: int
    max_batched_tokens: int
    chunked_prefill: bool
    block_size: int
    kv_memory_fraction: float
    memory_share_of: Literal["device", "free"]
    kv_policy: Literal["preempt", "reserve"] = "preempt"
    scheduler_steps: int = 1
    sources: tuple[str, ...] = ()
    enforce_eager: bool = False
    max_capture_size: int | None = None
    kv_memory_fraction_given: bool = False
    given: tuple[str, ...] = ()
    mixed_chunk: bool = True


_VLLM_ARGS = "vllm-project/vllm vllm/engine/arg_utils.py, EngineArgs._set_default_args, commit 99d7eb5d (v0.11 line, 2025-10)"
_VLLM_CACHE = "docs.vllm.ai/en/stable/api/vllm/config/cache/ (CacheConfig.DEFAULT_BLOCK_SIZE), read 2026-11"
_SGLANG_ARGS = "sgl-project/sglang python/sglang/srt/server_args.py, ServerArgs._handle_gpu_memory_settings (v0.5 line, 2025-2026)"
_SGLANG_RUNNER = (
    "sgl-project/sglang python/sglang/srt/model_executor/model_runner.py, max_running_requests (v0.5 line)"
)
_TRTLLM_ARGS = "NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/llm_args.py (version 1.0.0rc4, 2025-07)"
_TRTLLM_RUNTIME = (
    "nvidia.github.io/TensorRT-LLM/performance/performance-tuning-guide/useful-runtime-flags.html "
    "'Useful Runtime Options', Capacity Scheduler Policy, read 2026-11"
)
_TRTLLM_KV = "nvidia.github.io/TensorRT-LLM/examples/kvcacheconfig.html 'How to Change KV Cache Behavior', read 2026-11"

PRESETS: dict[str, EngineLimits] = {
    "vllm": EngineLimits(
        # `vllm serve` (OPENAI_API_SERVER usage context) on a GPU of >= 70 GiB that is not an A100: max_num_seqs 1024,
        # max_num_batched_tokens 8192; other GPUs get 256 and 2048 (the LLM class 256 and 8192).
        max_running_requests=1024,
        max_batched_tokens=8192,
        chunked_prefill=True,  # V1 always uses chunked prefill (same source, _set_default_args_v1).
        block_size=16,  # CacheConfig.DEFAULT_BLOCK_SIZE = 16 on CUDA.
        kv_memory_fraction=0.9,  # EngineArgs.gpu_memory_utilization = 0.90 (same arg_utils.py): share of the device.
        memory_share_of="device",
        sources=(
            f"max_num_seqs 1024, max_num_batched_tokens 8192, chunked prefill on, gpu_memory_utilization 0.9: {_VLLM_ARGS}",
            f"block_size 16: {_VLLM_CACHE}",
        ),
    ),
    "sglang": EngineLimits(
        # max_running_requests unset = min(max_total_num_tokens // 2, req_to_token_pool size), the pool capped at 4096
        # requests: the preset takes the cap; the KV blocks bound it further in the simulation itself.
        max_running_requests=4096,
        max_batched_tokens=8192,  # chunked_prefill_size 8192 for 60-160 GB GPUs (H100, H200, A100 80GB).
        chunked_prefill=True,
        mixed_chunk=False,  # enable_mixed_chunk False: a prefill batch runs alone, the decodes wait for it.
        block_size=1,  # page_size 1 (token-granular KV pool) unless an attention backend asks for more.
        # mem_fraction_static = (gpu_mem - reserved) / gpu_mem, reserved = 512 MB + 1.5 MB per chunked-prefill token
        # + 2 MB per CUDA-graph batch (256 at TP < 4) + TP/8 GB, at least 10 GB above 60 GB: for an 80 GB H100 at TP 1
        # (81,559 MiB) that is (81559 - 13440) / 81559 = 0.835. A share of the device, weights and KV pool included;
        # a simulation computes it for its own device and TP (castcore.serving.engine_memory.sglang_fraction).
        kv_memory_fraction=0.835,
        memory_share_of="device",
        sources=(
            f"chunked_prefill_size 8192, mem_fraction_static formula: {_SGLANG_ARGS}",
            f"enable_mixed_chunk False (prompt chunks and decodes in separate batches): {_SGLANG_ARGS}",
            f"max_running_requests = min(max_total_num_tokens // 2, req_to_token_pool.size <= 4096): {_SGLANG_RUNNER}",
            f"page_size 1: {_SGLANG_ARGS}",
        ),
    ),
    "trtllm": EngineLimits(
        max_running_requests=2048,  # max_batch_size Field(default=2048).
        max_batched_tokens=8192,  # max_num_tokens 8192 (LLM API reference page; not found in llm_args.py itself).
        chunked_prefill=False,  # enable_chunked_prefill Field(default=False).
        block_size=32,  # KvCacheConfig.tokens_per_block Field(default=32) (the TensorRT engine path used 64).
        kv_memory_fraction=0.9,  # KvCacheConfig.free_gpu_memory_fraction 0.9: a share of the memory free after weights.
        memory_share_of="free",
        kv_policy="reserve",  # CapacitySchedulerPolicy GUARANTEED_NO_EVICT, the default.
        sources=(
            f"max_batch_size 2048, enable_chunked_prefill False, tokens_per_block 32: {_TRTLLM_ARGS}",
            f"capacity scheduler policy GUARANTEED_NO_EVICT (default; a started request is never paused): {_TRTLLM_RUNTIME}",
            "max_num_tokens 8192: mintlify.com/NVIDIA/TensorRT-LLM/deployment/llm-api (LLM class arguments), read 2026-11",
            f"free_gpu_memory_fraction 0.9 of the free memory: {_TRTLLM_KV}",
        ),
    ),
}

_WHOLE = ("max_running_requests", "max_batched_tokens", "block_size", "scheduler_steps", "max_capture_size")


_KNOWN = (*_WHOLE, "kv_memory_fraction", "chunked_prefill", "mixed_chunk", "kv_policy", "enforce_eager")


def limits(engine: str, **overrides: object) -> EngineLimits:
    """``engine``'s preset with ``overrides`` (field names of ``EngineLimits``) applied and checked."""
    if engine not in PRESETS:
        raise ModelError(f"{say('engine', engine)} is not known; choose one of {', '.join(PRESETS)}")
    for name, value in overrides.items():
        option = say(name) if name in _KNOWN else repr(name)
        if name in _WHOLE:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ModelError(f"{option} takes a whole number >= 1, not {value!r}")
        elif name == "kv_memory_fraction":
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
                raise ModelError(f"{option} takes a fraction in (0, 1], not {value!r}")
        elif name in ("chunked_prefill", "mixed_chunk", "enforce_eager"):
            if not isinstance(value, bool):
                raise ModelError(f"{option} takes true or false, not {value!r}")
        elif name == "kv_policy":
            if value not in ("preempt", "reserve"):
                raise ModelError(f"{option} takes preempt or reserve, not {value!r}")
        else:
            known = ", ".join(say(n) for n in _KNOWN)
            raise ModelError(f"{option} is not an engine option; known: {known}")
    if overrides.get("mixed_chunk") is False and engine != "sglang":
        raise ModelError(
            f"{say('mixed_chunk')} off is SGLang's scheduling ({say('engine', 'sglang')}); {engine} always runs "
            f"decodes in the iteration of the prompt chunks: drop {say('mixed_chunk')}"
        )
    if overrides.get("enforce_eager") and overrides.get("max_capture_size") is not None:
        raise ModelError(
            f"{say('max_capture_size')} sizes the CUDA graphs {say('enforce_eager', True)} turns off: give one"
        )
    marks = {"kv_memory_fraction_given": "kv_memory_fraction" in overrides, "given": tuple(sorted(overrides))}
    return dataclasses.replace(PRESETS[engine], **overrides, **marks)  # type: ignore[arg-type]  # checked above


# vLLM's defaults for `vllm serve` on a GPU below 70 GiB, or an A100 (whose throughput the larger budget lowered):
# max_num_seqs 256, max_num_batched_tokens 2048 (_VLLM_ARGS). vllm-ascend sets a block size of 128 where none is
# given (vllm-project/vllm-ascend vllm_ascend/utils.py refresh_block_size, read 2026-11-29); its NPUs take vLLM's
# rule by their memory, so a 64 GB 910B gets the smaller limits.
VLLM_SMALL_DEVICE = {"max_running_requests": 256, "max_batched_tokens": 2048}
VLLM_LARGE_DEVICE_GIB = 70
VLLM_ASCEND_BLOCK_SIZE = 128


def for_device(
    engine: str, chosen: EngineLimits, memory_bytes: float, name: str, vendor: str
) -> EngineLimits:
    """``chosen`` with the defaults ``engine`` derives from the device (its memory, name and vendor), where not
    given."""
    if engine != "vllm":
        return chosen
    derived: dict[str, int] = {}
    if memory_bytes < VLLM_LARGE_DEVICE_GIB * 2**30 or "a100" in name.lower():
        derived.update(VLLM_SMALL_DEVICE)
    if vendor.lower() == "huawei":
        derived["block_size"] = VLLM_ASCEND_BLOCK_SIZE
    kept = {field: value for field, value in derived.items() if field not in chosen.given}
    return dataclasses.replace(chosen, **kept) if kept else chosen  # type: ignore[arg-type]  # whole numbers
