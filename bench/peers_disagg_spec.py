"""castcore simulate's disaggregated prefill/decode, speculative decoding and prefix caching against AIConfigurator
(aiconfigurator 0.12.0 with its data wheel aiconfigurator-core, vLLM backend) on the same scenarios.

    python bench/peers_disagg_spec.py [--quick] [--out bench/results/peers_disagg_spec.json]

Disaggregation: AIConfigurator's disagg estimate (cli_estimate(mode="disagg")) takes the prefill and decode workers'
TP, batch sizes and counts; castcore simulate takes --prefill-instances X --decode-instances Y with the same TP and
the same batches as engine limits (a token budget of the prefill batch's prompts, the decode batch as the running
requests). castcore runs all requests at once (its maximum throughput) and again as a Poisson stream at the request
rate AIConfigurator says the deployment serves. Speculative decoding: AIConfigurator's MTP (nextn draft tokens,
nextn_accepted of them accepted a step on average; each draft a layer of the model's own shape) against castcore's
--spec-tokens with a draft model of that shape (the model's config cut to one layer) and a per-position acceptance
summing to the same tokens a step; both in a closed loop of b requests. Prefix caching: AIConfigurator's prefix
(a cached prefix of every request) against castcore's --prefix-len at hit rate 1, the same closed loop; castcore also
at light load, against the closed-form expectation of the prompt tokens it skips. Vidur and LLMServingSim cannot
run these scenarios here: the Markdown says why.

Per scenario: each tool's figures, castcore/peer ratios, and each tool's time for the same iterations (prefill batch,
decode step, verification step), which the explanations of every gap over 15% are drawn from
(bench/peers_disagg_spec_text.py). --quick runs one scenario of each kind and writes to the temp directory unless
--out is given. ``nox -s peers_disagg_spec`` installs AIConfigurator and runs this.

Only AIConfigurator's outputs for these scenarios are kept; none of its tables is copied, and no castcore constant
is fitted to them.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

import figures  # bench/figures.py: this script runs with bench/ on its path
import peers_disagg_spec_text as text
from peers_serving import AIC_BACKEND, AIC_MODELS, AIC_SYSTEMS, quiet

PEERS = {"aiconfigurator": "0.12.0", "aiconfigurator-core": "0.12.0"}
ENGINE = {
    "engine": "vllm",
    "max_running_requests": 1024,
    "max_batched_tokens": 8192,
    "block_size": 16,
    "kv_memory_fraction": 0.9,
}
SEED = 0
# AIConfigurator's disagg corrections (aiconfigurator/cli/api.py and sdk/picking.py), read to split its figures into
# the step time and the factors on it; never applied to castcore.
AIC_PREFILL_SCALE, AIC_DECODE_SCALE, AIC_TTFT_FACTOR = 1.1, 1.08, 1.8
AIC_PREFILL_DEGRADATION, AIC_DECODE_DEGRADATION = 0.9, 0.92


@dataclass(frozen=True)
class Disagg:
    model: str
    tp: int
    isl: int
    osl: int
    requests: int
    prefill: int  # instances (AIConfigurator: workers)
    decode: int
    prefill_batch: int
    decode_batch: int
    device: str = "h100-sxm5-80gb"
    decode_device: str = "h100-sxm5-80gb"

    @property
    def label(self) -> str:
        where = text.GPU[self.device] + (
            "" if self.decode_device == self.device else f" prefill, {text.GPU[self.decode_device]} decode"
        )
        return (
            f"{self.model} TP{self.tp} {where} {self.isl}/{self.osl}, {self.prefill}P{self.decode}D, "
            f"prefill batch {self.prefill_batch}, decode batch {self.decode_batch}"
        )


@dataclass(frozen=True)
class Agg:
    kind: str  # spec or prefix
    model: str
    tp: int
    isl: int
    osl: int
    requests: int
    concurrency: int
    spec_tokens: int = 0
    acceptance: float = 0.0  # castcore's rate r (position i kept with r^i); AIConfigurator gets the sum
    prefix: int = 0
    device: str = "h100-sxm5-80gb"

    @property
    def accepted(self) -> float:
        return sum(self.acceptance ** (i + 1) for i in range(self.spec_tokens))

    @property
    def label(self) -> str:
        what = (
            f"{self.spec_tokens} draft token{'s' * (self.spec_tokens > 1)}, acceptance {self.acceptance:g} ({self.accepted:.3f} kept a step)"
            if self.kind == "spec"
            else f"prefix {self.prefix} of {self.isl}"
        )
        return (
            f"{self.model} TP{self.tp} {text.GPU[self.device]} {self.isl}/{self.osl}, concurrency "
            f"{self.concurrency}, {what}"
        )


def scenarios(quick: bool) -> tuple[list[Disagg], list[Agg]]:
    if quick:
        return (
            [Disagg("llama-3-8b", 1, 1024, 128, 200, 1, 1, 1, 64)],
            [
                Agg("spec", "llama-3-8b", 1, 1024, 128, 100, 16, 1, 0.8),
                Agg("prefix", "llama-3-8b", 1, 1024, 128, 100, 16, prefix=512),
            ],
        )
    disagg = [Disagg("llama-3-8b", 1, 1024, 128, 500, x, y, 1, 64) for x, y in ((1, 1), (2, 1), (1, 2))]
    disagg += [Disagg("llama-3-70b", 4, 2048, 256, 300, x, 1, 1, 64) for x in (1, 2)]
    disagg += [Disagg("llama-3-8b", 1, 1024, 128, 500, 1, 1, 1, 128, decode_device="h200-sxm")]
    agg = [
        Agg("spec", "llama-3-8b", 1, 1024, 128, 300, b, k, r)
        for b in (16, 64)
        for k, r in ((1, 0.8), (3, 0.7))
    ]
    agg += [Agg("spec", "llama-3-70b", 4, 2048, 256, 200, 32, 3, 0.7)]
    agg += [Agg("prefix", "llama-3-8b", 1, 1024, 128, 300, b, prefix=p) for b in (16, 64) for p in (512, 768)]
    agg += [Agg("prefix", "llama-3-70b", 4, 2048, 256, 200, 32, prefix=1536)]
    return disagg, agg


# ---------------------------------------------------------------------------------------------------- castcore


class Castcore:
    def __init__(self, workdir: Path):
        import castcore
        from castcore.sweeps.capture import CaptureCache

        self.castcore = castcore
        self.session = castcore.Session(
            capture_step=CaptureCache(disk=False), load_packs=["nvidia", "collectives"]
        )
        self.workdir = workdir
        self._steps: dict = {}

    def draft(self, model: str) -> str:
        """The MTP-shaped draft: the model's own config cut to one decoder layer (its embedding and LM head kept),
        written to the run's temp directory."""
        from castcore.workload.spec import load_model_config

        path = self.workdir / f"{model}-1-layer.json"
        if not path.exists():
            config = {k: v for k, v in load_model_config(model).items() if not k.startswith("_")}
            path.write_text(json.dumps({**config, "num_hidden_layers": 1}))
        return str(path)

    def simulate(self, model: str, device: str, **options) -> dict:
        try:
            report = self.session.simulate(model, device=device, seed=SEED, **{**ENGINE, **options})
        except Exception as exc:  # noqa: BLE001 - a crash is a row of the table, with its traceback on stderr
            traceback.print_exc()
            return {"crash": f"{type(exc).__name__}: {exc}"}
        row = {k: report.summary.get(k) for k in text.FIGURES}
        trace = report.iterations_trace
        decode = [i for i in range(len(trace.duration)) if trace.prefill_tokens[i] == 0]
        row.update(
            kv_blocks=report.kv_blocks,
            mean_running=report.mean_running,
            decode_iteration_ms=(
                sum(trace.duration[i] for i in decode) / len(decode) * 1e3 if decode else None
            ),
            decode_iteration_running=(
                sum(trace.running[i] for i in decode) / len(decode) if decode else None
            ),
        )
        return row

    def step_ms(
        self, model: str, tp: int, device: str, chunks: list[tuple[int, int]], layers: int | None = None
    ) -> float:
        """castcore's time for one iteration of ``chunks`` (new tokens, cached tokens), as castcore simulate prices
        it; ``layers`` 1: the one-layer draft's."""
        from castcore.serving.step_time import StepTimes

        key = (model, tp, device, layers)
        if key not in self._steps:
            spec = self.draft(model) if layers else model
            self._steps[key] = StepTimes(
                self.session.pipeline,
                self.castcore.build_workload(spec, tp=tp),
                device,
                ENGINE["max_batched_tokens"],
                ENGINE["max_batched_tokens"],
            )
        return self._steps[key](chunks) * 1e3

    def disagg(self, s: Disagg, rate: float | None) -> dict:
        pools = {
            "prefill_instances": s.prefill,
            "decode_instances": s.decode,
            "max_batched_tokens": s.isl * s.prefill_batch,
            "max_running_requests": s.decode_batch,
        }
        if s.decode_device != s.device:
            pools["decode_deployment"] = f"device={s.decode_device}"
        traffic = {"rate": rate} if rate else {}
        return self.simulate(
            s.model,
            s.device,
            tp=s.tp,
            requests=s.requests,
            input_lengths=str(s.isl),
            output_lengths=str(s.osl),
            **pools,
            **traffic,
        )

    def agg(self, s: Agg, featured: bool, **traffic) -> dict:
        extra = {}
        if featured and s.kind == "spec":
            extra = {
                "spec_tokens": s.spec_tokens,
                "acceptance": str(s.acceptance),
                "draft_model": self.draft(s.model),
            }
        elif featured:
            extra = {"prefix_len": s.prefix}
        traffic = traffic or {"concurrency": s.concurrency}
        return self.simulate(
            s.model,
            s.device,
            tp=s.tp,
            requests=traffic.pop("requests", s.requests),
            input_lengths=str(s.isl),
            output_lengths=str(s.osl),
            **traffic,
            **extra,
        )


# ------------------------------------------------------------------------------------------------ AIConfigurator


def aic_disagg(s: Disagg) -> dict:
    from aiconfigurator.cli.api import cli_estimate

    with quiet():
        result = cli_estimate(
            AIC_MODELS[s.model],
            AIC_SYSTEMS[s.device],
            mode="disagg",
            backend_name=AIC_BACKEND[0],
            backend_version=AIC_BACKEND[1],
            isl=s.isl,
            osl=s.osl,
            tp_size=s.tp,
            prefill_batch_size=s.prefill_batch,
            prefill_num_workers=s.prefill,
            decode_batch_size=s.decode_batch,
            decode_num_workers=s.decode,
            decode_system_name=AIC_SYSTEMS[s.decode_device],
            free_gpu_memory_fraction=ENGINE["kv_memory_fraction"],
        )
    raw = result.raw
    prefill_ms = sum(result.per_ops_data["prefill"].values())
    p_rate = raw["(p)seq/s/worker"] * s.prefill * AIC_PREFILL_DEGRADATION
    d_rate = raw["(d)seq/s/worker"] * s.decode * AIC_DECODE_DEGRADATION
    return {
        "ttft_ms": raw["ttft"],
        "tpot_ms": raw["tpot"],
        "request_rate": raw["seq/s"],
        "output_throughput": raw["tokens/s"],
        "per_gpu": raw["tokens/s/gpu"],
        "gpus": raw["num_total_gpus"],
        "prefill_step_ms": prefill_ms,
        "decode_step_ms": raw["tpot"],
        "prefill_worker_rate": raw["(p)seq/s/worker"],
        "decode_worker_rate": raw["(d)seq/s/worker"],
        "prefill_rate": p_rate,
        "decode_rate": d_rate,
        "bound": "prefill" if p_rate <= d_rate else "decode",
        "prefill_memory_gb": raw["(p)memory"],
        "decode_memory_gb": raw["(d)memory"],
    }


def aic_agg(s: Agg, featured: bool) -> dict:
    from aiconfigurator.cli.api import cli_estimate

    extra = {}
    if featured and s.kind == "spec":
        extra = {"nextn": s.spec_tokens, "nextn_accepted": round(s.accepted, 6)}
    elif featured:
        extra = {"prefix": s.prefix}
    with quiet():
        result = cli_estimate(
            AIC_MODELS[s.model],
            AIC_SYSTEMS[s.device],
            mode="agg",
            backend_name=AIC_BACKEND[0],
            backend_version=AIC_BACKEND[1],
            isl=s.isl,
            osl=s.osl,
            batch_size=s.concurrency,
            tp_size=s.tp,
            free_gpu_memory_fraction=ENGINE["kv_memory_fraction"],
            **extra,
        )
    row = result.summary.get_summary_df().iloc[0].to_dict()
    scheduling = result.per_ops_data["scheduling"]
    return {
        "ttft_ms": float(row["ttft"]),
        "tpot_ms": float(row["tpot"]),
        # its tokens/s counts osl - 1 tokens a request; castcore's (vLLM bench's) all osl: requests/s x osl
        "output_throughput": float(row["seq/s"]) * s.osl,
        "request_rate": float(row["seq/s"]),
        "mix_step_ms": float(scheduling["mix_step_latency_ms"]),
        "decode_step_ms": float(scheduling["genonly_step_latency_ms"]),
        "tokens_per_step": float(scheduling.get("decode_tokens_per_iteration", 1.0)),
        "mix_steps": float(scheduling["num_mix_steps"]),
        "decode_steps": float(scheduling["num_genonly_steps"]),
        "mix_prompt_tokens": int(scheduling["mix_context_tokens"]),
        "mix_decodes": int(scheduling["mix_decode_requests"]),
    }


def peer(run, *args) -> dict:
    try:
        return run(*args)
    except Exception as exc:  # noqa: BLE001 - the reason goes in the table
        traceback.print_exc()
        return {"na": f"AIConfigurator failed: {type(exc).__name__}: {str(exc)[:200]}", "why": "failed"}


# -------------------------------------------------------------------------------------------------------- rows


def disagg_row(cc: Castcore, s: Disagg) -> dict:
    row = {**asdict(s), "label": s.label, "aiconfigurator": peer(aic_disagg, s)}
    aic = row["aiconfigurator"]
    row["castcore_offline"] = cc.disagg(s, None)
    row["castcore_at_rate"] = cc.disagg(s, aic["request_rate"]) if "na" not in aic else {}
    kv = s.isl + s.osl // 2
    row["castcore_steps"] = {
        "prefill_step_ms": cc.step_ms(s.model, s.tp, s.device, [(s.isl, 0)] * s.prefill_batch),
        "decode_step_ms": cc.step_ms(s.model, s.tp, s.decode_device, [(1, kv)] * s.decode_batch),
    }
    return row


def agg_row(cc: Castcore, s: Agg) -> dict:
    row = {**asdict(s), "label": s.label, "accepted": s.accepted}
    row["aiconfigurator"] = {"base": peer(aic_agg, s, False), "featured": peer(aic_agg, s, True)}
    row["castcore"] = {"base": cc.agg(s, False), "featured": cc.agg(s, True)}
    kv = s.isl + s.osl // 2
    step = lambda chunks, layers=None: cc.step_ms(s.model, s.tp, s.device, chunks, layers)  # noqa: E731
    if s.kind == "spec":
        verify = step([(s.spec_tokens + 1, kv)] * s.concurrency)
        draft = s.spec_tokens * step([(1, kv)] * s.concurrency, 1)
        others, prompt = [(1, kv)] * (s.concurrency - 1), [(s.isl, 0)]
        mix_verify = step(prompt + [(s.spec_tokens + 1, kv)] * (s.concurrency - 1))
        mix_draft = step(prompt + others, 1) + (s.spec_tokens - 1) * step(others, 1)
        row["castcore_steps"] = {
            "decode_step_ms": step([(1, kv)] * s.concurrency),
            "verify_step_ms": verify,
            "draft_ms": draft,
            "spec_step_ms": verify + draft,
            "mix_step_ms": step(prompt + others),
            "spec_mix_step_ms": mix_verify + mix_draft,
        }
        return row
    cached = s.prefix // ENGINE["block_size"] * ENGINE["block_size"]
    decodes = [(1, kv)] * (s.concurrency - 1)
    row["castcore_steps"] = {
        "prompt_ms": step([(s.isl, 0)]),
        "prompt_after_prefix_ms": step([(s.isl - cached, cached)]),
        "mix_step_ms": step([(s.isl, 0)] + decodes),
        "mix_step_after_prefix_ms": step([(s.isl - cached, cached)] + decodes),
        "cached_tokens_per_hit": cached,
    }
    # light load: one request at a time (a closed loop of 1), where TTFT is the prompt's own step
    light = {"concurrency": 1, "requests": 20}
    row["castcore_light"] = {"base": cc.agg(s, False, **light), "featured": cc.agg(s, True, **light)}
    return row


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="one scenario of each kind (a smoke test)")
    parser.add_argument(
        "--out",
        help="where to write the JSON (and the .md beside it); default "
        "bench/results/peers_disagg_spec.json, or the temp directory with --quick",
    )
    args = parser.parse_args()
    out = args.out or (
        Path(tempfile.gettempdir()) / "peers-disagg-spec-quick.json"
        if args.quick
        else "bench/results/peers_disagg_spec.json"
    )
    versions = figures.peer_versions(PEERS, "bench/peers_disagg_spec.py", "peers_disagg_spec")
    versions["castcore"] = metadata.version("castcore")
    started = time.perf_counter()
    disagg, agg = scenarios(args.quick)
    rows: dict[str, list] = {"disagg": [], "spec": [], "prefix": []}
    with tempfile.TemporaryDirectory(prefix="peers-disagg-spec-") as work:
        cc = Castcore(Path(work))
        todo = [(disagg_row, s) for s in disagg] + [(agg_row, s) for s in agg]
        for i, (make, s) in enumerate(todo, 1):
            clock = time.perf_counter()
            row = make(cc, s)
            row["seconds"] = time.perf_counter() - clock
            kind = "disagg" if isinstance(s, Disagg) else s.kind
            text.derive(kind, row)
            rows[kind].append(row)
            print(
                f"[{i}/{len(todo)}] {s.label}: {text.progress(kind, row)} ({time.perf_counter() - started:.0f} s)",
                file=sys.stderr,
                flush=True,
            )
    result = {
        "versions": versions,
        "engine": ENGINE,
        "seed": SEED,
        "quick": args.quick,
        "gap": text.GAP,
        "aiconfigurator_backend": {"backend": AIC_BACKEND[0], "version": AIC_BACKEND[1]},
        "aiconfigurator_models": {m: AIC_MODELS[m] for m in ("llama-3-8b", "llama-3-70b")},
        "seconds": time.perf_counter() - started,
        "rows": rows,
    }
    result["summary"] = text.summary(rows)
    figures.write(out, result, lambda machine: text.markdown(result, machine))
    crashed = [r["label"] for kind in rows.values() for r in kind if text.crashed(r)]
    if crashed:
        sys.exit(
            f"bench/peers_disagg_spec.py: castcore failed on {len(crashed)} scenario(s) (tracebacks above)"
        )


if __name__ == "__main__":
    main()
