"""End-to-end (serve) points: ``Session.serve`` with the model, batch, lengths, parallelism and dtypes the source states.

The model is a config.json under models/ (each with a ``_source`` naming the Hugging Face config it copies); the
rest of the model runs in that checkpoint's ``torch_dtype``. An fp8 weight format is TensorRT-LLM's FP8 (fp8
weights and fp8 GEMM inputs): ``weights="fp8", activations="fp8"``; an fp8 KV cache is ``kv_cache="fp8"``; a KV
dtype the source does not state is left at the model dtype and said so. Throughput is compared per device when
the source gives it per GPU (``measured.per``), else for the whole system. TensorRT-LLM before 0.7 read grouped
K/V once per query head in generation: ``kv_reads="head"``.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from fidelity.ops import NotExpressible

MODELS = Path(__file__).parent / "models"
# The model a source names -> the config shipped for it.
MODEL_FILES = {
    "meta-llama/Llama-2-7b-hf": "llama-2-7b.json",
    "meta-llama/Llama-2-13b-hf": "llama-2-13b.json",
    "meta-llama/Llama-2-70b-hf": "llama-2-70b.json",
    "meta-llama/Llama-3.1-8B-Instruct": "llama-3.1-8b-instruct.json",
    "nvidia/Llama-3.1-8B-Instruct-FP8": "llama-3.1-8b-instruct.json",
    "meta-llama/Llama-3.1-70B-Instruct": "llama-3.1-70b-instruct.json",
    "meta-llama/Llama-3.3-70B-Instruct": "llama-3.3-70b-instruct.json",
    "nvidia/Llama-3.3-70B-Instruct-FP8": "llama-3.3-70b-instruct.json",
    "nvidia/Llama-3.3-70B-Instruct-FP4": "llama-3.3-70b-instruct.json",
    "mistralai/Mistral-7B-v0.1": "mistral-7b-v0.1.json",
    "deepseek-ai/DeepSeek-V3": "deepseek-v3.json",
    "deepseek-ai/DeepSeek-R1": "deepseek-v3.json",  # DeepSeek-R1's config.json: the same architecture as V3's
    "deepseek-ai/DeepSeek-R1-0528": "deepseek-v3.json",
    "deepseek-ai/DeepSeek-V3-0324": "deepseek-v3.json",
    "nvidia/DeepSeek-R1-FP4": "deepseek-r1-fp4.json",  # ModelOpt NVFP4 of DeepSeek-R1: no fp8 quantization_config
    "nvidia/DeepSeek-R1-0528-FP4": "deepseek-r1-fp4.json",
    "mistralai/Mixtral-8x7B-v0.1": "mixtral-8x7b-v0.1.json",
    "Qwen/Qwen3-8B": "qwen3-8b.json",
}
SHORT_DTYPE = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}
METRICS = ("output_tokens_per_s", "ttft_s", "tpot_s")


def _quantized(text: str | None) -> bool:
    return str(text or "").startswith(("float8", "fp8"))


def _per_head_generation_attention(framework: str | None) -> bool:
    """TensorRT-LLM before 0.7: docs/source/gpt_attention.md and the masked MHA kernel at the 0.6.1 tree (commit
    138f96d4; K/V head = query head / (heads / kv_heads), one thread block per query head); CHANGELOG.md
    '0.7.0 / 0.7.1' lists 'MMHA optimization for MQA and GQA' and the XQA kernel."""
    found = re.match(r"TensorRT-LLM (\d+)\.(\d+)", framework or "")
    return bool(found) and (int(found.group(1)), int(found.group(2))) < (0, 7)


def quantized_dtypes(w: dict[str, Any], options: dict[str, Any], notes: list[str]) -> NotExpressible | None:
    """A workload's fp8 weights (TensorRT-LLM's FP8: fp8 GEMM inputs too; ``fp8-block``: DeepSeek-V3's block-scaled
    fp8), FP4 (NVFP4; Quark's MXFP4, with MXFP4 activations where the source says so) weights and fp8 KV cache
    into ``options``; a KV dtype the source does not state is left at ``options["dtype"]`` and said in ``notes``."""
    from castcore.workload.spec import KV_CACHE_DTYPES, WEIGHT_DTYPES

    # DeepSeek-V3's fp8: a scale per 128x128 weight block, activations quantized per 1x128 group
    if str(w.get("weights_dtype") or "").startswith("fp8-block"):
        if "fp8-block" not in WEIGHT_DTYPES:
            return NotExpressible("fp8 block-scaled weights: castcore has no --weights fp8-block")
        options["weights"] = "fp8-block"
    elif _quantized(w.get("weights_dtype")):
        if "fp8" not in WEIGHT_DTYPES:
            return NotExpressible("fp8 weights: castcore has no --weights fp8")
        options.update(weights="fp8", activations="fp8")
    elif str(w.get("weights_dtype") or "").startswith("fp4"):  # ModelOpt's FP4 checkpoints: NVFP4, W4A4
        options["weights"] = "nvfp4"
    elif str(w.get("weights_dtype") or "").startswith("mxfp4"):  # Quark's MXFP4: W4A4 with MXFP4 activations
        options["weights"] = "mxfp4"
        if w.get("activations_dtype") == "mxfp4":
            options["activations"] = "mxfp4"
    kv = str(w.get("kv_cache_dtype") or "")
    if _quantized(kv):
        if "fp8" not in KV_CACHE_DTYPES:
            return NotExpressible("an fp8 KV cache: castcore has no --kv-cache fp8")
        options["kv_cache"] = "fp8"
    elif kv.split()[0:1] not in (["float16"], ["bfloat16"]):
        notes.append(f"KV cache dtype {kv or 'not given'}: left at the model dtype ({options['dtype']})")
    return None


def plan_serve(point: dict[str, Any]) -> dict[str, Any] | NotExpressible:
    """``Session.serve`` keyword arguments (model, batch, lengths, deployment) and notes, or why not expressible."""
    w = point["workload"]
    if w.get("batch") is None:
        return NotExpressible(
            f"no fixed batch ({w.get('scheduling') or 'a scheduler chose it'}): castcore serves "
            "one static batch"
        )
    if w.get("input_tokens") is None or w.get("output_tokens") is None:
        return NotExpressible(
            f"input and output lengths vary per request ({w.get('dataset') or 'a dataset'}); "
            f"batch {w['batch']} is a per-instance cap, not a static batch"
        )
    if w["model"] not in MODEL_FILES:
        return NotExpressible(f"no config shipped under bench/fidelity/models/ for {w['model']}")
    if w.get("metric") not in METRICS:
        return NotExpressible(f"metric {w.get('metric')!r} is none of {', '.join(METRICS)}")

    path = MODELS / MODEL_FILES[w["model"]]
    config = json.loads(path.read_text(encoding="utf-8"))
    deployment: dict[str, Any] = {
        "dtype": SHORT_DTYPE[config["torch_dtype"]],
        "tp": w.get("tp", 1),
        "pp": w.get("pp", 1),
    }
    notes: list[str] = []
    refused = quantized_dtypes(w, deployment, notes)
    if refused is not None:
        return refused
    if _per_head_generation_attention(w.get("framework") or point.get("framework")):
        deployment["kv_reads"] = "head"
        notes.append(
            "TensorRT-LLM before 0.7 generates with its masked MHA kernel, one block per query head reading "
            "its K/V head (no grouped-KV sharing; 'MMHA optimization for MQA and GQA' and XQA came in 0.7): "
            "--kv-reads head"
        )
    return {
        "model": os.path.relpath(path),
        "batch": w["batch"],
        "input_tokens": w["input_tokens"],
        "output_tokens": w["output_tokens"],
        "deployment": deployment,
        "metric": w["metric"],
        "notes": notes,
        "describe": (
            f"serve {MODEL_FILES[w['model']].removesuffix('.json')} batch {w['batch']}, "
            f"{w['input_tokens']} in + {w['output_tokens']} out, "
            + ", ".join(f"{k} {v}" for k, v in deployment.items() if v not in (1, None))
        ),
    }


def serve_figure(report, metric: str, unit: str, per: str | None) -> float:
    """The ServeReport's figure in the source's metric and unit."""
    if metric == "output_tokens_per_s":
        data = report.to_dict()
        return data["output_tokens_per_s_per_device"] if per != "system" else data["output_tokens_per_s"]
    seconds = report.ttft_s if metric == "ttft_s" else report.tpot_s
    return seconds * {"s": 1.0, "ms": 1e3, "us": 1e6}[unit]


def estimate_serve(session, profile, point: dict[str, Any], plan: dict[str, Any]) -> dict[str, Any]:
    report = session.serve(
        plan["model"],
        input_tokens=plan["input_tokens"],
        output_tokens=plan["output_tokens"],
        batch=plan["batch"],
        device=profile,
        **plan["deployment"],
    )
    measured = point["measured"]
    memory = report.memory()
    notes = list(plan["notes"])
    if not memory["fits"]:
        notes.append(
            f"castcore's memory estimate does not fit: peak {memory['peak_bytes'] / 2**30:.1f} GiB of "
            f"{memory['device_memory_bytes'] / 2**30:.1f} GiB per device"
        )
    return {
        "estimated": serve_figure(report, plan["metric"], measured["unit"], measured.get("per")),
        "estimated_s": report.latency_s,
        "notes": notes,
        "how": {
            "ttft_s": report.ttft_s,
            "tpot_s": report.tpot_s,
            "latency_s": report.latency_s,
            "devices": report.devices,
        },
    }
