"""The server's side of launch files (castcore.sweeps.launch): a deployment castcore priced written as one engine's
server flags (parallel sizes, quantization, KV cache and model dtypes, the engine limits simulated), and a note for
what the engine cannot take as a flag."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from castcore.options.catalog import say
from castcore.simulation.presets import PRESETS, EngineLimits
from castcore.workload import checkpoint
from castcore.workload.spec import routed_experts

TORCH_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
# Online quantization of a bf16 checkpoint, where the engine has a flag for it: (weights, activations) -> flags.
ONLINE = {
    "vllm": {("fp8", "fp8"): ["--quantization", "fp8"]},
    "sglang": {
        ("fp8", "fp8"): ["--quantization", "fp8"],
        ("fp8", None): ["--torchao-config", "fp8wo"],
        ("int8", None): ["--torchao-config", "int8wo"],
        ("int8", "int8"): ["--torchao-config", "int8dq"],
        ("int4", None): ["--torchao-config", "int4wo-128"],
    },
    "trtllm": {},
}
CHECKPOINTS = {  # what to serve instead, where no flag quantizes a bf16 checkpoint so
    (
        "fp8",
        None,
    ): "a weight-only fp8 checkpoint (the engine's fp8 flag quantizes activations too: price that with "
    "activations fp8)",
    ("fp8", "fp8"): "an fp8 checkpoint (TensorRT Model Optimizer's FP8)",
    ("fp8-block", None): "an fp8 checkpoint in 128x128 blocks (as DeepSeek-V3 ships)",
    ("int8", None): "an int8 weight-only checkpoint (GPTQ 8-bit or compressed-tensors W8A16)",
    ("int8", "int8"): "an int8 W8A8 checkpoint (compressed-tensors or SmoothQuant)",
    ("int4", None): "an int4 checkpoint with a scale per 128 columns (GPTQ or AWQ)",
    ("int4", "fp8"): "an int4-weight fp8-activation checkpoint (TensorRT Model Optimizer's W4A8_AWQ)",
    ("nvfp4", None): "an NVFP4 checkpoint (TensorRT Model Optimizer's)",
    ("mxfp4", None): "an MXFP4 checkpoint (as gpt-oss ships)",
}
KV_DTYPES = {"vllm": "fp8", "sglang": "fp8_e4m3", "trtllm": "fp8"}  # castcore's fp8 KV cache: e4m3


@dataclass(frozen=True)
class Deployment:
    """What runs: castcore's options of the same names (``weights`` None: the model dtype)."""

    model: str
    device: str | None = None
    tp: int = 1
    pp: int = 1
    ep: int = 1
    attention_dp: int = 1
    dp: int = 1
    dtype: str = "bf16"
    weights: str | None = None
    activations: str | None = None
    kv_cache: str | None = None

    @classmethod
    def of(cls, row: dict[str, Any], dtype: str = "bf16") -> Deployment:
        """A plan's row (castcore plan --json's ``best``)."""
        return cls(
            model=row["model"],
            device=row.get("device"),
            tp=row.get("tp", 1),
            pp=row.get("pp", 1),
            ep=row.get("ep", 1),
            attention_dp=row.get("attention_dp", 1),
            dp=row.get("dp", 1),
            dtype=row.get("dtype") or dtype,
            weights=row.get("weights"),
            activations=row.get("activations"),
            kv_cache=row.get("kv_cache"),
        )


def is_moe(config: dict[str, Any]) -> bool:
    return bool(routed_experts(config))


def _attention_groups(d: Deployment) -> int:
    """Attention data-parallel groups: --attention-dp, or --ep above --tp (see castcore's --ep)."""
    return d.ep // d.tp if d.ep > d.tp else d.attention_dp


def quantization_flags(engine: str, d: Deployment, config: dict[str, Any], notes: list[str]) -> list[str]:
    weights = None if d.weights in (None, d.dtype) else d.weights
    activations = None if d.activations in (None, d.dtype) else d.activations
    if weights is None:
        return []
    found = checkpoint.shipped(d.model, config) if config else None
    if found is not None and found[0].get("weights") == weights:
        notes.append(
            f"the checkpoint ships {weights} weights: the engine reads its quantization_config, no flag"
        )
        return []
    flags = ONLINE[engine].get((weights, activations))
    if flags is not None:
        return list(flags)
    wanted = CHECKPOINTS.get((weights, activations), f"a checkpoint of {weights} weights")
    notes.append(
        f"no {engine} flag quantizes a bf16 checkpoint to castcore's {weights} weights"
        + (f" with {activations} activations" if activations else "")
        + f": serve {wanted} as MODEL; the engine reads its quantization_config"
    )
    return []


def kv_cache_dtype(engine: str, d: Deployment, notes: list[str]) -> str | None:
    if d.kv_cache in (None, d.dtype):
        return None
    if d.kv_cache == "fp8":
        return KV_DTYPES[engine]
    notes.append(f"{engine} has no {d.kv_cache} KV cache: it runs in the model dtype there")
    return None


def dtype_flags(engine: str, d: Deployment, notes: list[str]) -> list[str]:
    if d.dtype in TORCH_DTYPES:
        return ["--dtype", TORCH_DTYPES[d.dtype]] if engine != "trtllm" else []
    notes.append(
        f"{engine} has no {d.dtype} mode: it runs fp32 products without TF32 unless the GPU's default "
        "allows it"
    )
    return ["--dtype", "float32"] if engine != "trtllm" else []


def server_replicas(engine: str, d: Deployment, moe: bool, notes: list[str]) -> int:
    """How many copies of the printed server castcore's ``dp`` stands for (1: the server itself holds them)."""
    if d.dp == 1:
        return 1
    groups = _attention_groups(d)
    why = None
    if engine == "trtllm":
        why = "trtllm-serve starts no data-parallel replicas"
    elif groups > 1:
        why = f"{engine}'s data-parallel ranks are the attention groups here"
    elif engine == "vllm" and moe:
        why = "vllm serve's data-parallel ranks share a mixture-of-experts model's expert layers"
    if why is None:
        return 1
    notes.append(
        f"castcore priced {d.dp} independent replicas and {why}: start {d.dp} of these servers behind a "
        "load balancer; the benchmark and the simulation below are one replica's, at its share of the "
        "traffic"
    )
    return d.dp


def parallel_flags(
    engine: str, d: Deployment, replicas: int, notes: list[str]
) -> tuple[list[str], dict[str, Any]]:
    groups = _attention_groups(d)
    experts = d.ep > 1 or groups > 1
    yaml: dict[str, Any] = {}
    if groups > 1:
        notes.append("castcore simulate refuses attention data parallelism yet: its command below says so")
    if d.ep > 1 and d.ep not in (d.tp, d.tp * groups):
        notes.append(
            f"castcore's {say('ep', d.ep)} with {say('tp', d.tp)} splits the experts over fewer devices than "
            f"the tensor group: {engine} has no such layout, the flags below split them over the group"
        )
    dp = d.dp if replicas == 1 else 1
    if engine == "vllm":
        flags = ["--tensor-parallel-size", str(d.tp), "--pipeline-parallel-size", str(d.pp)]
        if groups * dp > 1:
            flags += ["--data-parallel-size", str(groups * dp)]
        return flags + (["--enable-expert-parallel"] if experts else []), yaml
    if engine == "sglang":
        flags = ["--tp-size", str(d.tp * groups), "--pp-size", str(d.pp)]
        if groups > 1:
            flags += ["--dp-size", str(groups), "--enable-dp-attention"]
        elif dp > 1:
            flags += ["--dp-size", str(dp)]
        return flags + (["--ep-size", str(d.tp * groups)] if experts else []), yaml
    if groups > 1:
        if d.tp > 1:
            notes.append(
                f"TensorRT-LLM's attention data parallelism gives every rank its own attention group; "
                f"castcore's attention groups of {say('tp', d.tp)} have no counterpart: the flags below "
                f"run {d.tp * groups} groups of one device"
            )
        yaml["enable_attention_dp"] = True
    flags = ["--tp_size", str(d.tp * groups), "--pp_size", str(d.pp)]
    return flags + (["--ep_size", str(d.tp * groups)] if experts else []), yaml


def limit_flags(engine: str, limits: EngineLimits, notes: list[str]) -> tuple[list[str], dict[str, Any]]:
    yaml: dict[str, Any] = {}
    share = limits.memory_share_of == PRESETS[engine].memory_share_of
    if not share:
        notes.append(
            f"the memory fraction castcore simulated ({limits.kv_memory_fraction:g} of the "
            f"{limits.memory_share_of} memory) is not how {engine} counts it: its own default stays"
        )
    if limits.scheduler_steps > 1:
        notes.append(
            f"{engine} schedules every iteration: castcore's {say('scheduler_steps', limits.scheduler_steps)} "
            "has no counterpart"
        )
    if engine != "trtllm" and limits.kv_policy == "reserve":
        notes.append(
            f"{engine} preempts when the KV cache runs out: castcore's {say('kv_policy', 'reserve')} has no "
            "counterpart"
        )
    tokens, running = str(limits.max_batched_tokens), str(limits.max_running_requests)
    fraction = [f"{limits.kv_memory_fraction:g}"] if share else []
    if engine == "vllm":
        flags = [
            "--max-num-batched-tokens",
            tokens,
            "--max-num-seqs",
            running,
            "--block-size",
            str(limits.block_size),
        ]
        flags += ["--gpu-memory-utilization", *fraction] if share else []
        flags += ["--enforce-eager"] if limits.enforce_eager else []
        if limits.max_capture_size is not None:
            flags += ["--compilation-config", f'{{"max_cudagraph_capture_size": {limits.max_capture_size}}}']
        return flags + [
            "--enable-chunked-prefill" if limits.chunked_prefill else "--no-enable-chunked-prefill"
        ], yaml
    if engine == "sglang":
        flags = (
            ["--chunked-prefill-size", tokens]
            if limits.chunked_prefill
            else ["--chunked-prefill-size", "-1", "--max-prefill-tokens", tokens]
        )
        flags += ["--max-running-requests", running, "--page-size", str(limits.block_size)]
        flags += ["--enable-mixed-chunk"] if limits.mixed_chunk else []
        flags += ["--disable-cuda-graph"] if limits.enforce_eager else []
        flags += (
            [] if limits.max_capture_size is None else ["--cuda-graph-max-bs", str(limits.max_capture_size)]
        )
        # SGLang derives its own default from the device and TP, as the simulation did: given, it is passed
        given = share and limits.kv_memory_fraction_given
        return flags + (["--mem-fraction-static", *fraction] if given else []), yaml
    flags = ["--max_batch_size", running, "--max_num_tokens", tokens]
    flags += ["--kv_cache_free_gpu_memory_fraction", *fraction] if share else []
    flags += ["--enable_chunked_prefill"] if limits.chunked_prefill else []
    yaml["kv_cache_config"] = {"tokens_per_block": limits.block_size}
    if limits.enforce_eager:
        yaml["cuda_graph_config"] = "null"  # no CUDA graphs
    elif limits.max_capture_size is not None:
        yaml["cuda_graph_config"] = {"max_batch_size": limits.max_capture_size}
    policy = "GUARANTEED_NO_EVICT" if limits.kv_policy == "reserve" else "MAX_UTILIZATION"
    yaml["scheduler_config"] = {"capacity_scheduler_policy": policy}
    return flags, yaml
