"""Launch files: the commands that run a deployment castcore priced on a real serving engine, benchmark it under
the same traffic, and simulate that same run with castcore, so the two result files can be compared field by field.

For one deployment (model, parallel layout, dtypes) and one traffic shape (lengths, rate or concurrency, requests,
seed), ``launch_files`` gives, for vLLM, SGLang or TensorRT-LLM:

- the server's command, with the parallel sizes, the quantization and the engine limits castcore simulated with
  (token budget, running requests, KV block size, chunked prefill, memory share), each written as a flag;
- the engine's own benchmark client for that traffic: ``vllm bench serve``, ``python -m sglang.bench_serving``,
  and for ``trtllm-serve`` the client its serving-benchmark guide runs, ``python -m
  tensorrt_llm.serve.scripts.benchmark_serving --backend openai``; fixed prompt and output lengths (EOS ignored),
  and the percentiles castcore reports;
- ``castcore simulate ... --json``, whose fields carry ``vllm bench serve --save-result``'s names
  (castcore.simulation.metrics).

What an engine cannot take as a flag is one note line, never a wrong flag: a quantization it only loads from a
checkpoint quantized beforehand, a KV cache dtype it lacks, replicas it cannot start as one server (then the
commands are one replica's, at its share of the traffic).

Flag names were checked against each engine's own sources and documentation (read 2026-11-27):

- vLLM: engine arguments (docs.vllm.ai, "Engine Arguments" and the ``vllm serve`` CLI reference; vllm-project/vllm
  vllm/engine/arg_utils.py at 99d7eb5d): tensor/pipeline/data-parallel sizes, ``enable-expert-parallel``,
  ``quantization``, ``kv-cache-dtype``, ``max-num-batched-tokens``, ``max-num-seqs``, ``block-size``,
  ``gpu-memory-utilization``, ``[no-]enable-chunked-prefill``; ``vllm bench serve`` (docs.vllm.ai/en/latest/cli/
  bench/serve): the random dataset's lengths and ``random-range-ratio`` (0: fixed lengths), ``request-rate``,
  ``burstiness``, ``max-concurrency``, ``ignore-eos``, ``percentile-metrics``, ``metric-percentiles``,
  ``save-result``, ``result-filename``.
- SGLang: docs.sglang.io "Server Arguments" and its parallelism table (``tp-size``, ``dp-size``, ``ep-size``,
  ``enable-dp-attention``), sgl-project/sglang python/sglang/srt/server_args.py (``pp-size``, ``quantization``,
  ``torchao-config`` int8wo/int8dq/int4wo-128/fp8wo, ``kv-cache-dtype`` fp8_e4m3, ``chunked-prefill-size`` (-1 turns
  it off), ``max-prefill-tokens``, ``max-running-requests``, ``page-size``, ``mem-fraction-static``);
  python/sglang/bench_serving.py: ``random-range-ratio`` draws lengths in [ratio x len, len], so 1 fixes them, EOS
  is ignored unless ``disable-ignore-eos``, ``output-file`` appends one JSON line.
- TensorRT-LLM: NVIDIA/TensorRT-LLM tensorrt_llm/commands/serve.py (``tp_size``, ``pp_size``, ``ep_size``,
  ``max_batch_size``, ``max_num_tokens``, ``kv_cache_free_gpu_memory_fraction``, ``enable_chunked_prefill``,
  ``extra_llm_api_options``); tensorrt_llm/llmapi/llm_args.py (the YAML's ``kv_cache_config.dtype`` and
  ``tokens_per_block``, ``enable_attention_dp``, ``scheduler_config.capacity_scheduler_policy``);
  docs/source/commands/trtllm-serve/run-benchmark-with-trtllm-serve.md and
  tensorrt_llm/serve/scripts/benchmark_serving.py (``random-ids``, symmetric ``random-range-ratio``).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from castcore.errors import ModelError
from castcore.options.catalog import say
from castcore.options.traffic import SIMULATE
from castcore.simulation.presets import PRESETS, EngineLimits
from castcore.workload import checkpoint
from castcore.workload.spec import is_factory, load_model_config, preset_names

ENGINES = ("vllm", "sglang", "trtllm")
# Each preset's checkpoint on the Hugging Face hub: the repository its castcore/workload/presets file names as its
# source (Meta-Llama-3.1-405B is now meta-llama/Llama-3.1-405B).
HUB_IDS = {
    "deepseek-v3": "deepseek-ai/DeepSeek-V3",
    "gpt-oss-120b": "openai/gpt-oss-120b",
    "gpt-oss-20b": "openai/gpt-oss-20b",
    "kimi-k2": "moonshotai/Kimi-K2-Instruct",
    "llama-3-70b": "meta-llama/Meta-Llama-3-70B",
    "llama-3-8b": "meta-llama/Meta-Llama-3-8B",
    "llama-3.1-405b": "meta-llama/Llama-3.1-405B",
    "llama-4-scout": "meta-llama/Llama-4-Scout-17B-16E-Instruct",
    "mistral-7b": "mistralai/Mistral-7B-v0.1",
    "mixtral-8x22b": "mistralai/Mixtral-8x22B-v0.1",
    "mixtral-8x7b": "mistralai/Mixtral-8x7B-v0.1",
    "qwen2.5-7b": "Qwen/Qwen2.5-7B",
    "qwen3-235b-a22b": "Qwen/Qwen3-235B-A22B",
    "qwen3-30b-a3b": "Qwen/Qwen3-30B-A3B",
}
TORCH_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
PERCENTILES = "50,90,95,99"  # castcore simulate reports the median, p90, p95 and p99
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


@dataclass
class LaunchFiles:
    engine: str
    model_id: str
    launch: list[str]
    bench: list[str]
    simulate: list[str]
    result_file: str
    simulate_file: str = "castcore-simulate.json"
    options_file: str | None = None  # trtllm-serve's extra options, written by the heredoc printed before it
    options_yaml: str | None = None
    notes: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        """The commands as a shell script: notes as comments, trtllm-serve's YAML as a heredoc."""
        out = [f"# note: {n}" for n in self.notes]
        if self.options_yaml is not None:
            out += [
                "# the options trtllm-serve takes only from its YAML file",
                f"cat > {self.options_file} <<'EOF'",
                *self.options_yaml.splitlines(),
                "EOF",
            ]
        out += [
            "# start the server",
            shlex.join(self.launch),
            f"# once it is up, benchmark the same traffic (writes {self.result_file})",
            shlex.join(self.bench),
            f"# castcore's simulation of that run, under the benchmark's field names (writes {self.simulate_file})",
            f"{shlex.join(self.simulate)} > {self.simulate_file}",
        ]
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "model_id": self.model_id,
            "launch": shlex.join(self.launch),
            "options_file": self.options_file,
            "options_yaml": self.options_yaml,
            "bench": shlex.join(self.bench),
            "result_file": self.result_file,
            "simulate": shlex.join(self.simulate),
            "simulate_file": self.simulate_file,
            "notes": self.notes,
        }


def hub_id(model: str) -> tuple[str, str | None]:
    """The checkpoint an engine loads for castcore's ``model``, and a note when it is a stand-in."""
    if model in HUB_IDS:
        return HUB_IDS[model], None
    if model in preset_names():
        return "MODEL", f"castcore's preset {model} names no checkpoint here: replace MODEL with one"
    if is_factory(model):
        return "MODEL", f"{model} is a Python factory: replace MODEL with the checkpoint it builds"
    folder = str(Path(model).parent)
    return folder, (
        f"{folder} holds the config.json castcore priced: put the checkpoint's weights and tokenizer "
        "there, or replace it with the checkpoint's hub id"
    )


def _moe(config: dict[str, Any]) -> bool:
    text = config.get("text_config") or config
    return any(text.get(k) for k in ("num_local_experts", "num_experts", "n_routed_experts"))


def _attention_groups(d: Deployment) -> int:
    """Attention data-parallel groups: --attention-dp, or --ep above --tp (see castcore's --ep)."""
    return d.ep // d.tp if d.ep > d.tp else d.attention_dp


def _quantization(engine: str, d: Deployment, config: dict[str, Any], notes: list[str]) -> list[str]:
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


def _kv_cache(engine: str, d: Deployment, notes: list[str]) -> str | None:
    if d.kv_cache in (None, d.dtype):
        return None
    if d.kv_cache == "fp8":
        return KV_DTYPES[engine]
    notes.append(f"{engine} has no {d.kv_cache} KV cache: it runs in the model dtype there")
    return None


def _dtype(engine: str, d: Deployment, notes: list[str]) -> list[str]:
    if d.dtype in TORCH_DTYPES:
        return ["--dtype", TORCH_DTYPES[d.dtype]] if engine != "trtllm" else []
    notes.append(
        f"{engine} has no {d.dtype} mode: it runs fp32 products without TF32 unless the GPU's default "
        "allows it"
    )
    return ["--dtype", "float32"] if engine != "trtllm" else []


def _replicas(engine: str, d: Deployment, moe: bool, notes: list[str]) -> int:
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


def _parallel(
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


def _limits(engine: str, limits: EngineLimits, notes: list[str]) -> tuple[list[str], dict[str, Any]]:
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
        return flags + (["--mem-fraction-static", *fraction] if share else []), yaml
    flags = ["--max_batch_size", running, "--max_num_tokens", tokens]
    flags += ["--kv_cache_free_gpu_memory_fraction", *fraction] if share else []
    flags += ["--enable_chunked_prefill"] if limits.chunked_prefill else []
    yaml["kv_cache_config"] = {"tokens_per_block": limits.block_size}
    policy = "GUARANTEED_NO_EVICT" if limits.kv_policy == "reserve" else "MAX_UTILIZATION"
    yaml["scheduler_config"] = {"capacity_scheduler_policy": policy}
    return flags, yaml


def _yaml(data: dict[str, Any], indent: str = "") -> list[str]:
    out = []
    for key, value in data.items():
        if isinstance(value, dict):
            out += [f"{indent}{key}:", *_yaml(value, indent + "  ")]
        else:
            out.append(f"{indent}{key}: {str(value).lower() if isinstance(value, bool) else value}")
    return out


def _share(traffic: Traffic, replicas: int) -> Traffic:
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


def _bench(engine: str, model_id: str, traffic: Traffic, result: str, notes: list[str]) -> list[str]:
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
    if engine == "vllm":
        head = [
            "vllm",
            "bench",
            "serve",
            "--backend",
            "vllm",
            "--model",
            model_id,
            "--dataset-name",
            "random",
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
    head = [
        "python",
        "-m",
        "tensorrt_llm.serve.scripts.benchmark_serving",
        "--backend",
        "openai",
        "--model",
        model_id,
        "--dataset-name",
        "random",
        "--random-ids",
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


def _simulate(
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
    ):
        value = getattr(limits, name)
        if value != getattr(preset, name):
            shown = {True: "on", False: "off"}[value] if name == "chunked_prefill" else f"{value:g}"
            argv += [SIMULATE[name].cli, shown]
    argv += ["--dtype", d.dtype] if d.dtype != "bf16" else []
    for name in ("tp", "pp", "ep", "attention_dp"):
        argv += [SIMULATE[name].cli, str(getattr(d, name))] if getattr(d, name) > 1 else []
    argv += ["--dp", str(d.dp)] if d.dp > 1 and replicas == 1 else []
    for name in ("weights", "activations", "kv_cache"):
        argv += [SIMULATE[name].cli, getattr(d, name)] if getattr(d, name) else []
    return [*argv, *castcore_options, "--json"]


def launch_files(
    engine: str,
    deployment: Deployment,
    traffic: Traffic,
    limits: EngineLimits | None = None,
    castcore_options: list[str] | tuple[str, ...] = (),
) -> LaunchFiles:
    """The launch, benchmark and simulate commands of ``deployment`` under ``traffic`` on ``engine`` (see the module
    docstring). ``limits``: what castcore simulated with (default: the engine's preset); ``castcore_options``: the
    plugin options the simulate command needs (``--device-file F``, ``--no-packs``)."""
    if engine not in ENGINES:
        raise ModelError(f"{say('emit', engine)}: castcore writes launch files for {', '.join(ENGINES)}")
    limits = limits or PRESETS[engine]
    config = {} if is_factory(deployment.model) else load_model_config(deployment.model)
    notes: list[str] = []
    model_id, where = hub_id(deployment.model)
    notes += [where] if where else []
    replicas = _replicas(engine, deployment, _moe(config), notes)
    parallel, yaml = _parallel(engine, deployment, replicas, notes)
    quantization = _quantization(engine, deployment, config, notes)
    kv = _kv_cache(engine, deployment, notes)
    engine_flags, more = _limits(engine, limits, notes)
    dtype = _dtype(engine, deployment, notes)
    traffic = _share(traffic, replicas)
    result = f"{engine}-bench.json" + ("l" if engine == "sglang" else "")
    bench = _bench(engine, model_id, traffic, result, notes)
    simulate = _simulate(engine, deployment, traffic, replicas, limits, list(castcore_options))
    if engine != "trtllm":
        head = (
            ["vllm", "serve", model_id]
            if engine == "vllm"
            else ["python", "-m", "sglang.launch_server", "--model-path", model_id]
        )
        launch = [
            *head,
            *parallel,
            *dtype,
            *quantization,
            *(["--kv-cache-dtype", kv] if kv else []),
            *engine_flags,
        ]
        return LaunchFiles(engine, model_id, launch, bench, simulate, result, notes=notes)
    options = {**yaml, **more}
    if kv:
        options["kv_cache_config"] = {**options["kv_cache_config"], "dtype": kv}
    if deployment.dtype in ("fp16", "fp32", "tf32"):
        options["dtype"] = TORCH_DTYPES.get(deployment.dtype, "float32")
    file = "trtllm-options.yml"
    launch = [
        "trtllm-serve",
        model_id,
        *parallel,
        *quantization,
        *engine_flags,
        "--extra_llm_api_options",
        file,
    ]
    return LaunchFiles(
        engine,
        model_id,
        launch,
        bench,
        simulate,
        result,
        options_file=file,
        options_yaml="\n".join(_yaml(options)),
        notes=notes,
    )
