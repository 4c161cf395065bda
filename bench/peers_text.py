"""The Markdown of bench/peers.py: the times, the targets, and why castcore and each peer differ.

The reasons are written once, below, each naming the operator and the assumption and citing the peer's file
and line (genz-llm 0.0.16, llm-analysis 0.2.2); every gap over 10% is then listed with the buckets that make
it, each tagged with its reason, from the figures of the run.
"""

from __future__ import annotations

import math

TARGETS = {"dense_median_within": 0.15, "dense_max_ratio": 1.5}
TOOLS = (("castcore", "castcore"), ("genz", "GenZ"), ("llm_analysis", "llm-analysis"))
GAP = 0.10  # gaps beyond this are explained
# castcore's and GenZ's buckets -> llm-analysis' coarser ones
COARSE = {
    "embedding": "embedding",
    "qkv": "attention block",
    "attention": "attention block",
    "out proj": "attention block",
    "router": "mlp",
    "ffn": "mlp",
    "moe dispatch": "mlp",
    "elementwise": "norms and elementwise",
    "all-reduce": "collectives",
    "all-gather": "collectives",
    "all-to-all": "collectives",
    "lm head": "lm head",
}

REASONS = {
    "G1": (
        "GenZ prices no norm, activation, rotary embedding, residual add or cache write",
        "GenZ's layers are the matrix products, the two attention products and the collectives, nothing else "
        "(GenZ/Models/attention.py lines 35-50, GenZ/Models/ffn.py lines 49-54). castcore prices the RMSNorms "
        "(fused with a residual add where it fuses them), SiLU x up, the rotary embedding, the remaining residual "
        "adds and, in decode, the KV-cache writes, each as the memory-bound kernel a server launches (vLLM runs "
        "fused_add_rms_norm, silu_and_mul and rotary_embedding as kernels of their own), and under W8A8 the "
        "per-token quantization of each product's input. They are 5-16% of a dense prefill in castcore (the "
        "larger share at TP 8, since they are not split over the devices) and under 2% of a decode step. "
        "castcore is closer to what a server runs. (It keeps one residual add per layer apart from the next "
        "layer's input RMSNorm, which vLLM fuses: about 0.5% of a prefill too much.)",
    ),
    "G2": (
        "GenZ prices the token embedding as a matrix product",
        "GenZ's prefill multiplies the prompt by the whole embedding table, 2 x tokens x vocabulary/TP x hidden "
        "FLOPs (GenZ/Models/embedding.py line 14), and all-reduces the result under TP (line 17): 2.2 ms for "
        "Llama-3-8B over 2048 tokens. castcore prices the row gather it is (aten::embedding reads the "
        "tokens' rows: microseconds). castcore is closer; no server multiplies one-hot rows by the table. "
        "(GenZ's decode step has no embedding at all, GenZ/Models/get_language_model.py line 244, which "
        "agrees with castcore's few microseconds.)",
    ),
    "G3": (
        "GenZ computes the LM head over every prompt token",
        "GenZ's classifier covers every prompt token (GenZ/Models/embedding.py line 32, called with the prompt "
        "length at GenZ/Models/get_language_model.py line 168) and under TP all-gathers every token's logits "
        "(embedding.py line 35). castcore computes the last token's logits, as a server does to sample the "
        "first output token (castcore estimate --all-logits prices every position, for scoring). castcore is "
        "closer to serving; GenZ's figure is a scoring pass's.",
    ),
    "G4": (
        "GenZ's attention covers every query-key pair",
        "GenZ's Logit and Attend products span the whole prompt x prompt square (GenZ/Models/attention.py "
        "lines 38 and 41), castcore's fused attention the causal half that a causal FlashAttention kernel "
        "computes (it skips the blocks above the diagonal). castcore is closer; GenZ doubles attention FLOPs.",
    ),
    "G5": (
        "GenZ's int8 is every tensor in int8",
        "GenZ has one bit width for everything (GenZ/system.py lines 6-7, 118-134): with bits='int8' every "
        "matrix product runs at twice the bf16 rate (compute_multiplier 0.5) and every tensor moves as one "
        "byte: weights, activations, the KV cache, the LM head, the all-reduced activations. The scenario is "
        "int8 weights, which castcore deploys weight-only (W8A16) as vLLM does: int8 weights dequantized inside "
        "the product, bf16 products, activations and KV cache, the LM head and embedding in bf16. So GenZ halves "
        "a compute-bound prefill and castcore does not, and in decode GenZ reads an int8 KV cache and LM head. "
        "GenZ cannot express weight-only quantization; for W8A8 with an int8 KV cache (castcore --weights int8 "
        "--activations int8 --kv-cache int8, the 'castcore W8A8' column) the two assume the same. Which is "
        "closer depends on the checkpoint: a weight-only int8 one (GPTQ/AWQ-style, the usual int8 deployment) "
        "runs as castcore prices the scenario; a SmoothQuant-style W8A8 one as GenZ does, apart from the KV cache "
        "and the LM head, which servers keep in bf16 unless told otherwise.",
    ),
    "G6": (
        "castcore keeps q, k and v as three projections",
        "castcore's deployed Llama merges the gate and up projections but not q, k and v, so each of the three "
        "re-reads the layer input; at TP 4 and 8 the k and v shards are 256 and 128 columns wide, and castcore "
        "finds them bound by reading that input; under W8A8 each of the three also quantizes it again. GenZ "
        "prices one fused QKV product (GenZ/Models/attention.py line 35), as vLLM runs it (QKVParallelLinear, "
        "one quantization). GenZ is closer here: castcore overestimates.",
    ),
    "G7": (
        "GenZ's decode step reads top-k experts whatever the batch",
        "In a decode step GenZ reads the weights of exactly k = 2 experts per layer, for any batch "
        "(GenZ/Models/ffn.py lines 94-97: 'TODO: Define a function to calculate the number of activated experts', "
        "then A = K). castcore reads "
        "the experts the batch's tokens are expected to reach, E(1 - (1 - 1/E)^(tokens x k)): 1.9 of 8 at "
        "batch 1, 7.0 at batch 8, 8.0 at batch 32. Sixteen routings among 8 experts leave few unused, so castcore "
        "is closer to a server at batch 8 and 32, where GenZ reads 2 experts of the 7-8 used. At batch 1 "
        "castcore's formula draws the token's two experts independently, expecting 1.875 distinct experts "
        "where top-k picks exactly 2: castcore is about 6% low on the experts' weights there.",
    ),
    "G8": (
        "GenZ splits Mixtral's router across TP and all-reduces it",
        "GenZ splits the router's input dimension over the TP devices and all-reduces its output every layer "
        "(GenZ/Models/ffn.py lines 31-34 in a prefill, 84-87 in decode, where it all-reduces hidden-size "
        "values per token). castcore keeps the router whole on every device, as vLLM's ReplicatedLinear "
        "router does: no collective, and the whole (small) product. In decode at TP 8 GenZ's extra all-reduce "
        "is 32 x 19 us, 0.6 ms. castcore is closer.",
    ),
    "C1": (
        "castcore prices Mixtral's expert dispatch unfused",
        "Around the two grouped products castcore prices transformers' grouped-GEMM expert forward as it runs: "
        "the gather of each expert's tokens, SiLU and the gate product as separate kernels, the routing-weight "
        "multiply, a float32 scatter-sum and index casts: 14-27% of a Mixtral prefill. A serving "
        "fused-MoE kernel (vLLM's fused_moe) folds the gather and the weighting into the grouped products and "
        "runs silu_and_mul once; GenZ prices the products only. GenZ is closer here: castcore's deployed view "
        "does not fuse the MoE dispatch yet.",
    ),
    "L1": (
        "llm-analysis' MLP FLOPs are GPT's 16 b s h^2",
        "llm-analysis' MLP is GPT's two-matrix 4h MLP (llm_analysis/analysis.py line 913: 16 b s h^2 FLOPs) "
        "whatever the model's width and gating: 0.76x the 6 b s h i of Llama's gated MLP (i = 3.5h), and for "
        "Mixtral one such MLP per token where two gated experts run (0.38x). Its weights are right here "
        "(ffn_embed_dim = 1.5 i gives its two matrices the three's parameters, line 285), so a decode step, bound "
        "by the weights, agrees. castcore counts the model's products.",
    ),
    "L2": (
        "llm-analysis reads every expert in every decode step",
        "llm-analysis' MLP weights are all the experts' (llm_analysis/analysis.py line 285), read whole by "
        "every step (lines 1080-1083) whatever the batch and top-k; castcore reads the experts the tokens "
        "reach (see G7). At batch 1 that is 8 experts against castcore's 1.9; at 32 both read all 8. castcore "
        "is closer.",
    ),
    "L3": (
        "llm-analysis reads the KV cache twice per decode step",
        "llm-analysis adds twice the KV cache's bytes over the bandwidth to each decode step ('load and store "
        "kv cache', llm_analysis/analysis.py lines 1571-1573): the whole cache read and written. castcore (like "
        "GenZ) reads the cache once and writes only the new token's keys and values. castcore is closer.",
    ),
    "L4": (
        "llm-analysis reads the whole embedding table at every forward",
        "llm-analysis prices the input embedding as reading the whole vocabulary x hidden table, not divided by "
        "TP (llm_analysis/analysis.py line 1253), plus an all-reduce, in a prefill and in every decode step; "
        "castcore reads the rows of the batch's tokens. castcore is closer.",
    ),
    "L5": (
        "llm-analysis' LM head is compute only, over every token",
        "llm-analysis prices the LM head as FLOPs only (llm_analysis/analysis.py line 1271: 2 b s V h / TP): "
        "over every prompt token in a prefill where castcore computes the last token's, and in decode without "
        "reading its weights, which bound it (128256 x 4096 in bf16 is 1 GB at TP 1). castcore is closer in "
        "both. At TP 1 in decode this and L4 cancel: the embedding table it reads is the size of the LM head "
        "it does not.",
    ),
    "L6": (
        "llm-analysis prices two layernorms and nothing else elementwise",
        "llm-analysis prices two layernorms per layer (llm_analysis/analysis.py lines 1103-1131, memory only) and "
        "no SiLU x up, rotary embedding or residual add; castcore prices them all (see G1). castcore is closer.",
    ),
    "L7": (
        "llm-analysis times an all-reduce as max(bandwidth, latency)",
        "llm-analysis times each of a layer's two all-reduces as max(bytes / NVLink bandwidth, its minimum message "
        "latency) over 2 b s h (tp - 1)/tp elements (llm_analysis/analysis.py lines 1154-1164, 1214), with no "
        "all-gather for the LM head (line 1262 says it is ignored). The latency is set here to GenZ's "
        "small-message all-reduce at the scenario's TP (5 us + 2(tp - 1) x 1 us). castcore, on this profile with "
        "castpack-collectives, adds the ring's latency steps to its bandwidth term, as GenZ does, and times the "
        "embedding's all-reduce and the logits' all-gather as well: more where both terms count, in a "
        "prefill over TP. Neither is far from a ring all-reduce; castcore's sum is the usual alpha-beta form.",
    ),
    "L8": (
        "llm-analysis' attention covers every query-key pair",
        "llm-analysis counts 4 b s^2 h attention FLOPs (llm_analysis/analysis.py line 897), the whole square "
        "without causal masking, and adds activation traffic to the weights of the block (lines 1027-1037); "
        "castcore computes the causal half (see G4) and prices the q/k/v projections as they run (see G6).",
    ),
}


def ms(result: dict) -> str:
    return f"{result['time_s'] * 1e3:.3f} ms" if "time_s" in result else "n/a"


def _ratio(x: float | None) -> str:
    return f"{x:.2f}" if x is not None else "n/a"


def genz_reasons(bucket: str, row: dict) -> list[str]:
    int8 = ["G5"] if row["weights"] != "bf16" else []
    prefill, moe = row["phase"] == "prefill", not row["dense"]
    if bucket in ("lm head", "all-gather"):
        return (["G3"] if prefill else []) + int8
    if bucket == "attention":
        return ["G4"] if prefill else int8
    if bucket == "all-reduce":
        return (["G8"] if moe else []) + int8
    if bucket == "ffn" and moe and not prefill:
        return ["G7"] + int8
    if bucket == "qkv":
        return int8 + ["G6"]
    return {"elementwise": ["G1"], "embedding": ["G2"], "router": ["G8"], "moe dispatch": ["C1"]}.get(
        bucket, int8
    )


def llm_analysis_reasons(bucket: str, row: dict) -> list[str]:
    prefill, moe = row["phase"] == "prefill", not row["dense"]
    if bucket == "mlp":
        return (["L1"] + (["C1"] if moe else [])) if prefill else (["L2"] if moe else ["L1"])
    if bucket == "attention block":
        return ["L8", "G6"] if prefill else ["L3"]
    return {"embedding": ["L4"], "lm head": ["L5"], "norms and elementwise": ["L6"], "collectives": ["L7"]}[
        bucket
    ]


def gaps(row: dict, peer: str) -> str:
    """The buckets that make castcore's gap to ``peer``, largest first, each with its reasons."""
    mine, theirs = row["castcore"]["buckets"], row[peer]["buckets"]
    if peer == "llm_analysis":
        coarse: dict[str, float] = {}
        for bucket, seconds in mine.items():
            coarse[COARSE[bucket]] = coarse.get(COARSE[bucket], 0.0) + seconds
        mine = coarse
    deltas = {b: mine.get(b, 0.0) - theirs.get(b, 0.0) for b in set(mine) | set(theirs)}
    floor = 0.03 * row[peer]["time_s"]
    shown = sorted((b for b in deltas if abs(deltas[b]) >= floor), key=lambda b: -abs(deltas[b]))[:5]
    why = genz_reasons if peer == "genz" else llm_analysis_reasons
    return "; ".join(f"{b} {deltas[b] * 1e3:+.2f} ms ({', '.join(why(b, row))})" for b in shown)


def _met(stats: dict) -> tuple[bool, bool]:
    """Whether the median is within the target and whether no ratio is beyond it."""
    return (
        abs(stats["median"] - 1) <= TARGETS["dense_median_within"],
        1 / TARGETS["dense_max_ratio"] <= stats["min"] and stats["max"] <= TARGETS["dense_max_ratio"],
    )


def _verdict(stats: dict) -> str:
    if not stats.get("count"):
        return "no scenario"
    median_ok, worst_ok = _met(stats)
    return (
        f"median {stats['median']:.3f} (target within {TARGETS['dense_median_within']:.0%}: "
        f"{'met' if median_ok else 'MISSED'}), range {stats['min']:.3f}-{stats['max']:.3f} (target none beyond "
        f"{TARGETS['dense_max_ratio']}x: {'met' if worst_ok else 'MISSED'}), {stats['within_10pct']} of "
        f"{stats['count']} within 10%"
    )


def _plain(stats: dict) -> str:
    if not stats.get("count"):
        return "no scenario"
    return (
        f"median {stats['median']:.3f}, range {stats['min']:.3f}-{stats['max']:.3f}, {stats['within_10pct']} "
        f"of {stats['count']} within 10%"
    )


def _conclusion(s: dict, rows: list[dict]) -> list[str]:
    bf16, all_, matched = (s[f"dense_{k}castcore_over_genz"] for k in ("bf16_", "", "matched_"))
    if not all_.get("count") or not bf16.get("count"):
        return []
    beyond = [
        r for r in rows if r["dense"] and (r.get("castcore_w8a8_over_genz") or 0) > TARGETS["dense_max_ratio"]
    ]
    where = (
        f"beyond {TARGETS['dense_max_ratio']}x in {len(beyond)} {'/'.join(sorted({r['phase'] for r in beyond}))} "
        f"rows at TP {'/'.join(str(t) for t in sorted({r['tp'] for r in beyond}))}"
        if beyond
        else ""
    )
    if all(_met(all_)):
        return [
            f"The target is met on the dense models, int8 rows included (castcore/GenZ {all_['min']:.2f}-"
            f"{all_['max']:.2f})."
        ]
    return [
        f"On the dense models the bf16 scenarios {'meet' if all(_met(bf16)) else 'miss'} the target "
        f"(castcore/GenZ {bf16['min']:.2f}-{bf16['max']:.2f}); with the int8 ones it is missed (up to "
        f"{all_['max']:.2f}), where GenZ's only int8 runs every product "
        "at the int8 rate and moves every tensor in one byte, while the scenario's int8 weights run, in castcore "
        "as in a server, at the bf16 rate with bf16 activations and KV cache (G5). Set to GenZ's assumption "
        f"(W8A8, int8 KV cache) castcore comes to {matched['max']:.2f} at most{' and is ' + where if where else ''}, "
        "where GenZ's int8 also halves the all-reduced activations that castcore, as servers do, all-reduces in bf16 "
        "(G5), and castcore adds the per-token quantization and elementwise kernels (G1, G6)."
    ]


def markdown(result: dict, machine: dict) -> str:
    s, v, rows = result["summary"], result["versions"], result["rows"]
    lines = [
        "# castcore against GenZ and llm-analysis",
        "",
        f"{machine['date']}, {machine['machine']}, {machine['cpus']} CPUs, Python {machine['python']}; "
        f"castcore {v['castcore']}, genz-llm {v['genz-llm']}, llm-analysis {v['llm-analysis']}; "
        f"{len(rows)} scenarios in {s['seconds']:.0f} s{' (--quick)' if result['quick'] else ''}",
        "",
        "`python bench/peers.py --out bench/results/peers.json` (`nox -s peers` installs the peers and runs it)",
        "",
        "Each figure is the time of one prefill, or of one decode step over 2048 cached tokens, with the model "
        f"split over TP devices that run in parallel, on the H100 of GenZ's `H100_GPU` preset (bench/{result['device_file']}: its FLOPs, bandwidths, "
        "efficiencies of 1 and collective formula, each with GenZ's file and line). castcore runs with its "
        "defaults (deployed kernels, last-token logits) and castpack-collectives; how each peer was set up is "
        "at the end.",
        "",
        "## Targets",
        "",
        f"- dense models (Llama-3-8B, -70B), castcore/GenZ as the scenarios are defined: "
        f"{_verdict(s['dense_castcore_over_genz'])}",
        f"- dense, bf16 only: {_verdict(s['dense_bf16_castcore_over_genz'])}",
        f"- dense, bf16 rows and, in the int8 rows, castcore under GenZ's int8 assumption (W8A8 and an int8 KV "
        f"cache, the W8A8 column; see G5): "
        f"{_verdict(s['dense_matched_castcore_over_genz'])}",
        f"- Mixtral-8x7B (no target), castcore/GenZ: {_plain(s['moe_castcore_over_genz'])}",
        f"- castcore/llm-analysis, dense: {_plain(s['dense_castcore_over_llm_analysis'])}; Mixtral: "
        f"{_plain(s['moe_castcore_over_llm_analysis'])}",
        "",
        *_conclusion(s, rows),
        "",
        "## Times",
        "",
        "| model | step | TP | weights | castcore | GenZ | castcore/GenZ | llm-analysis | castcore/llm-analysis "
        "| castcore W8A8, int8 KV (/GenZ) | notes |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        w8a8 = r.get("castcore_w8a8", {})
        w8a8_cell = f"{ms(w8a8)} ({_ratio(r.get('castcore_w8a8_over_genz'))})" if "time_s" in w8a8 else ""
        notes = [
            x[k]
            for x in (r["castcore"], r["genz"], r["llm_analysis"], w8a8)
            for k in ("note", "error")
            if k in x
        ]
        if r["weights"] != "bf16":
            notes.append("GenZ cannot express weight-only int8: its int8 is every tensor (G5)")
        if not r["dense"] and "time_s" in r["llm_analysis"]:
            notes.append("llm-analysis: no top-k MoE compute (L1, L2)")
        lines.append(
            f"| {r['model']} | {r['step']} | {r['tp']} | {r['weights']} | {ms(r['castcore'])} | "
            f"{ms(r['genz'])} | {_ratio(r['castcore_over_genz'])} | {ms(r['llm_analysis'])} | "
            f"{_ratio(r['castcore_over_llm_analysis'])} | {w8a8_cell} | {'; '.join(notes)} |"
        )
    bf16 = s["dense_bf16_castcore_over_genz"]
    lines += ["", "## Why they differ", ""]
    if bf16.get("count"):
        lines += [
            f"In short: on the dense models in bf16, castcore/GenZ is {bf16['min']:.2f}-{bf16['max']:.2f}: "
            "castcore adds the norm, activation and rotary kernels GenZ leaves out (G1) and leaves out GenZ's "
            "matrix-product embedding, every-token LM head and full-square attention (G2-G4), which nearly "
            "cancel. The int8 rows differ because GenZ's int8 is every tensor in int8 (G5): it halves a "
            "compute-bound prefill, which weight-only int8 does not, and in decode reads an int8 KV cache. On "
            "Mixtral castcore prices an expert dispatch a fused-MoE kernel would hide (C1, castcore's "
            "overestimate) and in decode the experts a batch reaches where GenZ reads two (G7). Against "
            "llm-analysis, its GPT-shaped MLP FLOPs (L1, L2), its double KV-cache read (L3) and its whole-table "
            "embedding read (L4) make most of the gaps.",
            "",
        ]
    lines += [
        "Each tool's time is split into the same buckets (castcore's records by the module that made them, "
        "GenZ's per-layer rows by layer, llm-analysis' breakdown by block); the reasons below are what the "
        "buckets that differ come from. Each says which assumption is closer to what a server (vLLM-like, "
        "on this H100) runs.",
        "",
    ]
    for tag, (title, text) in REASONS.items():
        lines += [f"- **{tag}. {title}.** {text}", ""]
    lines += [
        "### Every gap over 10%",
        "",
        "The buckets that differ by at least 3% of the peer's time, largest first: castcore minus the peer, "
        "with the reasons above. Both peers: the scenarios both tools ran.",
        "",
        "| scenario | against | castcore/peer | castcore minus peer, by bucket |",
        "|---|---|---:|---|",
    ]
    for r in rows:
        for peer, name in TOOLS[1:]:
            x = r[f"castcore_over_{peer}"]
            if x is not None and abs(math.log(x)) > math.log(1 + GAP):
                lines.append(f"| {r['label']} | {name} | {x:.2f} | {gaps(r, peer)} |")
    lines += [
        "",
        "## How each tool was set up",
        "",
        "- castcore: `Session(device_files=[bench/peers_h100_genz.toml], load_packs=['collectives'])`, "
        "`build_workload(model, batch, seq, phase, kv_len=2048 for decode, tp, weights='int8' for the int8 "
        "rows)`; W8A8 column: `weights=activations=kv_cache='int8'`.",
        "- GenZ: `prefill_moddeling` / `decode_moddeling` with `system_name='H100_GPU'`, `system_eff=1`, "
        "`bits='bf16'` or `'int8'`, `tensor_parallel=TP`; the model as a `ModelConfig` built from castcore's "
        "preset (gated MLP: `num_ffi=2`), so both price the same shapes; decode with `output_tokens=1` (2048 "
        "cached and the new token, as castcore) and `Bb=1` (its default is 4 beams, which would price 4x the "
        "batch). It refuses a model that does not fit in 80 GiB (the TP 1 rows of Llama-3-70B and Mixtral in "
        "bf16).",
        "- llm-analysis: `LLMAnalysis(...).inference(batch, seq_len=prompt or cached tokens, "
        "num_tokens_to_generate=1)`, its prefill_latency or decode_latency, with flops_efficiency and "
        "hbm_memory_efficiency 1 and a GPUConfig holding GenZ's numbers instead of its own h100-sxm-80gb.json "
        "(3350 GB/s HBM, 989 TFLOPS, 450 GB/s NVLink, 8 us message latency): 3400 x 2^30 B/s of HBM and "
        "450 x 2^30 B/s of NVLink written in its decimal GB, 989 TFLOPS bf16 and twice that for int8, 80 GiB. "
        "Where its options cannot hold GenZ's numbers: one collective latency, taken per scenario as GenZ's "
        "small all-reduce on TP devices (see L7); it has no per-operator roofline but one per block (attention, "
        "MLP: max of FLOPs and weights plus activations, lines 1050 and 1101). Its model: the preset's shapes, "
        "the gated MLP as `ffn_embed_dim = 1.5 x intermediate_size` (see L1), Mixtral's expert count and top-k "
        "(which its FLOPs ignore), dtype w16a16e16 or w8a16e16 (weight-only int8, as the scenario), "
        "layernorms in 2 bytes. It also refuses what does not fit.",
        "",
    ]
    return "\n".join(lines)
