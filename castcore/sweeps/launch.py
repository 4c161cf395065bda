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

castcore.sweeps.launch_server writes the server's flags, castcore.sweeps.launch_bench the benchmark's and
castcore simulate's commands.

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
from castcore.simulation.presets import PRESETS, EngineLimits
from castcore.sweeps.launch_bench import Traffic, bench_command, replica_traffic, simulate_command
from castcore.sweeps.launch_server import (
    TORCH_DTYPES,
    Deployment,
    dtype_flags,
    is_moe,
    kv_cache_dtype,
    limit_flags,
    parallel_flags,
    quantization_flags,
    server_replicas,
)
from castcore.workload.spec import is_factory, load_model_config, preset_names

ENGINES = ("vllm", "sglang", "trtllm")
# Each preset's checkpoint on the Hugging Face hub: the repository its castcore/workload/presets file names as its
# source (Meta-Llama-3.1-405B is now meta-llama/Llama-3.1-405B).
HUB_IDS = {
    "deepseek-v3": "deepseek-ai/DeepSeek-V3",
    "deepseek-v3.1": "deepseek-ai/DeepSeek-V3.1",
    "deepseek-v3.2": "deepseek-ai/DeepSeek-V3.2",
    "glm-4.5-air": "zai-org/GLM-4.5-Air",
    "glm-4.6": "zai-org/GLM-4.6",
    "gpt-oss-120b": "openai/gpt-oss-120b",
    "gpt-oss-20b": "openai/gpt-oss-20b",
    "kimi-k2": "moonshotai/Kimi-K2-Instruct",
    "kimi-k2-thinking": "moonshotai/Kimi-K2-Thinking",
    "kimi-linear-48b-a3b": "moonshotai/Kimi-Linear-48B-A3B-Instruct",
    "llama-3-70b": "meta-llama/Meta-Llama-3-70B",
    "llama-3-8b": "meta-llama/Meta-Llama-3-8B",
    "llama-3.1-405b": "meta-llama/Llama-3.1-405B",
    "llama-3.1-70b": "meta-llama/Llama-3.1-70B",
    "llama-3.1-8b": "meta-llama/Llama-3.1-8B",
    "llama-3.3-70b": "meta-llama/Llama-3.3-70B-Instruct",
    "llama-4-scout": "meta-llama/Llama-4-Scout-17B-16E-Instruct",
    "mistral-7b": "mistralai/Mistral-7B-v0.1",
    "mixtral-8x22b": "mistralai/Mixtral-8x22B-v0.1",
    "mixtral-8x7b": "mistralai/Mixtral-8x7B-v0.1",
    "qwen2.5-7b": "Qwen/Qwen2.5-7B",
    "qwen3-235b-a22b": "Qwen/Qwen3-235B-A22B",
    "qwen3-30b-a3b": "Qwen/Qwen3-30B-A3B",
    "qwen3-32b": "Qwen/Qwen3-32B",
    "qwen3-8b": "Qwen/Qwen3-8B",
    "qwen3-next-80b-a3b": "Qwen/Qwen3-Next-80B-A3B-Thinking",
    "nemotron-h-56b": "nvidia/Nemotron-H-56B-Base-8K",
}


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


def _yaml(data: dict[str, Any], indent: str = "") -> list[str]:
    out = []
    for key, value in data.items():
        if isinstance(value, dict):
            out += [f"{indent}{key}:", *_yaml(value, indent + "  ")]
        else:
            out.append(f"{indent}{key}: {str(value).lower() if isinstance(value, bool) else value}")
    return out


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
    replicas = server_replicas(engine, deployment, is_moe(config), notes)
    parallel, yaml = parallel_flags(engine, deployment, replicas, notes)
    quantization = quantization_flags(engine, deployment, config, notes)
    kv = kv_cache_dtype(engine, deployment, notes)
    engine_flags, more = limit_flags(engine, limits, notes)
    dtype = dtype_flags(engine, deployment, notes)
    traffic = replica_traffic(traffic, replicas)
    result = f"{engine}-bench.json" + ("l" if engine == "sglang" else "")
    bench = bench_command(engine, model_id, traffic, result, notes)
    simulate = simulate_command(engine, deployment, traffic, replicas, limits, list(castcore_options))
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
