"""The figures, ratios and explanations of bench/peers_disagg_spec.py, and its Markdown.

derive() adds to each row its castcore/AIConfigurator ratios, castcore's closed-form figures from its own step
times, and an explanation of every gap over 15% drawn from the run's figures; markdown() writes the page.
"""

from __future__ import annotations

import statistics

GAP = 0.15
GPU = {"h100-sxm5-80gb": "H100 SXM", "h200-sxm": "H200 SXM"}
FIGURES = (
    "completed",
    "duration",
    "request_throughput",
    "output_throughput",
    "mean_ttft_ms",
    "median_ttft_ms",
    "p99_ttft_ms",
    "mean_tpot_ms",
    "mean_itl_ms",
    "devices",
    "mean_kv_transfer_ms",
    "spec_tokens_per_step",
    "prefix_cache_hits",
    "cached_prompt_tokens",
)
NAMES = {
    "per_gpu": "output tok/s per GPU",
    "request_rate": "requests/s",
    "ttft": "mean TTFT",
    "tpot": "mean TPOT",
    "throughput": "output tok/s",
    "speedup": "speed-up over no feature",
}
AIC_FACTORS = {"prefill": 1.1, "decode": 1.08, "ttft": 1.8, "prefill_rate": 0.9, "decode_rate": 0.92}

MECHANISMS = [
    (
        "AIConfigurator's disaggregation: rate matching of two static estimates",
        "cli_estimate(mode='disagg') (aiconfigurator/cli/api.py, _run_disagg_estimate; sdk/inference_session.py, "
        "run_disagg; sdk/picking.py, _build_disagg_summary_dict) prices one static prefill batch of the prefill batch "
        "size (x 1.1, its prefill latency correction) and one static decode run at the decode batch (x 1.08); a worker "
        "serves batch/latency requests a second, and the deployment the smaller of prefill workers x that x 0.9 and "
        "decode workers x that x 0.92 (its rate-matching derating for pipeline bubbles and unfilled decode slots). TTFT "
        "is the prefill latency x 1.8 (a fixed correction for queueing at the prefill workers), TPOT the decode step. No "
        "KV transfer is priced: it is inside those factors. castcore simulates both pools request by request "
        "(castcore/serving/disaggregated.py): each prompt in its prefill instance's iterations (here one batch of the "
        "same size: the token budget is the prefill batch's prompts), its KV sent over the interconnect level spanning "
        "both instances (NVLink inside a node; the network between two device types), then the decode instance's "
        "iterations, at most the decode batch running; nothing is derated or corrected. Each tool's step times are "
        "its own: AIConfigurator's measured vLLM 0.24.0 tables, castcore's roofline of the captured model "
        "(bench/results/peers_serving.md compares the two step by step).",
    ),
    (
        "Speculative decoding: MTP layers against a draft model",
        "AIConfigurator's nextn (aiconfigurator_core/sdk/models/helpers.py, mtp_scale_factor; sdk/rust_engine_step.py; "
        "aiconfigurator/sdk/speculative.py) prices a decode step over batch x (nextn + 1) tokens with every op of the "
        "model scaled by (layers + nextn)/layers: the drafts are nextn more layers of the model's shape run over all "
        "the verified tokens, its embedding and LM head scaled the same way, and its attention is that of batch x "
        "(nextn + 1) decode sequences, each reading its whole KV cache. TPOT is that step over 1 + nextn_accepted, "
        "the throughput scaled by the same progress and capped by Little's law. It has no separate draft model. "
        "castcore (castcore/serving/speculation.py) prices the verification pass of batch x (K + 1) tokens and then K "
        "decode steps, one after another, of the draft over the batch; here the draft is the model's own config cut to "
        "one decoder layer (its embedding and LM head kept, as an MTP module or an EAGLE head samples its drafts), and "
        "its weights and KV share the memory. The acceptance given castcore is a rate r (position i kept with r^i); "
        "AIConfigurator gets the same tokens a step, the sum of r^i, as nextn_accepted.",
    ),
    (
        "Prefix caching: a fixed cached share against a block cache",
        "AIConfigurator's prefix (sdk/config.py RuntimeConfig.prefix; the engine's context attention over prefix + "
        "new tokens) takes that many of every request's ISL as cached: each prompt computes ISL - prefix tokens "
        "attending over ISL keys. castcore's --prefix-len with --prefix-hit-rate 1 gives every prompt the same prefix; "
        "the first request to compute it leaves its whole blocks cached, held once, and a later request computes the "
        "rest over them (castcore/simulation/engine.py); requests admitted with the first, before the prefix is "
        "cached, compute it too.",
    ),
    (
        "Closed loop: TTFT",
        "With fixed lengths in a closed loop castcore's C requests start together and finish together, so a prompt "
        "waits behind the other prompts of its wave; AIConfigurator's agg TTFT is its mixed step x a queueing factor "
        "(min(1 + log2(b)/8, 2)) plus a CPU dispatch term (aiconfigurator_core/sdk/backends/vllm_backend.py). That gap "
        "is there without the features too (bench/results/peers_serving.md, 'TTFT'); the tables give it as the "
        "no-feature ratio beside the featured one.",
    ),
]

NOT_RUN = [
    (
        "Vidur 0.0.26",
        "has a CacheConfig.enable_prefix_caching field (vidur/config/config.py) that nothing in the simulator reads, "
        "and its requests carry token counts only (vidur/entities/request.py), so no prefix can be shared; it has no "
        "disaggregation and no speculative decoding; and it cannot run here at all without its profiles "
        "(bench/peers_data/vidur/README.md).",
    ),
    (
        "LLMServingSim",
        "models prefix caching (a port of vLLM's block pool and block hashing, serving/core/block_pool.py and "
        "kv_cache_manager.py in casys-kaist/LLMServingSim), disaggregation and speculative decoding, but it is not "
        "distributed on a package registry: it runs with an ASTRA-Sim and Chakra C++ back end built from the "
        "repository's git submodules, and it prices iterations from layer profiles measured on the GPU, which its "
        "repository holds for the RTX 4090 and RTX PRO 6000 only (profiler/perf/); castcore has neither GPU's "
        "profile, and neither the submodules nor H100/H200 profiles can be had here, so no scenario is shared.",
    ),
]


def _r(a, b):
    return a / b if a is not None and b else None


def crashed(row: dict) -> bool:
    return any(
        "crash" in v
        for k, v in row.items()
        if k.startswith("castcore") and isinstance(v, dict)
        for v in ([v] if "base" not in v else v.values())
    )


def _na(r: dict) -> str:
    return r.get("na") or r.get("crash") or ""


def fmt(value, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def ratio(value) -> str:
    return "-" if value is None else f"**{value:.2f}**" if abs(value - 1) > GAP else f"{value:.2f}"


# ------------------------------------------------------------------------------------------------------ derive


def derive(kind: str, row: dict) -> None:
    {"disagg": _disagg, "spec": _spec, "prefix": _prefix}[kind](row)
    row["explanations"] = {
        m: row["explain"][m]
        for m, v in row["ratios"].items()
        if v is not None and abs(v - 1) > GAP and m in row["explain"]
    }
    del row["explain"]


def _disagg(row: dict) -> None:
    a, off, at, st = (
        row["aiconfigurator"],
        row["castcore_offline"],
        row["castcore_at_rate"],
        row["castcore_steps"],
    )
    row["ratios"], row["explain"] = {}, {}
    if "na" in a or "crash" in off or "crash" in at:
        return
    x, y, pb, db, osl = row["prefill"], row["decode"], row["prefill_batch"], row["decode_batch"], row["osl"]
    cp = x * pb * 1e3 / st["prefill_step_ms"]
    cd = y * db * 1e3 / (st["decode_step_ms"] * (osl - 1))
    rate = a["request_rate"]
    rho, rho_d = rate / cp, rate / cd
    closed = {
        "prefill_rate": cp,
        "decode_rate": cd,
        "bound": "prefill" if cp <= cd else "decode",
        "prefill_utilization": rho,
        "decode_utilization": rho_d,
        "expected_ttft_ms": st["prefill_step_ms"] * (1 + rho / (2 * (1 - rho))) if rho < 1 else None,
    }
    row["castcore_closed_form"] = closed
    aic_p_raw = a["prefill_step_ms"] / AIC_FACTORS["prefill"]
    aic_d_raw = a["decode_step_ms"] / AIC_FACTORS["decode"]
    row["ratios"] = {
        "per_gpu": _r(off["output_throughput"] / off["devices"], a["per_gpu"]),
        "request_rate": _r(off["request_throughput"], a["request_rate"]),
        "ttft": _r(at["mean_ttft_ms"], a["ttft_ms"]),
        "tpot": _r(at["mean_tpot_ms"], a["tpot_ms"]),
        "prefill_step": _r(st["prefill_step_ms"], aic_p_raw),
        "decode_step": _r(st["decode_step_ms"], aic_d_raw),
    }
    bound_step = row["ratios"]["prefill_step" if a["bound"] == "prefill" else "decode_step"]
    derate = AIC_FACTORS[f"{a['bound']}_rate"]
    rate_text = (
        f"AIConfigurator's rate is the smaller of its pools', derated: prefill {x} x {a['prefill_worker_rate']:.2f}/s x "
        f"0.9 = {a['prefill_rate']:.2f}, decode {y} x {a['decode_worker_rate']:.2f}/s x 0.92 = {a['decode_rate']:.2f} "
        f"requests/s ({a['bound']}-bound). castcore's own steps give its pools {cp:.2f} (prefill: {x} x {pb} prompt(s) "
        f"a {st['prefill_step_ms']:.2f} ms step) and {cd:.2f} requests/s (decode: {y} x {db} requests over {osl - 1} "
        f"steps of {st['decode_step_ms']:.2f} ms) ({closed['bound']}-bound), and its run of all requests at once "
        f"delivered {off['request_throughput']:.2f} requests/s (the ramp before the decode pool fills and the drain "
        f"after the last prompt included). So the gap is the {a['bound']} pool's step ratio ({bound_step:.2f}, "
        f"castcore/AIConfigurator without its {AIC_FACTORS[a['bound']]} correction), the {derate} derating castcore "
        f"does not apply (1/{derate} = {1 / derate:.2f})"
        + (", and the pools bounding each tool differently" if closed["bound"] != a["bound"] else "")
        + (
            f"; castcore's per-GPU figure counts its {off['devices']} devices, AIConfigurator's {a['gpus']}."
            if off["devices"] != a["gpus"]
            else "."
        )
    )
    row["explain"]["per_gpu"] = row["explain"]["request_rate"] = rate_text
    wait = (
        f"its prefill pool runs at utilization {rho:.2f} of the {cp:.2f} requests/s its {st['prefill_step_ms']:.2f} ms "
        f"step serves; a queue with fixed service (M/D/1) waits {rho / (2 * (1 - rho)):.2f} steps on average, so "
        f"{closed['expected_ttft_ms']:.1f} ms is expected against the {at['mean_ttft_ms']:.1f} simulated (median "
        f"{at['median_ttft_ms']:.1f}, p99 {at['p99_ttft_ms']:.1f})"
        if rho < 1
        else f"that rate is above the {cp:.2f} requests/s its prefill pool serves ({st['prefill_step_ms']:.2f} ms a "
        f"step), so its queue grows through the run and TTFT with it (median {at['median_ttft_ms']:.1f}, p99 "
        f"{at['p99_ttft_ms']:.1f} ms)"
    )
    row["explain"]["ttft"] = (
        f"AIConfigurator's TTFT is its prefill batch's step ({aic_p_raw:.2f} ms) x 1.1 (its prefill correction) x "
        f"1.8 (its fixed queueing correction) = {a['ttft_ms']:.1f} ms, whatever the load. castcore's is simulated "
        f"with Poisson arrivals at AIConfigurator's rate, {rate:.2f} requests/s: {wait}."
    )
    slot = (
        f"its decode pool runs at utilization {rho_d:.2f} of what it serves at the full batch, so a request "
        f"seldom waits for a decode slot"
        if rho_d < 0.9
        else f"its decode pool runs at utilization {rho_d:.2f} of what it serves at the full batch, so requests "
        f"wait for a decode slot after their KV arrives, and that wait is in TPOT"
    )
    row["explain"]["tpot"] = (
        f"AIConfigurator's TPOT is its decode step at the full batch of {db} ({aic_d_raw:.2f} ms) x 1.08 (its decode "
        f"correction) = {a['tpot_ms']:.2f} ms, every decode worker assumed to run its full batch. castcore's step at "
        f"that batch is {st['decode_step_ms']:.2f} ms; at AIConfigurator's rate its decode instances hold what the "
        f"arrivals bring (Little's law: rate x (OSL - 1) x step / {y} instance(s)), and its first decode instance's "
        f"iterations ran {fmt(at['decode_iteration_running'], 1)} requests in {fmt(at['decode_iteration_ms'], 2)} ms "
        f"on average; its TPOT (vLLM bench's: from the first token to the "
        f"last over OSL - 1) carries the KV transfer ({at['mean_kv_transfer_ms']:.3f} ms) and {slot}."
    )


def _pair(row: dict, tool: str) -> tuple[dict, dict]:
    return row[tool]["base"], row[tool]["featured"]


def _agg_ratios(row: dict) -> bool:
    (ab, af), (cb, cf) = _pair(row, "aiconfigurator"), _pair(row, "castcore")
    row["ratios"], row["explain"] = {}, {}
    if any("na" in v or "crash" in v for v in (ab, af, cb, cf)):
        return False
    row["base_ratios"] = {
        "throughput": _r(cb["output_throughput"], ab["output_throughput"]),
        "ttft": _r(cb["mean_ttft_ms"], ab["ttft_ms"]),
        "tpot": _r(cb["mean_tpot_ms"], ab["tpot_ms"]),
    }
    row["speedups"] = {
        "castcore": _r(cf["output_throughput"], cb["output_throughput"]),
        "aiconfigurator": _r(af["output_throughput"], ab["output_throughput"]),
    }
    row["ratios"] = {
        "throughput": _r(cf["output_throughput"], af["output_throughput"]),
        "ttft": _r(cf["mean_ttft_ms"], af["ttft_ms"]),
        "tpot": _r(cf["mean_tpot_ms"], af["tpot_ms"]),
        "speedup": _r(row["speedups"]["castcore"], row["speedups"]["aiconfigurator"]),
    }
    b = row["base_ratios"]
    row["explain"]["ttft"] = (
        f"castcore/AIConfigurator TTFT is {b['ttft']:.2f} without the feature too: the closed loop's waves against "
        f"AIConfigurator's formula (see 'Closed loop: TTFT' below; AIConfigurator's mixed step is "
        f"{af['mix_step_ms']:.2f} ms with the feature, {ab['mix_step_ms']:.2f} without)."
    )
    return True


def _little(row: dict, tool: str) -> str:
    f = row[tool]["featured"]
    ttft, tpot = (
        (f["mean_ttft_ms"], f["mean_tpot_ms"]) if tool == "castcore" else (f["ttft_ms"], f["tpot_ms"])
    )
    return f"{row['concurrency']} x {row['osl']} / ({ttft:.1f} + {row['osl'] - 1} x {tpot:.2f} ms)"


def _spec(row: dict) -> None:
    if not _agg_ratios(row):
        return
    (ab, af), st, k, b = (
        _pair(row, "aiconfigurator"),
        row["castcore_steps"],
        row["spec_tokens"],
        row["concurrency"],
    )
    kept = 1 + row["accepted"]
    row["step_ratios"] = {
        "decode_step": _r(st["decode_step_ms"], ab["decode_step_ms"]),
        "spec_step": _r(st["spec_step_ms"], af["decode_step_ms"]),
        "mix_step": _r(st["mix_step_ms"], ab["mix_step_ms"]),
        "spec_mix_step": _r(st["spec_mix_step_ms"], af["mix_step_ms"]),
    }
    q = {k: fmt(v, 2) for k, v in row["step_ratios"].items()}
    life = (
        f" AIConfigurator's request life is {af['mix_steps']:.0f} mixed and {af['decode_steps']:.0f} decode-only "
        f"steps with speculation ({ab['mix_steps']:.0f} and {ab['decode_steps']:.0f} without): it runs one prompt "
        f"a step (vLLM V1's max_num_partial_prefills = 1, vllm_backend.py), so once speculation shortens a "
        f"request's life below its {b} requests' prompts every step is a mixed one; castcore packs several "
        f"prompts into an iteration within the 8,192-token budget, and most of its iterations are "
        f"verifications only."
    )
    steps = (
        f"Both divide a decode step by the tokens it keeps ({kept:.3f}). AIConfigurator's step with {k} MTP "
        f"draft(s) is the model over {b} x {k + 1} tokens with every op scaled by (layers + {k})/layers: "
        f"{fmt(af['decode_step_ms'] or None, 2)} ms ({ab['decode_step_ms']:.2f} without speculation). castcore's is the "
        f"verification pass of {b} x {k + 1} tokens ({st['verify_step_ms']:.2f} ms) and {k} decode step(s) of the "
        f"one-layer draft over {b} tokens, each with its own embedding and LM head ({st['draft_ms']:.2f} ms in "
        f"all): {st['spec_step_ms']:.2f} ms ({st['decode_step_ms']:.2f} without). Step ratio "
        f"{q['spec_step']} with speculation, {q['decode_step']} without; the mixed step (a prompt beside "
        f"{b - 1} verifications): castcore {st['spec_mix_step_ms']:.2f} ms, AIConfigurator "
        f"{af['mix_step_ms']:.2f} (ratio {q['spec_mix_step']}; {q['mix_step']} without speculation). AIConfigurator's attention prices {b} x {k + 1} decode sequences, each "
        f"reading its whole KV cache (its (nextn + 1) decode-batch scaling), castcore's reads each sequence's "
        f"KV once for its {k + 1} queries; its draft layers run over all {k + 1} tokens, castcore's over one "
        f"(with the draft's LM head each time)." + life
    )
    row["explain"]["tpot"] = steps + (
        " castcore's TPOT also averages its mixed iterations, where a prompt runs "
        "beside the verifications and the draft prefills it."
    )
    row["explain"]["throughput"] = row["explain"]["speedup"] = (
        f"By Little's law over the closed loop: castcore {_little(row, 'castcore')}, AIConfigurator "
        f"{_little(row, 'aiconfigurator')}; the TPOT and TTFT gaps explained here carry into it. " + steps
    )


def _prefix(row: dict) -> None:
    st, light, closed = row["castcore_steps"], row["castcore_light"], {}
    if "crash" not in light["featured"] and "crash" not in light["base"]:
        n = light["featured"]["completed"]
        hits = light["featured"]["prefix_cache_hits"]
        expected = (st["prompt_ms"] * (n - hits) + st["prompt_after_prefix_ms"] * hits) / n
        closed = {
            "cached_tokens_expected": hits * st["cached_tokens_per_hit"],
            "cached_tokens_simulated": light["featured"]["cached_prompt_tokens"],
            "token_share": (row["isl"] - st["cached_tokens_per_hit"]) / row["isl"],
            "step_share": st["prompt_after_prefix_ms"] / st["prompt_ms"],
            "light_ttft_share": _r(light["featured"]["mean_ttft_ms"], light["base"]["mean_ttft_ms"]),
            "light_ttft_expected_ms": expected,
            "light_ttft_ms": light["featured"]["mean_ttft_ms"],
            "light_ttft_base_ms": light["base"]["mean_ttft_ms"],
            "light_requests": n,
            "light_hits": hits,
        }
    row["castcore_closed_form"] = closed
    if not _agg_ratios(row):
        return
    (ab, af), cf = _pair(row, "aiconfigurator"), row["castcore"]["featured"]
    row["step_ratios"] = {
        "mix_step": _r(st["mix_step_ms"], ab["mix_step_ms"]),
        "mix_step_after_prefix": _r(st["mix_step_after_prefix_ms"], af["mix_step_ms"]),
    }
    misses = cf["completed"] - (cf["prefix_cache_hits"] or 0)
    steps = (
        f"The same mixed step (a prompt beside {row['concurrency'] - 1} decodes): castcore "
        f"{st['mix_step_after_prefix_ms']:.2f} ms with the prefix cached, {st['mix_step_ms']:.2f} without; "
        f"AIConfigurator {af['mix_step_ms']:.2f} and {ab['mix_step_ms']:.2f} (ratios "
        f"{row['step_ratios']['mix_step_after_prefix']:.2f} and {row['step_ratios']['mix_step']:.2f}). castcore's "
        f"{misses} request(s) admitted before the prefix was cached computed it in full; AIConfigurator's every "
        f"request skips it."
    )
    row["explain"]["tpot"] = row["explain"]["throughput"] = row["explain"]["speedup"] = (
        f"By Little's law over the closed loop: castcore {_little(row, 'castcore')}, AIConfigurator "
        f"{_little(row, 'aiconfigurator')}. " + steps
    )


# ----------------------------------------------------------------------------------------------------- summary


def _spread(values: list[float]) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    mid = statistics.median(values)
    return f"{mid:.2f}" if len(values) == 1 else f"{mid:.2f} ({min(values):.2f}-{max(values):.2f})"


def summary(rows: dict) -> dict:
    out = {}
    for kind, keys in (
        ("disagg", ("per_gpu", "ttft", "tpot", "prefill_step", "decode_step")),
        ("spec", ("throughput", "ttft", "tpot", "speedup")),
        ("prefix", ("throughput", "ttft", "tpot", "speedup")),
    ):
        ran = [r for r in rows[kind] if r["ratios"]]
        out[kind] = {
            "ran": len(ran),
            "of": len(rows[kind]),
            "ratios": {k: _spread([r["ratios"].get(k) for r in ran]) for k in keys},
        }
    return out


def progress(kind: str, row: dict) -> str:
    parts = [f"{NAMES.get(k, k)} {v:.2f}" for k, v in row["ratios"].items() if v is not None]
    return "castcore/AIConfigurator " + (", ".join(parts) if parts else "n/a")


# ---------------------------------------------------------------------------------------------------- markdown


def _disagg_tables(rows: list[dict]) -> list[str]:
    lines = [
        "| scenario | tool | requests/s | output tok/s per GPU | mean TTFT (ms) | median TTFT (ms) | p99 TTFT (ms) "
        "| mean TPOT (ms) | KV transfer (ms) | castcore / AIConfigurator |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        a, off, at = row["aiconfigurator"], row["castcore_offline"], row["castcore_at_rate"]
        q = row["ratios"]
        for name, r, note in (
            ("castcore, all at once", off, f"tok/s per GPU {ratio(q.get('per_gpu'))}"),
            (
                f"castcore at {fmt(a.get('request_rate'), 2)} req/s",
                at,
                f"TTFT {ratio(q.get('ttft'))}, TPOT {ratio(q.get('tpot'))}",
            ),
        ):
            if _na(r):
                lines.append(f"| {row['label']} | {name} | failed: {_na(r)} | | | | | | | |")
                continue
            lines.append(
                f"| {row['label'] if r is off else ''} | {name} | {fmt(r['request_throughput'], 2)} | "
                f"{fmt(r['output_throughput'] / r['devices'])} | {fmt(r['mean_ttft_ms'], 1)} | "
                f"{fmt(r['median_ttft_ms'], 1)} | {fmt(r['p99_ttft_ms'], 1)} | {fmt(r['mean_tpot_ms'], 2)} | "
                f"{fmt(r['mean_kv_transfer_ms'], 3)} | {note} |"
            )
        if _na(a):
            lines.append(f"| | AIConfigurator | not run: {_na(a)} | | | | | | | |")
        else:
            lines.append(
                f"| | AIConfigurator ({a['bound']}-bound) | {a['request_rate']:.2f} | {fmt(a['per_gpu'])} | "
                f"{a['ttft_ms']:.1f} | - | - | {a['tpot_ms']:.2f} | not priced | |"
            )
    lines += [
        "",
        "The same iterations priced by each (AIConfigurator's without its 1.1 and 1.08 corrections), each "
        "pool's requests/s from them (AIConfigurator's derated by 0.9 and 0.92), and castcore's prefill "
        "utilization at AIConfigurator's rate with the M/D/1 TTFT it implies:",
        "",
        "| scenario | prefill batch step (ms): castcore | AIC | ratio | decode step at the batch (ms): castcore "
        "| AIC | ratio | pools (req/s): castcore P / D | AIC P / D | castcore prefill utilization | M/D/1 TTFT "
        "(ms) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        a, st, c = row["aiconfigurator"], row["castcore_steps"], row.get("castcore_closed_form")
        if _na(a) or not c:
            continue
        lines.append(
            f"| {row['label']} | {st['prefill_step_ms']:.2f} | {a['prefill_step_ms'] / 1.1:.2f} | "
            f"{ratio(row['ratios']['prefill_step'])} | {st['decode_step_ms']:.2f} | "
            f"{a['decode_step_ms'] / 1.08:.2f} | {ratio(row['ratios']['decode_step'])} | "
            f"{c['prefill_rate']:.1f} / {c['decode_rate']:.1f} | {a['prefill_rate']:.1f} / "
            f"{a['decode_rate']:.1f} | {c['prefill_utilization']:.2f} | {fmt(c['expected_ttft_ms'], 1)} |"
        )
    return lines


def _agg_table(rows: list[dict], kind: str) -> list[str]:
    extra = "tokens kept a step" if kind == "spec" else "prefix hits"
    lines = [
        f"| scenario | tool | feature | output tok/s | mean TTFT (ms) | mean TPOT (ms) | {extra} | speed-up | "
        "castcore / AIConfigurator (tok/s, TTFT, TPOT) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        for tool, name in (("castcore", "castcore"), ("aiconfigurator", "AIConfigurator")):
            for which in ("base", "featured"):
                r = row[tool][which]
                first = row["label"] if tool == "castcore" and which == "base" else ""
                if _na(r):
                    lines.append(f"| {first} | {name} | {which} | not run: {_na(r)} | | | | | |")
                    continue
                ttft, tpot = (
                    (r["mean_ttft_ms"], r["mean_tpot_ms"])
                    if tool == "castcore"
                    else (r["ttft_ms"], r["tpot_ms"])
                )
                more = (
                    (r.get("spec_tokens_per_step") if tool == "castcore" else r.get("tokens_per_step"))
                    if kind == "spec"
                    else (r.get("prefix_cache_hits") if tool == "castcore" else "all")
                )
                q = row["base_ratios" if which == "base" else "ratios"] if row["ratios"] else {}
                cell = (
                    f"{ratio(q.get('throughput'))}, {ratio(q.get('ttft'))}, {ratio(q.get('tpot'))}"
                    if tool == "aiconfigurator" and q
                    else ""
                )
                speed = row.get("speedups", {}).get(tool) if which == "featured" else None
                lines.append(
                    f"| {first} | {name} | {'no' if which == 'base' else 'yes'} | "
                    f"{fmt(r['output_throughput'])} | {ttft:.1f} | {tpot:.2f} | "
                    f"{more if isinstance(more, str) else fmt(more, 3 if kind == 'spec' else 0)} | "
                    f"{fmt(speed, 2)} | {cell} |"
                )
    return lines


def _closed_form(rows: list[dict]) -> list[str]:
    lines = [
        "| scenario | cached tokens: expected / simulated | prompt tokens left | castcore's prompt step left | "
        "light-load TTFT (ms): without / with the prefix | expected with | TTFT left |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        c = row.get("castcore_closed_form")
        if not c:
            continue
        lines.append(
            f"| {row['label']} | {c['cached_tokens_expected']:,} / {c['cached_tokens_simulated']:,} | "
            f"{c['token_share']:.2f} | {c['step_share']:.2f} | {c['light_ttft_base_ms']:.2f} / "
            f"{c['light_ttft_ms']:.2f} | {c['light_ttft_expected_ms']:.2f} | {c['light_ttft_share']:.2f} |"
        )
    return lines


def _gaps(rows: dict) -> list[str]:
    lines = []
    for kind in ("disagg", "spec", "prefix"):
        for row in rows[kind]:
            for metric, why in row["explanations"].items():
                lines.append(
                    f"- **{row['label']}, {NAMES.get(metric, metric)} {row['ratios'][metric]:.2f}**: {why}"
                )
    return lines or ["- none"]


def markdown(result: dict, machine: dict) -> str:
    v, s, rows = result["versions"], result["summary"], result["rows"]
    lines = [
        "# castcore simulate against AIConfigurator: disaggregation, speculative decoding, prefix caching",
        "",
        f"castcore {v['castcore']}, AIConfigurator {v['aiconfigurator']} (aiconfigurator-core "
        f"{v['aiconfigurator-core']}, {result['aiconfigurator_backend']['backend']} backend, tables of vLLM "
        f"{result['aiconfigurator_backend']['version']}); {machine['processor'] or '-'}, {machine['cpus']} CPUs, "
        f"Python {machine['python']}, {machine['date']}; {result['seconds']:.0f} s. `nox -s peers_disagg_spec` "
        "(or `python bench/peers_disagg_spec.py` beside AIConfigurator)"
        + (" --quick" if result["quick"] else "")
        + ".",
        "",
        "Both tools get the same model, GPUs, TP, fixed prompt/output lengths, batches and memory share (0.9); "
        "AIConfigurator's Llama is Llama 3.1 (Llama 3's layers). Ratios are castcore/AIConfigurator; bold ones "
        "are over 15% and explained under 'Gaps'. AIConfigurator's vLLM backend ran every scenario; Vidur and "
        "LLMServingSim ran none (see 'Peers that cannot run these').",
        "",
        "## Headline",
        "",
    ]
    for kind, title in (
        ("disagg", "Disaggregated prefill/decode"),
        ("spec", "Speculative decoding"),
        ("prefix", "Prefix caching"),
    ):
        q = s[kind]
        lines.append(
            f"- **{title}** ({q['ran']} of {q['of']} scenarios; median and range): "
            + ", ".join(f"{NAMES.get(k, k.replace('_', ' '))} {t}" for k, t in q["ratios"].items())
            + "."
        )
    lines += [
        "",
        "## Disaggregated prefill and decode",
        "",
        "castcore runs the requests all at once (its maximum throughput) and as a Poisson stream at the rate "
        "AIConfigurator says the deployment serves; its token budget is the prefill batch's prompts and its "
        "running requests the decode batch.",
        "",
        *_disagg_tables(rows["disagg"]),
        "",
        "## Speculative decoding",
        "",
        "A closed loop of b requests; 'feature' no: the same scenario without speculation. Speed-up: output "
        "tok/s with speculation over without, per tool.",
        "",
        *_agg_table(rows["spec"], "spec"),
        "",
        "## Prefix caching",
        "",
        "A closed loop of b requests, every prompt carrying the prefix.",
        "",
        *_agg_table(rows["prefix"], "prefix"),
        "",
        "Against the closed form: castcore at light load (a closed loop of one request), where TTFT is the "
        "prompt's own step. Cached tokens expected: the hits x the prefix's whole blocks. Prompt tokens left: "
        "(ISL - cached)/ISL, what skipping them would save if a prompt's time were in proportion to its "
        "tokens; castcore's prompt step left: its step of the rest over the cached keys, over the whole "
        "prompt's. TTFT expected: the mean of those steps over the hits and the misses. The step shrinks less "
        "than the tokens: the weights are read once a step whatever its tokens, and the rest still attends "
        "over the cached keys.",
        "",
        *_closed_form(rows["prefix"]),
        "",
        "## Peers that cannot run these",
        "",
        *[f"- **{name}** {why}" for name, why in NOT_RUN],
        "",
        "## How each tool models them",
        "",
        *[f"- **{t}.** {d}" for t, d in MECHANISMS],
        "",
        "## Gaps over 15%",
        "",
        *_gaps(rows),
        "",
    ]
    return "\n".join(lines)
