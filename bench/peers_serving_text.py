"""The Markdown of bench/peers_serving.py: the figures, the castcore/peer ratios, and why they differ.

The mechanisms are written once below, each citing the peer's file (aiconfigurator-core 0.12.0, vidur 0.0.26);
every gap over 15% is then explained from the figures of the run: each tool's time for the same mixed step and
the same decode-only step, the batch and KV capacity each used, and how each turns steps into TTFT and TPOT.
"""

from __future__ import annotations

import math
import statistics

GAP = 0.15  # gaps beyond this are explained
METRICS = ("output_throughput", "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms")
NAMES = {
    "output_throughput": "output tok/s",
    "mean_ttft_ms": "mean TTFT",
    "median_ttft_ms": "median TTFT",
    "p99_ttft_ms": "p99 TTFT",
    "mean_tpot_ms": "mean TPOT",
}
GPU = {"h100-sxm5-80gb": "H100 SXM", "h200-sxm": "H200 SXM"}
PEERS = (("aiconfigurator", "AIConfigurator"), ("vidur", "Vidur"))
# op classes both castcore's records (bench/peers.py's buckets) and AIConfigurator's per-op figures fall in
CLASSES = ("GEMM", "attention", "collectives", "other")
CASTCORE_CLASS = {
    "qkv": "GEMM",
    "out proj": "GEMM",
    "ffn": "GEMM",
    "router": "GEMM",
    "lm head": "GEMM",
    "attention": "attention",
    "all-reduce": "collectives",
    "all-gather": "collectives",
    "all-to-all": "collectives",
}

# Why a peer cannot run a scenario: a short name for the table, the reason in full beneath it.
AIC_NO_RATE = (
    "no arrival process",
    "AIConfigurator has no arrival process: its agg (in-flight batching) estimate is the steady state of a "
    "fixed batch of concurrent requests (aiconfigurator cli estimate --batch-size; aiconfigurator/cli/api.py, "
    "cli_estimate), so an open-loop request rate has nothing to go in",
)
VIDUR_NO_MODEL = (
    "no MoE model",
    "Vidur 0.0.26 has no MoE model (vidur/config/model_config.py: Llama 2 and 3, "
    "CodeLlama, InternLM, Phi-2, Qwen)",
)
VIDUR_NO_DEVICE = (
    "no H200",
    "Vidur 0.0.26 has no H200 (vidur/types/device_sku_type.py: A40, A100, H100, L40)",
)
VIDUR_NO_CLOSED_LOOP = (
    "no closed loop",
    "Vidur 0.0.26 generates open-loop arrivals only (vidur/request_generator: "
    "static, Poisson, gamma and trace intervals); it has no closed loop of C requests in flight",
)
VIDUR_NO_DATASET = (
    "no profiling dataset named",
    "Vidur 0.0.26 reads a model's profiles from a Hugging Face dataset and names one only for "
    "Llama-3-8B on an H100 (its default, project-vajra/dev-staging-meta-llama-llama-3-8b-h100, "
    "vidur/config/config.py); none is named for {model} (bench/peers_serving.py --vidur-dataset "
    "takes one)",
)
VIDUR_NO_PROFILES = (
    "no profiling data here",
    "Vidur 0.0.26 ships no profiling data: its execution-time predictor downloads the model's and "
    "the network's profiles from Hugging Face datasets at run time (vidur/execution_time_predictor/"
    "sklearn_execution_time_predictor.py, _get_input_files; even its dummy predictor does), here "
    "{datasets}. The bench runs Vidur offline from local copies of those datasets "
    "(bench/peers_data/vidur/README.md), and there are none ({where}). They are to be had from the "
    "Hugging Face hub only, out of reach here: the public GitHub repository microsoft/vidur (main at "
    "7d47513, 2024-11-19, and its history) holds H100 profiles of Llama-2-7B and -70B, "
    "CodeLlama-34B, InternLM-20B, Qwen-72B and Phi-2 and Llama 3 profiles for the A100 only: none "
    "of Llama 3 on an H100",
)


MECHANISMS = {
    "kernels": (
        "Kernel times: measured tables against a roofline",
        "AIConfigurator looks each operator up in tables NVIDIA measured with vLLM 0.24.0 on the GPU "
        "(aiconfigurator-core 0.12.0, systems/data/<gpu>/{gemm,attention,...}/vllm/0.24.0; the run's "
        "per_ops_source marks the GEMMs and attention 'silicon', the norms, activation and embedding "
        "'empirical'). castcore prices each operator of the captured model by its roofline on the device "
        "profile (castpack-nvidia): the larger of compute and memory time at the profile's efficiencies, plus a "
        "launch time; its tensor-parallel all-reduces come from castpack-collectives' alpha-beta model (the fastest "
        "of ring, recursive doubling, direct and hierarchical over the profile's interconnect), AIConfigurator's "
        "from measured vLLM all-reduces; its Mixtral experts are GEMMs at the profile's efficiency, "
        "AIConfigurator's the measured fused-MoE kernel. A step-time ratio away from 1 is one of these: the "
        "op-class table shows which.",
    ),
    "scheduling": (
        "Scheduling: a fixed steady state against an iteration-level engine",
        "AIConfigurator's agg estimate holds exactly b requests running; each request's prompt runs in one "
        "mixed step of ctx_tokens (= ISL) tokens beside the other b-1 decodes, one prompt per step, as it "
        "reads vLLM V1's max_num_partial_prefills=1 (aiconfigurator_core/sdk/backends/vllm_backend.py, "
        "_mix_step_gen_tokens), and TPOT is the mean of its mixed and decode-only steps over a request's "
        "life (sdk/backends/base_backend.py). castcore simulates every iteration: each one packs the "
        "running decodes and as many prompt tokens as the 8,192-token budget leaves, several prompts at "
        "once, arrival by arrival. With fixed lengths in a closed loop the C requests start together and "
        "finish together, so castcore runs them in waves: C prompts (C x ISL tokens) in a few full-budget "
        "iterations, then decode-only iterations at batch C.",
    ),
    "ttft": (
        "TTFT: a calibrated formula against a simulated queue",
        "AIConfigurator's vLLM TTFT is (prefill step x ceil(ISL/ctx_tokens) + 0.8 ms x layers of CPU dispatch) "
        "x min(1 + log2(b)/8, 2), both the dispatch term and the queueing factor calibrated to NVIDIA's silicon "
        "corpus (vllm_backend.py, _prefill_dispatch_overhead_ms and _ttft_queuing_factor). castcore's TTFT is "
        "the simulated wait plus the iterations until the prompt's last chunk: no dispatch term (its per-kernel "
        "launch times are inside each step) and no fitted factor.",
    ),
    "throughput": (
        "Throughput: steady state against a whole run",
        "AIConfigurator's throughput is b x (OSL-1) over the steps of one request's life, capped by "
        "Little's law (vllm_backend.py, _throughput_cap); its tokens/s counts OSL-1 tokens a request, so "
        "the tables here show its requests/s x OSL, as vLLM's output_throughput counts. castcore's is "
        "the tokens of the run over its duration, ramp-up and drain included.",
    ),
    "offline": (
        "Offline: the largest batch each memory model admits",
        "For all-at-once traffic AIConfigurator is run at the largest batch its own memory model admits (up to "
        "the request count and 1,024 running requests; found by bisection over its OOM answer), at its "
        "steady state; castcore admits requests while its KV blocks last (0.9 of the device less the weights "
        "and a full budget's activations) and runs the queue down to the last request. Their TTFT differ by "
        "construction: castcore's includes the wait of requests that arrived at once behind the others, "
        "AIConfigurator's is the steady-state formula above.",
    ),
    "vidur-kernels": (
        "Vidur's iteration: random forests over profiled kernels",
        "Vidur prices an iteration as its layers times the sum of per-op times that random forests "
        "(scikit-learn; here 250 trees, its depth and split grids, a 3-fold search) predict from its "
        "profiled kernel medians (vidur/execution_time_predictor/sklearn_execution_time_predictor.py): "
        "the projections, MLP, norms, RoPE, residual add and KV-cache save against the iteration's "
        "token count; prefill attention per prompt against its KV length and chunk (rounded up to 32 "
        "tokens); decode attention against the batch size and the batch's mean KV length (rounded up "
        "to 256), plus 10% for batching GQA decodes; under TP the all-reduce against the token count "
        "plus 0.02 ms. Its iteration has no embedding, LM head or sampling and no CPU time (the terms "
        "of its ExecutionTime, base_execution_time_predictor.py). castcore prices each op of the "
        "captured model by its roofline ([kernels]).",
    ),
    "vidur-scheduling": (
        "Vidur's vLLM scheduler: prompt-only and decode-only iterations",
        "Vidur's vLLM scheduler (vidur/scheduler/replica_scheduler/vllm_replica_scheduler.py) is "
        "vLLM's first scheduler: an iteration takes whole waiting prompts while KV blocks, the "
        "8,192-token budget and the 1,024-request cap allow, and only when none is waiting an "
        "iteration of every running request's decode; prompts and decodes never share an "
        "iteration, and the running decodes wait while prompts run. castcore's vLLM preset packs "
        "the running decodes and prompt tokens into the same iteration, as vLLM V1 does.",
    ),
    "vidur-capacity": (
        "Vidur's KV capacity",
        "Vidur's KV cache holds 0.9 of the device's memory less its count of the weights, over "
        "the KV bytes of a token (vidur/utils/memory_planner.py): no activations or CUDA graphs are "
        "set aside. castcore's holds 0.9 of the memory less the weights and a full budget's "
        "activations.",
    ),
}


def fmt(value, digits: int = 0) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def ratio_text(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def progress(row: dict) -> str:
    parts = []
    for key, name in (("castcore", "castcore"),) + PEERS:
        r = row[key]
        if "crash" in r or "na" in r:
            parts.append(f"{name} n/a")
        else:
            parts.append(
                f"{name} {fmt(r.get('output_throughput'))} tok/s, TTFT {fmt(r.get('mean_ttft_ms'), 1)} ms, "
                f"TPOT {fmt(r.get('mean_tpot_ms'), 2)} ms"
            )
    return "; ".join(parts)


def _spread(values: list[float]) -> dict:
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "within_15pct": sum(abs(v - 1) <= GAP for v in values),
        "count": len(values),
    }


def summary(rows: list[dict]) -> dict:
    """Per peer and traffic (closed loop, offline, rate): the scenarios it ran, the median and range of
    castcore/peer for each figure, and of castcore/peer for the same mixed and decode-only steps."""
    out = {}
    for key, _ in PEERS:
        out[key] = {
            "ran": sum(1 for r in rows if r[f"castcore_vs_{key}"]),
            "not_run": sum(1 for r in rows if not r[f"castcore_vs_{key}"]),
        }
        for mode in ("concurrency", "offline", "rate"):
            ran = [r for r in rows if r[f"castcore_vs_{key}"] and r["mode"] == mode]
            if not ran:
                continue
            ratios = {
                m: _spread(values)
                for m in METRICS
                if (
                    values := [
                        r[f"castcore_vs_{key}"]["ratios"][m]
                        for r in ran
                        if m in r[f"castcore_vs_{key}"]["ratios"]
                    ]
                )
            }
            steps = {
                name: _spread(values)
                for name in ("mix_step", "decode_step")
                if (
                    values := [
                        r[f"castcore_vs_{key}"][f"castcore_{name}_ms"] / r[key][f"{name}_ms"]
                        for r in ran
                        if f"castcore_{name}_ms" in r[f"castcore_vs_{key}"]
                    ]
                )
            }
            out[key][mode] = {"ran": len(ran), "ratios": ratios, "step_ratios": steps}
    return out


def _cell(r: dict, metric: str) -> str:
    return fmt(r.get(metric), 2 if metric == "mean_tpot_ms" else 0 if metric == "output_throughput" else 1)


def _spread_text(d: dict) -> str:
    return f"{d['median']:.2f} ({d['min']:.2f}-{d['max']:.2f})" if d["count"] > 1 else f"{d['median']:.2f}"


def _headline(result: dict) -> list[str]:
    lines = []
    s = result["summary"]
    modes = {"concurrency": "closed loop", "offline": "offline", "rate": "at a rate"}
    for key, name in PEERS:
        if not s[key]["ran"]:
            reasons = sorted({row[key]["why"] for row in result["rows"] if "na" in row[key]})
            lines.append(
                f"- **{name} ran no scenario**: {'; '.join(reasons)} (each row says which, and the notes "
                "under the table why)."
            )
            continue
        for mode, words in modes.items():
            if mode not in s[key]:
                continue
            m = s[key][mode]
            parts = [
                f"{NAMES[k]} {_spread_text(m['ratios'][k])}"
                for k in ("output_throughput", "mean_ttft_ms", "mean_tpot_ms")
                if k in m["ratios"]
            ]
            steps = "; ".join(
                f"{'mixed' if k == 'mix_step' else 'decode-only'} step {_spread_text(v)}"
                for k, v in m["step_ratios"].items()
            )
            lines.append(
                f"- **castcore / {name}, {words}** ({m['ran']} scenario{'s' * (m['ran'] > 1)}; median and "
                f"range): {', '.join(parts)}"
                + (f"; the same iterations priced by each: {steps}" if steps else "")
                + "."
            )
    return lines


def _main_table(rows: list[dict], notes: dict[str, int]) -> list[str]:
    lines = [
        "| scenario | tool | output tok/s | mean TTFT (ms) | median TTFT (ms) | p99 TTFT (ms) | mean TPOT (ms) | "
        "castcore / tool (tok/s, mean TTFT, TPOT) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        cc = row["castcore"]
        first = True
        for key, name in (("castcore", "castcore"),) + PEERS:
            r = row[key]
            label = row["label"] if first else ""
            first = False
            if "crash" in r:
                lines.append(f"| {label} | {name} | castcore failed: {r['crash']} | | | | | |")
                continue
            if "na" in r:
                mark = notes.setdefault(r["na"], len(notes) + 1)
                lines.append(f"| {label} | {name} | not run: {r['why']} [{mark}] | | | | | |")
                continue
            ratios = row.get(f"castcore_vs_{key}", {}).get("ratios", {}) if key != "castcore" else {}
            ratio = (
                ", ".join(
                    ratio_text(ratios.get(m)) for m in ("output_throughput", "mean_ttft_ms", "mean_tpot_ms")
                )
                if key != "castcore"
                else ""
            )
            if key == "aiconfigurator":
                name = f"{name} (b={r['batch']})"
            lines.append(
                f"| {label} | {name} | " + " | ".join(_cell(r, m) for m in METRICS) + f" | {ratio} |"
            )
        del cc
    return lines


def _decode(c: dict, a: dict) -> tuple[str, str, str]:
    """castcore's and AIConfigurator's decode-only step and their ratio, or dashes where AIConfigurator has none
    (every step of its request life carries a prompt when b >= OSL)."""
    if "castcore_decode_step_ms" not in c:
        return "-", "none", "-"
    return (
        f"{c['castcore_decode_step_ms']:.2f}",
        f"{a['decode_step_ms']:.2f}",
        f"{c['castcore_decode_step_ms'] / a['decode_step_ms']:.2f}",
    )


def _steps_table(rows: list[dict]) -> list[str]:
    lines = [
        "| scenario | AIC batch | mixed step: tokens | castcore (ms) | AIC (ms) | ratio | decode-only step "
        "(ms): castcore | AIC | ratio | AIC TTFT terms: dispatch (ms) x queueing | castcore KV (requests) | "
        "castcore mean running |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        a, c, cc = row["aiconfigurator"], row["castcore_vs_aiconfigurator"], row["castcore"]
        if not c or "castcore_mix_step_ms" not in c:
            continue
        lines.append(
            f"| {row['label']} | {a['batch']} | {a['mix_prompt_tokens']} + {a['mix_decodes']} decodes | "
            f"{c['castcore_mix_step_ms']:.1f} | {a['mix_step_ms']:.1f} | {c['castcore_mix_step_ms'] / a['mix_step_ms']:.2f} "
            f"| {' | '.join(_decode(c, a))} | {a['ttft_dispatch_ms']:.1f} x "
            f"{a['ttft_queuing_factor']:.2f} | {cc['kv_requests']:,} | {cc['mean_running']:.0f} |"
        )
    return lines


def _classes_table(rows: list[dict]) -> list[str]:
    lines = [
        "| scenario | step | tool | total (ms) | " + " | ".join(CLASSES) + " |",
        "|---|---|---|---|" + "---|" * len(CLASSES),
    ]
    for row in rows:
        c = row["castcore_vs_aiconfigurator"]
        for key, step in (
            ("prompt_classes_ms", f"prompt of {row['isl']}"),
            ("decode_classes_ms", f"decode at batch {row['aiconfigurator'].get('batch')}"),
        ):
            if key not in c:
                continue
            for tool, name in (("castcore", "castcore"), ("aiconfigurator", "AIConfigurator")):
                d = c[key][tool]
                lines.append(
                    f"| {row['label'] if tool == 'castcore' else ''} | {step if tool == 'castcore' else ''} "
                    f"| {name} | {d['total']:.2f} | " + " | ".join(f"{d[k]:.2f}" for k in CLASSES) + " |"
                )
    return lines


def _classes_text(c: dict, key: str) -> str:
    """castcore against AIConfigurator by op class, the classes that differ most first."""
    if key not in c:
        return ""
    cc, aic = c[key]["castcore"], c[key]["aiconfigurator"]
    order = sorted(CLASSES, key=lambda k: -abs(cc[k] - aic[k]))
    calls = (
        f" (castcore's {cc['collective_calls']} collectives, {cc['collectives'] / cc['collective_calls'] * 1e3:.0f}"
        " us each on average)"
        if cc.get("collective_calls")
        else ""
    )
    return "; by op class, castcore vs AIConfigurator: " + ", ".join(
        f"{k} {cc[k]:.2f} vs {aic[k]:.2f} ms" + (calls if k == "collectives" else "")
        for k in order
        if cc[k] or aic[k]
    )


def _pct(x: float) -> str:
    return f"{(x - 1) * 100:+.0f}%"


def explain_aic(row: dict, metric: str) -> str:
    """One gap between castcore and AIConfigurator, by mechanism, from the run's figures."""
    a, c, cc = row["aiconfigurator"], row["castcore_vs_aiconfigurator"], row["castcore"]
    mix = c["castcore_mix_step_ms"] / a["mix_step_ms"]
    b, isl = a["batch"], row["isl"]
    if "castcore_decode_step_ms" in c:
        dec = c["castcore_decode_step_ms"] / a["decode_step_ms"]
        decode = (
            f"decode-only at batch {b} {c['castcore_decode_step_ms']:.2f} vs {a['decode_step_ms']:.2f} ms "
            f"({_pct(dec)}{_classes_text(c, 'decode_classes_ms') if abs(dec - 1) > 0.1 else ''})"
        )
    else:
        decode = f"AIConfigurator has no decode-only step at b={b} (b >= OSL: every step carries a prompt)"
    steps = (
        f"the same iterations: mixed ({a['mix_prompt_tokens']} prompt tokens + {a['mix_decodes']} decodes) "
        f"castcore {c['castcore_mix_step_ms']:.1f} ms vs {a['mix_step_ms']:.1f} ms ({_pct(mix)}"
        f"{_classes_text(c, 'prompt_classes_ms') if abs(mix - 1) > 0.1 else ''}), {decode} "
        "[kernels]"
    )
    waves = ""
    if cc.get("mixed_iteration_prefill_tokens"):
        waves = (
            f"castcore's {cc['mixed_iterations']:,} iterations with prompt tokens carried "
            f"{cc['mixed_iteration_prefill_tokens']:,.0f} of them on average and took "
            f"{cc['mixed_iteration_ms']:.1f} ms, its {cc['decode_iterations']:,} decode-only ones "
            f"{cc['decode_iteration_ms'] or 0:.2f} ms at {cc['decode_iteration_running'] or 0:.0f} running"
        )
    if metric == "mean_tpot_ms":
        share = a["mix_steps"] / max(a["mix_steps"] + a["decode_steps"], 1)
        return (
            f"{steps}; AIConfigurator's TPOT weighs its mixed step into {share:.0%} of a request's steps (one "
            f"prompt per step, b={b} of them per request life), castcore's requests meet prompt-carrying "
            f"iterations only where the engine had prompts to run: {waves} [scheduling]"
        )
    if metric.endswith("ttft_ms"):
        formula = (
            f"AIConfigurator's TTFT = ({a['mix_step_ms']:.1f} ms step + {a['ttft_dispatch_ms']:.1f} ms dispatch) x "
            f"{a['ttft_queuing_factor']:.2f} queueing = {a['mean_ttft_ms']:.1f} ms [ttft]"
        )
        if row["mode"] == "offline":
            return (
                f"{formula}, a steady-state figure; castcore's is the wait of {row['requests']} requests that "
                f"arrived at once for the ones ahead of them (at most {cc['kv_requests']:,} fit its KV cache), "
                f"{cc[metric]:.0f} ms [offline]"
            )
        prompts = math.ceil(b * isl / 8192)
        return (
            f"{formula}; castcore's comes from its queue: the {b} requests of the loop run in lockstep waves "
            f"(fixed lengths), so each wave's {b} prompts ({b * isl:,} tokens) take about {prompts} full-budget "
            f"iterations and a request waits for the ones ahead of it: {waves} [scheduling]; {steps}"
        )
    if metric == "output_throughput":
        osl = row["osl"]
        steps_ms = a["mix_steps"] * a["mix_step_ms"] + a["decode_steps"] * a["decode_step_ms"]
        by_steps = b * (osl - 1) * 1e3 / steps_ms
        bound = (
            f"its step bound, b x (OSL-1) over a request life of {a['mix_steps']:.0f} mixed steps and "
            f"{a['decode_steps']:.0f} decode-only ones ({steps_ms / 1e3:.1f} s)"
            if by_steps <= a["aic_tokens_per_s"] * 1.001
            else f"Little's law, b x (OSL-1) over its {a['request_latency_ms']:.0f} ms request latency"
        )
        prompts = ""
        if cc.get("mixed_iteration_ms"):
            prompts = (
                f"; prompt tokens per second in prompt-carrying iterations: castcore "
                f"{cc['mixed_iteration_prefill_tokens'] / cc['mixed_iteration_ms'] * 1e3:,.0f} "
                f"({cc['mixed_iteration_prefill_tokens']:,.0f} tokens, several prompts, in "
                f"{cc['mixed_iteration_ms']:.0f} ms), AIConfigurator "
                f"{a['mix_prompt_tokens'] / a['mix_step_ms'] * 1e3:,.0f} (one prompt a step) [scheduling]"
            )
        extra = ""
        if row["mode"] == "offline":
            extra = (
                f"; AIConfigurator ran at its largest admitted batch b={b}, castcore at a mean of "
                f"{cc['mean_running']:.0f} running (its KV cache holds {cc['kv_requests']:,} such requests), "
                f"its {cc['duration']:.1f} s including the ramp-up and the drain of the last requests [offline]"
            )
        return (
            f"AIConfigurator's throughput is {bound} [throughput]; castcore's is the run's tokens over its "
            f"{cc['duration']:.1f} s{prompts}{extra}; {steps}"
        )
    return steps


def _vidur_steps(row: dict) -> str:
    """Vidur's mean prompt-carrying and decode-only iterations against castcore's price of the same ones."""
    v, c = row["vidur"], row["castcore_vs_vidur"]
    parts = []
    if "castcore_mix_step_ms" in c:
        parts.append(
            f"Vidur's mean prompt-carrying iteration ({v['mix_prompt_tokens']:,.0f} prompt tokens + "
            f"{v['mix_decodes']:.0f} decodes) {v['mix_step_ms']:.1f} ms, castcore's price of the same "
            f"iterations {c['castcore_mix_step_ms']:.1f} ms "
            f"({_pct(c['castcore_mix_step_ms'] / v['mix_step_ms'])})"
        )
    if "castcore_decode_step_ms" in c:
        parts.append(
            f"its mean decode-only iteration at batch {v['decode_running']:.0f} (mean KV "
            f"{v['decode_kv']:,.0f}) {v['decode_step_ms']:.2f} ms, castcore's "
            f"{c['castcore_decode_step_ms']:.2f} ms at KV ISL + OSL/2 "
            f"({_pct(c['castcore_decode_step_ms'] / v['decode_step_ms'])})"
        )
    return "the same iterations: " + ", ".join(parts) + " [vidur-kernels]" if parts else ""


def explain_vidur(row: dict, metric: str) -> str:
    """One gap between castcore and Vidur, by mechanism, from the run's figures."""
    v, cc = row["vidur"], row["castcore"]
    steps = _vidur_steps(row)
    runs = (
        f"Vidur ran {v['iterations']:,} iterations ({v['mix_steps']:,} with prompts; mean running "
        f"{v['mean_running']:.0f}) in {v['duration']:.1f} s, castcore {cc['iterations']:,} "
        f"({cc['mixed_iterations']:,} with prompts; mean running {cc['mean_running']:.0f}) in "
        f"{cc['duration']:.1f} s [vidur-scheduling]"
    )
    capacity = (
        f"KV capacity: Vidur {v['kv_tokens']:,} tokens ({v['kv_requests']:,} requests of ISL + OSL), "
        f"castcore {cc['kv_tokens']:,} ({cc['kv_requests']:,}) [vidur-capacity]"
    )
    if row["mode"] == "offline" and metric != "mean_tpot_ms":
        return f"{capacity}; {runs}; {steps}"
    return f"{steps}; {runs}"


def _gaps(rows: list[dict]) -> list[str]:
    lines = []
    for row in rows:
        for key, name in PEERS:
            c = row[f"castcore_vs_{key}"]
            if not c:
                continue
            for metric, value in c["ratios"].items():
                if abs(value - 1) <= GAP:
                    continue
                why = explain_aic(row, metric) if key == "aiconfigurator" else explain_vidur(row, metric)
                lines.append(f"- {row['label']}, {NAMES[metric]}: castcore/{name} {value:.2f}. {why}.")
    return lines or ["- none: every figure both tools give is within 15%."]


def markdown(result: dict, machine: dict) -> str:
    versions = result["versions"]
    rows = result["rows"]
    notes: dict[str, int] = {}  # the reasons peers did not run, numbered as the table meets them
    table = _main_table(rows, notes)
    lines = [
        "# castcore simulate against Vidur and AIConfigurator under traffic",
        "",
        f"castcore {versions['castcore']}, AIConfigurator {versions['aiconfigurator']} (aiconfigurator-core "
        f"{versions['aiconfigurator-core']}, {result['aiconfigurator_backend']['backend']} backend, tables of vLLM "
        f"{result['aiconfigurator_backend']['version']}), Vidur {versions['vidur']}; {machine['processor'] or '-'}, "
        f"{machine['cpus']} CPUs, Python {machine['python']}, {machine['date']}; "
        f"{result['seconds']:.0f} s. `nox -s peers_serving` "
        "(or `python bench/peers_serving.py` beside the peers)"
        + (" `--quick`" if result["quick"] else "")
        + ".",
        "",
        "Every tool gets the same model, GPU, TP, fixed prompt/output lengths, request count and rate or "
        "concurrency, and vLLM's limits: castcore `--engine vllm` (1,024 running requests, 8,192 batched tokens, "
        "16-token blocks, 0.9 of the memory), AIConfigurator its vLLM backend at that memory share (its batch b is "
        "the concurrency; offline, the largest batch its memory model admits), Vidur its vLLM scheduler with the "
        "same limits. AIConfigurator's Llama is Llama 3.1, the same layers as castcore's Llama 3 (it differs in "
        "RoPE scaling and context only). Ratios are castcore/peer; gaps over 15% are explained below. "
        "AIConfigurator gives one (mean) TTFT, no median or p99.",
        "",
        "## Headline",
        "",
        *_headline(result),
        "",
        "## Figures",
        "",
        *table,
        "",
        *[f"- [{n}] {why}" for why, n in notes.items()],
        "",
        "## The same iterations priced by castcore and AIConfigurator",
        "",
        "AIConfigurator's own step compositions (its mixed step: ctx_tokens = ISL prompt tokens beside b-1 decodes; "
        "its decode-only step at batch b), priced by castcore's step-time model (castcore.serving.step_time, what "
        "castcore simulate runs, decodes at KV length ISL + OSL/2); AIConfigurator's TTFT terms; castcore's KV "
        "capacity in requests of ISL + OSL tokens and its mean running batch.",
        "",
        *_steps_table(rows),
        "",
        "Where each puts a step's time, by op class: the prompt part of the mixed step (castcore: `castcore estimate`'s "
        "prefill of the prompt alone; AIConfigurator: its mixed step's context ops) and the decode-only step "
        "(castcore: its decode step at KV length ISL + OSL/2; AIConfigurator: its decode-only step's ops). GEMM "
        "holds the projections, FFN or experts and LM head; collectives the tensor-parallel all-reduces (and "
        "AIConfigurator's MoE pre- and post-dispatch, the experts' communication); other the norms, activation, "
        "rotary embedding, embedding and castcore's MoE routing.",
        "",
        *_classes_table(rows),
        "",
        "## Every gap over 15%",
        "",
        "Each names the figures it comes from and, in brackets, the mechanism (next section).",
        "",
        *_gaps(rows),
        "",
        "## Mechanisms",
        "",
    ]
    for key, (title, body) in MECHANISMS.items():
        lines += [f"- **[{key}] {title}.** {body}"]
    return "\n".join(lines) + "\n"
