"""castcore simulate against two peer serving simulators, Vidur (vidur 0.0.26) and AIConfigurator (aiconfigurator
0.12.0 with its data wheel aiconfigurator-core), on the same serving scenarios.

    python bench/peers_serving.py [--quick] [--out bench/results/peers_serving.json]

Scenarios: Llama-3-8B at TP 1 and Llama-3-70B at TP 4 on an H100 SXM, Mixtral-8x7B at TP 2 on an H100 SXM and
Llama-3-8B on an H200 SXM; fixed prompt and output lengths (1024/128, 2048/256); requests all at once (offline), at
a Poisson rate, or in a closed loop of C requests. Every tool gets the same model, GPU, TP, lengths, request count
and rate or concurrency; castcore runs its vLLM preset (castcore/simulation/presets.py) and AIConfigurator its vLLM
backend (measured tables of vLLM 0.24.0), with the matching limits (1,024 running requests, 8,192 batched tokens,
16-token blocks, 0.9 of the memory) where the peer takes them.

Per scenario: output throughput, mean/median/p99 TTFT and mean TPOT of each tool, and castcore/peer ratios; and
the per-iteration figures the explanations are drawn from: each tool's time for the same mixed step and the same
decode-only step, and the KV capacity each used. The Markdown (bench/peers_serving_text.py) explains every gap
over 15%. A peer that cannot run a scenario says why in the table. --quick runs two small scenarios (a smoke
test) and writes to the temp directory unless --out is given. ``nox -s peers_serving`` installs the peers and
runs this.

Vidur 0.0.26 ships no profiles: it downloads them from Hugging Face datasets at run time. The bench never lets
it reach the network (HF_HUB_OFFLINE=1): it seeds Vidur's cache with local copies of those datasets, from
bench/peers_data/vidur/<org>/<dataset>/ (--vidur-profiles another folder; its README.md says what goes there and
where it comes from), and a scenario whose dataset has no local copy says so in the table.

Only the peers' outputs for these scenarios are kept (bench/results/peers_serving.json); nothing of AIConfigurator's
kernel tables is copied, Vidur's profiles are benchmark input only (castcore never reads them), and no castcore
constant is fitted to either.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import logging
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

import figures  # bench/figures.py: this script runs with bench/ on its path
import peers_serving_text as text  # the Markdown and the reasons behind the gaps
from peers import castcore_bucket  # bench/peers.py: which part of the model a castcore record is

PEERS = {"vidur": "0.0.26", "aiconfigurator": "0.12.0", "aiconfigurator-core": "0.12.0"}
ENGINE = {
    "max_running_requests": 1024,
    "max_batched_tokens": 8192,
    "block_size": 16,
    "kv_memory_fraction": 0.9,
}
SEED = 0
# castcore preset -> AIConfigurator model. Llama 3.1 has Llama 3's layers (hidden 4096/8192, FFN 14336/28672, GQA 8
# KV heads, vocabulary 128256); only its RoPE scaling and context length differ, which these lengths never reach.
AIC_MODELS = {
    "llama-3-8b": "meta-llama/Meta-Llama-3.1-8B",
    "llama-3-70b": "meta-llama/Meta-Llama-3.1-70B",
    "mixtral-8x7b": "mistralai/Mixtral-8x7B-v0.1",
}
AIC_SYSTEMS = {"h100-sxm5-80gb": "h100_sxm", "h200-sxm": "h200_sxm"}
AIC_BACKEND = ("vllm", "0.24.0")
# castcore preset -> Vidur's model (vidur/config/model_config.py) and its devices (vidur/types/device_sku_type.py).
VIDUR_MODELS = {"llama-3-8b": "meta-llama/Llama-3-8B", "llama-3-70b": "meta-llama/Llama-3-70B"}
VIDUR_DEVICES = {"h100-sxm5-80gb": ("h100", "h100_dgx")}
# The Hugging Face datasets Vidur's predictor reads (model, network): vidur 0.0.26 names only its defaults, for
# Llama-3-8B on an H100 DGX (vidur/config/config.py, BaseExecutionTimePredictorConfig); Llama-3-70B's follows the
# same naming and is listed among project-vajra's datasets (the hub is out of reach here to confirm it);
# --vidur-dataset adds or replaces one.
VIDUR_DATASETS = {
    ("llama-3-8b", "h100-sxm5-80gb"): (
        "project-vajra/dev-staging-meta-llama-llama-3-8b-h100",
        "project-vajra/dev-staging-h100-dgx",
    ),
    ("llama-3-70b", "h100-sxm5-80gb"): (
        "project-vajra/dev-staging-meta-llama-llama-3-70b-h100",
        "project-vajra/dev-staging-h100-dgx",
    ),
}
VIDUR_TIMEOUT_S = 600
# Where the local copies of Vidur's datasets are looked for, and the files Vidur reads of each kind of dataset
# (vidur/execution_time_predictor/sklearn_execution_time_predictor.py, _get_input_files).
VIDUR_PROFILES = Path(__file__).resolve().parent / "peers_data" / "vidur"
VIDUR_FILES = {
    "compute": ("config.json", "mlp.csv.xz", "attention.csv.xz"),
    "network": ("config.json", "all_reduce.csv.xz", "send_recv.csv.xz"),
}


@dataclass(frozen=True)
class Scenario:
    model: str
    device: str
    tp: int
    isl: int
    osl: int
    requests: int
    mode: str  # offline, rate or concurrency
    value: float | None = None  # requests/s, or requests in flight

    @property
    def deployment(self) -> str:
        return f"{self.model} TP{self.tp} {text.GPU[self.device]} {self.isl}/{self.osl}"

    @property
    def traffic(self) -> str:
        if self.mode == "offline":
            return f"offline ({self.requests} at once)"
        return f"{self.value:g} req/s" if self.mode == "rate" else f"concurrency {self.value:g}"

    @property
    def label(self) -> str:
        return f"{self.deployment}, {self.traffic}"


def scenarios(quick: bool) -> list[Scenario]:
    if quick:
        return [
            Scenario("llama-3-8b", "h100-sxm5-80gb", 1, 1024, 128, 100, "concurrency", 16),
            Scenario("llama-3-8b", "h100-sxm5-80gb", 1, 1024, 128, 100, "rate", 10),
        ]
    plan = [
        (
            "llama-3-8b",
            "h100-sxm5-80gb",
            1,
            1024,
            128,
            500,
            [("offline", None), ("rate", 10), ("rate", 20), ("concurrency", 16), ("concurrency", 64)],
        ),
        (
            "llama-3-70b",
            "h100-sxm5-80gb",
            4,
            2048,
            256,
            300,
            [("offline", None), ("rate", 2), ("rate", 4), ("concurrency", 16), ("concurrency", 64)],
        ),
        ("mixtral-8x7b", "h100-sxm5-80gb", 2, 1024, 128, 500, [("rate", 10), ("concurrency", 32)]),
        ("llama-3-8b", "h200-sxm", 1, 1024, 128, 500, [("rate", 20), ("concurrency", 64)]),
    ]
    return [
        Scenario(m, d, tp, i, o, n, mode, v) for m, d, tp, i, o, n, traffic in plan for mode, v in traffic
    ]


def not_run(reason: tuple[str, str], **values) -> dict:
    """A peer's row for a scenario it cannot run: the short reason (the table's cell) and the full one."""
    return {"why": reason[0], "na": reason[1].format(**values)}


def shown(path: Path) -> str:
    """A path as the tables show it: relative to the repository where it is inside it."""
    root = Path(__file__).resolve().parent.parent
    return str(path.resolve().relative_to(root)) if path.resolve().is_relative_to(root) else str(path)


def traffic_options(s: Scenario) -> dict:
    if s.mode == "rate":
        return {"rate": s.value}
    return {"concurrency": int(s.value)} if s.mode == "concurrency" else {}


# ---------------------------------------------------------------------------------------------------- castcore


class Castcore:
    def __init__(self):
        import castcore
        from castcore.sweeps.capture import CaptureCache

        self.castcore = castcore
        self.session = castcore.Session(
            capture_step=CaptureCache(disk=False), load_packs=["nvidia", "collectives"]
        )
        self._steps: dict = {}

    def run(self, s: Scenario) -> dict:
        try:
            report = self.session.simulate(
                s.model,
                device=s.device,
                tp=s.tp,
                requests=s.requests,
                input_lengths=str(s.isl),
                output_lengths=str(s.osl),
                seed=SEED,
                engine="vllm",
                **traffic_options(s),
                **ENGINE,
            )
        except Exception as exc:  # noqa: BLE001 - a crash is a row of the table, with its traceback on stderr
            traceback.print_exc()
            return {"crash": f"{type(exc).__name__}: {exc}"}
        row = {
            k: report.summary.get(k)
            for k in text.METRICS
            + ("completed", "duration", "request_throughput", "mean_itl_ms", "preemptions")
        }
        trace = report.iterations_trace
        decode = [i for i in range(len(trace.duration)) if trace.prefill_tokens[i] == 0]
        mixed = [i for i in range(len(trace.duration)) if trace.prefill_tokens[i] > 0]

        def mean(values) -> float | None:
            values = list(values)
            return sum(values) / len(values) if values else None

        row.update(
            kv_blocks=report.kv_blocks,
            kv_tokens=report.kv_blocks * report.limits.block_size,
            kv_requests=report.kv_blocks // math.ceil((s.isl + s.osl) / report.limits.block_size),
            iterations=report.iterations,
            mean_running=report.mean_running,
            decode_iterations=len(decode),
            mixed_iterations=len(mixed),
            decode_iteration_ms=mean(trace.duration[i] * 1e3 for i in decode),
            decode_iteration_running=mean(trace.running[i] for i in decode),
            mixed_iteration_ms=mean(trace.duration[i] * 1e3 for i in mixed),
            mixed_iteration_prefill_tokens=mean(trace.prefill_tokens[i] for i in mixed),
            notes=report.notes,
        )
        return row

    def step_ms(self, s: Scenario, prompt_tokens: int, decodes: int, prompts: int = 1) -> float:
        """castcore's time for one iteration: ``prompts`` equal prompt chunks of ``prompt_tokens`` in all (none if
        0) beside ``decodes`` decode tokens at the mean KV length of a request's decode (isl + osl/2), as castcore
        simulate prices it."""
        from castcore.serving.step_time import StepTimes

        key = (s.model, s.device, s.tp)
        if key not in self._steps:
            self._steps[key] = StepTimes(
                self.session.pipeline,
                self.castcore.build_workload(s.model, tp=s.tp),
                s.device,
                ENGINE["max_batched_tokens"],
                min(ENGINE["max_running_requests"], ENGINE["max_batched_tokens"]),
            )
        chunks = ([(prompt_tokens // prompts, 0)] * prompts if prompt_tokens else []) + [
            (1, s.isl + s.osl // 2)
        ] * decodes
        return self._steps[key](chunks) * 1e3

    def classes_ms(self, s: Scenario, phase: str, batch: int, tokens: int) -> dict:
        """Where castcore puts the time of one step, in the op classes AIConfigurator's per-op figures also fall
        in: a decode step of ``batch`` sequences at KV length ``tokens``, or a prefill of ``tokens`` prompt tokens
        (castcore estimate's deployed step, the workload castcore simulate's captures are made of)."""
        workload = self.castcore.build_workload(
            s.model,
            batch=batch,
            seq=tokens,
            phase=phase,
            tp=s.tp,
            kv_len=tokens if phase == "decode" else None,
        )
        report = self.session.estimate(workload, device=s.device)
        classes, calls = dict.fromkeys(text.CLASSES, 0.0), 0
        for record in report.records:
            kind = text.CASTCORE_CLASS.get(
                castcore_bucket(record.invoke.name, record.invoke.module or ""), "other"
            )
            classes[kind] += record.estimate.time_s * 1e3
            calls += kind == "collectives" and not record.invoke.name.endswith("wait_tensor")
        # calls: waits not counted
        return {
            "total": report.time_s * 1e3,
            **classes,
            "collective_calls": calls,
        }


def aic_classes(ops: dict) -> dict:
    """AIConfigurator's per-op milliseconds of a step in the same classes (its op names: context_/generation_ +
    qkv_gemm, attention, ar_1, moe, ...). Its MoE pre- and post-dispatch are the experts' communication (under TP
    the reduction of their outputs), so they count as collectives."""
    classes = dict.fromkeys(text.CLASSES, 0.0)
    for op, ms in ops.items():
        name = op.split("_", 1)[1] if "_" in op else op
        if "attention" in name:
            kind = "attention"
        elif "_ar_" in f"_{name}_" or "p2p" in name or "dispatch" in name:
            kind = "collectives"
        elif "gemm" in name or name == "moe":
            kind = "GEMM"
        else:
            kind = "other"
        classes[kind] += ms
    return {"total": sum(ops.values()), **classes}


# ------------------------------------------------------------------------------------------------ AIConfigurator


@contextlib.contextmanager
def quiet():
    """AIConfigurator logs each table it loads and warns about its deprecated distribution: kept off the output.
    Each estimate also wraps sys.stderr once more (a "[rank0]: " prefix per call): the streams are put back."""
    streams = sys.stdout, sys.stderr
    logging.disable(logging.WARNING)
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        try:
            yield
        finally:
            logging.disable(logging.NOTSET)
            sys.stdout, sys.stderr = streams


class AIConfigurator:
    def __init__(self, workdir: Path):
        self.workdir = workdir
        self._largest: dict = {}

    def model_path(self, model: str) -> str:
        """Llama 3.1 configs are among the ones aiconfigurator-core resolves by name; Mixtral's config ships in its
        model_configs folder but is not resolved by name (it would be fetched from the Hub), so it is handed over as
        a local folder holding that config.json, made in the run's temp directory."""
        name = AIC_MODELS[model]
        if model != "mixtral-8x7b":
            return name
        from importlib import resources

        folder = self.workdir / name.replace("/", "--")
        if not folder.exists():
            folder.mkdir(parents=True)
            source = (
                resources.files("aiconfigurator_core")
                / "model_configs"
                / f"{name.replace('/', '--')}_config.json"
            )
            (folder / "config.json").write_text(source.read_text())
        return str(folder)

    def estimate(self, s: Scenario, batch: int):
        from aiconfigurator.cli.api import cli_estimate

        moe = {"moe_tp_size": s.tp, "moe_ep_size": 1} if s.model == "mixtral-8x7b" else {}  # castcore: ep 1
        with quiet():
            return cli_estimate(
                self.model_path(s.model),
                AIC_SYSTEMS[s.device],
                mode="agg",
                backend_name=AIC_BACKEND[0],
                backend_version=AIC_BACKEND[1],
                isl=s.isl,
                osl=s.osl,
                batch_size=batch,
                tp_size=s.tp,
                free_gpu_memory_fraction=ENGINE["kv_memory_fraction"],
                **moe,
            )

    def largest_batch(self, s: Scenario) -> tuple[int, str | None]:
        """The largest batch AIConfigurator's own memory model admits, up to the engine's running-request limit
        and the request count (bisection over its OOM answer)."""
        key = (s.model, s.device, s.tp, s.isl, s.osl, s.requests)
        if key not in self._largest:
            low, high, why = 0, min(s.requests, ENGINE["max_running_requests"]), None
            while low < high:
                middle = (low + high + 1) // 2
                try:
                    self.estimate(s, middle)
                    low = middle
                except RuntimeError as exc:
                    if "OOM" not in str(exc):
                        raise
                    why, high = str(exc), middle - 1
            self._largest[key] = (low, why)
        return self._largest[key]

    def run(self, s: Scenario) -> dict:
        if s.device not in AIC_SYSTEMS or s.model not in AIC_MODELS:
            return not_run(("no data", f"no {AIC_BACKEND[0]} data for {s.device} or no config for {s.model}"))
        if s.mode == "rate":
            return not_run(text.AIC_NO_RATE)
        try:
            batch, why = (int(s.value), None) if s.mode == "concurrency" else self.largest_batch(s)
            if batch < 1:
                return not_run(("out of memory", f"AIConfigurator admits no batch: {why}"))
            result = self.estimate(s, batch)
        except Exception as exc:  # noqa: BLE001 - the reason goes in the table
            traceback.print_exc()
            return not_run(("failed", f"AIConfigurator failed: {type(exc).__name__}: {str(exc)[:200]}"))
        row = result.summary.get_summary_df().iloc[0].to_dict()
        scheduling = result.per_ops_data["scheduling"]
        from aiconfigurator_core.sdk.backends.vllm_backend import VLLMBackend

        queuing = VLLMBackend._ttft_queuing_factor(None, batch, 0.0)  # the method reads nothing of self
        steps = {
            name: {op: float(ms) for op, ms in ops.items()}
            for name, ops in result.per_ops_data.items()
            if name in ("mix_step", "genonly_step")
        }
        return {
            "batch": batch,
            "largest_batch_oom": why,
            # AIConfigurator's tokens/s counts osl - 1 tokens a request (the first comes with the prefill); vLLM
            # bench's output_throughput, as castcore's, counts all osl: its requests/s times osl.
            "output_throughput": float(row["seq/s"]) * s.osl,
            "aic_tokens_per_s": float(row["tokens/s"]),
            "request_throughput": float(row["seq/s"]),
            "mean_ttft_ms": float(row["ttft"]),
            "mean_tpot_ms": float(row["tpot"]),
            "request_latency_ms": float(row["request_latency"]),
            "memory_gib": float(row["memory"]),
            "mix_step_ms": float(scheduling["mix_step_latency_ms"]),
            "mix_prompt_tokens": int(scheduling["mix_context_tokens"]),
            "mix_decodes": int(scheduling["mix_decode_requests"]),
            "decode_step_ms": float(scheduling["genonly_step_latency_ms"]),
            "mix_steps": float(scheduling["num_mix_steps"]),
            "decode_steps": float(scheduling["num_genonly_steps"]),
            "ttft_queuing_factor": queuing,
            "ttft_dispatch_ms": float(row["ttft"]) / queuing - float(scheduling["mix_step_latency_ms"]),
            "step_ops_ms": steps,
        }  # summed into op classes by compare(), then dropped: only totals are kept


# ------------------------------------------------------------------------------------------------------- Vidur


class Vidur:
    """Vidur runs as its own process (python -m vidur.main), one per scenario, in the run's temp directory, offline:
    its predictor's snapshot_download finds each dataset in a Hugging Face cache seeded from the local copies (a
    snapshot folder and the ref main naming it), and the models it trains are cached there for the next scenario."""

    def __init__(self, workdir: Path, datasets: dict, profiles: Path):
        self.workdir = workdir
        self.datasets = datasets
        self.profiles = profiles
        self.cache = workdir / "cache-vidur"  # not vidur-*: those are the runs' output folders, counted
        self._failed: dict = {}  # a deployment whose profiles could not be had: the reason, said once per deployment

    def seed(self, kind: str, dataset: str) -> list[str]:
        """Put the local copy of ``dataset`` where Vidur's snapshot_download looks offline
        (<cache_dir>/profiling_data/<kind>/datasets--<org>--<name>/snapshots/local/); the files missing, if any."""
        source = self.profiles / dataset
        missing = [name for name in VIDUR_FILES[kind] if not (source / name).is_file()]
        if missing:
            return missing
        storage = self.cache / "profiling_data" / kind / f"datasets--{dataset.replace('/', '--')}"
        snapshot = storage / "snapshots" / "local"
        if not snapshot.exists():
            snapshot.mkdir(parents=True)
            for name in VIDUR_FILES[kind]:
                shutil.copyfile(source / name, snapshot / name)
            (storage / "refs").mkdir()
            (storage / "refs" / "main").write_text("local")
        return []

    def run(self, s: Scenario) -> dict:
        if s.model not in VIDUR_MODELS:
            return not_run(text.VIDUR_NO_MODEL)
        if s.device not in VIDUR_DEVICES:
            return not_run(text.VIDUR_NO_DEVICE)
        if s.mode == "concurrency":
            return not_run(text.VIDUR_NO_CLOSED_LOOP)
        if (s.model, s.device) not in self.datasets:
            return not_run(text.VIDUR_NO_DATASET, model=s.model)
        key = (s.model, s.device, s.tp)
        if key in self._failed:
            return self._failed[key]
        device, network = VIDUR_DEVICES[s.device]
        model_data, network_data = self.datasets[(s.model, s.device)]
        missing = {
            dataset: files
            for kind, dataset in (("compute", model_data), ("network", network_data))
            if (files := self.seed(kind, dataset))
        }
        if missing:
            where = "; ".join(f"{shown(self.profiles / d)}: no {', '.join(f)}" for d, f in missing.items())
            self._failed[key] = not_run(
                text.VIDUR_NO_PROFILES, datasets=f"{model_data} and {network_data}", where=where
            )
            return self._failed[key]
        predictor = "--random_forrest_execution_time_predictor_config"  # Vidur's default predictor
        out = self.workdir / f"vidur-{len(list(self.workdir.glob('vidur-*')))}"
        interval = (
            [
                "--interval_generator_config_type",
                "poisson",
                "--poisson_request_interval_generator_config_qps",
                str(s.value),
            ]
            if s.mode == "rate"
            else ["--interval_generator_config_type", "static"]
        )
        command = [
            sys.executable,
            "-m",
            "vidur.main",
            "--seed",
            str(SEED),
            "--replica_config_model_name",
            VIDUR_MODELS[s.model],
            "--replica_config_device",
            device,
            "--replica_config_network_device",
            network,
            "--replica_config_tensor_parallel_size",
            str(s.tp),
            "--replica_config_num_pipeline_stages",
            "1",
            # the simulator's memory share is the cache's margin (vidur/utils/memory_planner.py); its
            # replica_config_gpu_memory_utilization is read by its profiling only
            "--cache_config_memory_margin_fraction",
            f"{1 - ENGINE['kv_memory_fraction']:.6g}",
            "--cache_config_block_size",
            str(ENGINE["block_size"]),
            "--replica_scheduler_config_type",
            "vllm",
            "--vllm_scheduler_config_batch_size_cap",
            str(ENGINE["max_running_requests"]),
            "--vllm_scheduler_config_max_tokens_in_batch",
            str(ENGINE["max_batched_tokens"]),
            "--request_generator_config_type",
            "synthetic",
            "--synthetic_request_generator_config_num_requests",
            str(s.requests),
            "--synthetic_request_generator_config_max_tokens",
            str(s.isl + s.osl),
            "--length_generator_config_type",
            "fixed",
            "--fixed_request_length_generator_config_prefill_tokens",
            str(s.isl),
            "--fixed_request_length_generator_config_decode_tokens",
            str(s.osl),
            "--fixed_request_length_generator_config_max_tokens",
            str(s.isl + s.osl),
            f"{predictor}_model_profiling_dataset",
            model_data,
            f"{predictor}_network_profiling_dataset",
            network_data,
            f"{predictor}_cache_dir",
            str(self.cache),
            # the predictor's tables must cover the engine's batches: up to 1,024 decodes (its default, 128,
            # would leave larger batches without a prediction) and 8,192 batched tokens; its default 2 Mi
            # tokens a request would have it predict every op for 2 Mi token counts, which these lengths
            # never reach
            f"{predictor}_prediction_max_batch_size",
            str(ENGINE["max_running_requests"]),
            f"{predictor}_prediction_max_tokens_per_request",
            str(2 * ENGINE["max_batched_tokens"]),
            # its random forests' grid search, cut to fit two cores: 250 trees (the smallest of its 250, 500 and
            # 750), its depths and split sizes kept, 3-fold (its default 10) on one worker; trained once a
            # deployment, then cached
            f"{predictor}_num_estimators",
            "250",
            f"{predictor}_k_fold_cv_splits",
            "3",
            f"{predictor}_num_training_job_threads",
            "1",
            *interval,
            "--metrics_config_output_dir",
            str(out),
            "--no-metrics_config_store_plots",
        ]
        try:
            # nothing is downloaded
            done = subprocess.run(
                command,
                cwd=self.workdir,
                capture_output=True,
                text=True,
                timeout=VIDUR_TIMEOUT_S,
                env={**os.environ, "HF_HUB_OFFLINE": "1"},
            )
        except subprocess.TimeoutExpired:
            return not_run(("timed out", f"Vidur ran past {VIDUR_TIMEOUT_S} s"))
        if done.returncode != 0:
            errors = [line.strip() for line in done.stderr.splitlines() if "Error" in line.split(":")[0]]
            error = (errors[-1] if errors else done.stderr.strip()[-300:])[:300]
            return not_run(("failed", f"Vidur failed: {error}"))
        row = self.read(out, s)
        if "na" not in row:
            row.update(self.steps(out), kv_tokens=self.kv_tokens(s))
            row["kv_requests"] = row["kv_tokens"] // (
                math.ceil((s.isl + s.osl) / ENGINE["block_size"]) * ENGINE["block_size"]
            )
        return row

    @staticmethod
    def kv_tokens(s: Scenario) -> int:
        """Vidur's KV capacity in tokens, from its own memory planner (vidur/utils/memory_planner.py): the device's
        memory times (1 - margin) less its count of the weights, over the KV bytes a token takes on a device."""
        from vidur.config import CacheConfig, ReplicaConfig
        from vidur.utils.memory_planner import MemoryPlanner

        device, network = VIDUR_DEVICES[s.device]
        replica = ReplicaConfig(
            model_name=VIDUR_MODELS[s.model],
            device=device,
            network_device=network,
            tensor_parallel_size=s.tp,
            num_pipeline_stages=1,
        )
        cache = CacheConfig(
            block_size=ENGINE["block_size"], memory_margin_fraction=1 - ENGINE["kv_memory_fraction"]
        )
        return int(MemoryPlanner(replica, cache).get_max_kv_cache_size_in_tokens())

    @staticmethod
    def steps(out: Path) -> dict:
        """Vidur's iterations, from its chrome_trace.json (one event a batch: its duration in microseconds, its
        requests' query and KV tokens): the mean time and size of its decode-only and of its prompt-carrying ones."""
        import json

        found = sorted(out.rglob("chrome_trace.json"))
        if not found:
            return {}
        events = [e for e in json.loads(found[-1].read_text())["traceEvents"] if e.get("ph") == "X"]
        decode = [e for e in events if all(q == 1 for q in e["args"]["num_q_tokens"])]
        mixed = [e for e in events if any(q > 1 for q in e["args"]["num_q_tokens"])]

        def mean(values) -> float | None:
            values = list(values)
            return sum(values) / len(values) if values else None

        compositions: dict[str, int] = {}  # "prompts,prompt tokens,decodes" -> iterations of that make-up
        for e in mixed:
            q = e["args"]["num_q_tokens"]
            key = f"{sum(t > 1 for t in q)},{sum(t for t in q if t > 1)},{sum(t == 1 for t in q)}"
            compositions[key] = compositions.get(key, 0) + 1
        return {
            "iterations": len(events),
            "mix_compositions": compositions,
            "decode_steps": len(decode),
            "mix_steps": len(mixed),
            "decode_step_ms": mean(e["dur"] / 1e3 for e in decode),
            "decode_running": mean(e["args"]["batch_size"] for e in decode),
            "decode_kv": mean(sum(e["args"]["num_kv_tokens"]) / e["args"]["batch_size"] for e in decode),
            "mix_step_ms": mean(e["dur"] / 1e3 for e in mixed),
            "mix_prompt_tokens": mean(sum(q for q in e["args"]["num_q_tokens"] if q > 1) for e in mixed),
            "mix_decodes": mean(sum(q == 1 for q in e["args"]["num_q_tokens"]) for e in mixed),
            "mean_running": mean(e["args"]["batch_size"] for e in events),
        }

    @staticmethod
    def read(out: Path, s: Scenario) -> dict:
        """Vidur's request_metrics.csv (vidur/metrics/metrics_store.py): seconds from arrival to the end and to the
        prefill's end, and the decode time per decode token. The run's duration: the last request's arrival (the sum
        of the inter-arrival delays) plus its end-to-end time."""
        import pandas as pd

        found = sorted(out.rglob("request_metrics.csv"))
        if not found:
            return not_run(("no output", f"Vidur wrote no request_metrics.csv under {out}"))
        df = pd.read_csv(found[-1])
        ttft, e2e = df["prefill_e2e_time"] * 1e3, df["request_e2e_time"]
        tpot = df["decode_time_execution_plus_preemption_normalized"] * 1e3
        arrivals = (
            df["request_inter_arrival_delay"].cumsum() if "request_inter_arrival_delay" in df else 0 * e2e
        )
        duration = float((arrivals + e2e).max())
        return {
            "completed": len(df),
            "duration": duration,
            "output_throughput": len(df) * s.osl / duration,
            "mean_ttft_ms": float(ttft.mean()),
            "median_ttft_ms": float(ttft.median()),
            "p99_ttft_ms": float(ttft.quantile(0.99)),
            "mean_tpot_ms": float(tpot.mean()),
            "mean_e2el_ms": float(e2e.mean() * 1e3),
        }


def profile_digests(profiles: Path, datasets: dict) -> dict:
    """The SHA-256 of each local profile file the run could use, by dataset: which data Vidur's rows came from."""
    out = {}
    for compute, network in datasets.values():
        for kind, dataset in (("compute", compute), ("network", network)):
            files = [profiles / dataset / name for name in VIDUR_FILES[kind]]
            out[dataset] = {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in files if f.is_file()}
    return out


# -------------------------------------------------------------------------------------------------------- main


def compare(s: Scenario, cc: dict, peer: dict, castcore: Castcore) -> dict:
    """castcore/peer for each figure both have; castcore's time for the peer's own mixed and decode-only steps (the
    same token counts: AIConfigurator's steady-state steps, Vidur's mean iterations), which the explanations read."""
    if "na" in peer or "crash" in cc:
        peer.pop("step_ops_ms", None)
        return {}
    ratios = {m: cc[m] / peer[m] for m in text.METRICS if cc.get(m) and peer.get(m)}
    extra = {}
    # Vidur: castcore's mean over the make-ups of Vidur's prompt-carrying iterations
    if "step_ops_ms" not in peer:
        if peer.get("mix_step_ms"):
            priced = [
                (castcore.step_ms(s, tokens, decodes, prompts), n)
                for key, n in peer["mix_compositions"].items()
                for prompts, tokens, decodes in [map(int, key.split(","))]
            ]
            extra["castcore_mix_step_ms"] = sum(ms * n for ms, n in priced) / sum(n for _, n in priced)
        if peer.get("decode_step_ms"):
            extra["castcore_decode_step_ms"] = castcore.step_ms(s, 0, round(peer["decode_running"]))
        return {"ratios": ratios, **extra}
    if "mix_step_ms" in peer:
        extra["castcore_mix_step_ms"] = castcore.step_ms(s, peer["mix_prompt_tokens"], peer["mix_decodes"])
        # none when every step of AIConfigurator's request life carries a prompt
        if peer["decode_step_ms"] > 0:
            extra["castcore_decode_step_ms"] = castcore.step_ms(s, 0, peer["batch"])
            extra["decode_classes_ms"] = {
                "castcore": castcore.classes_ms(s, "decode", peer["batch"], s.isl + s.osl // 2),
                "aiconfigurator": aic_classes(peer["step_ops_ms"]["genonly_step"]),
            }
        # the mixed step's prompt part: AIConfigurator's context ops, castcore's prefill of the same prompt
        extra["prompt_classes_ms"] = {
            "castcore": castcore.classes_ms(s, "prefill", 1, peer["mix_prompt_tokens"]),
            "aiconfigurator": aic_classes(
                {op: ms for op, ms in peer["step_ops_ms"]["mix_step"].items() if op.startswith("context_")}
            ),
        }
    del peer["step_ops_ms"]
    return {"ratios": ratios, **extra}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="two small scenarios only (a smoke test)")
    parser.add_argument(
        "--out",
        help="where to write the JSON (and the .md beside it); default "
        "bench/results/peers_serving.json, or the temp directory with --quick",
    )
    parser.add_argument(
        "--vidur-dataset",
        action="append",
        default=[],
        metavar="MODEL=MODEL_DATASET[,NETWORK_DATASET]",
        help="the Hugging Face dataset of Vidur's profiles of a castcore preset on the H100 (and of "
        "the network: default project-vajra/dev-staging-h100-dgx); repeatable",
    )
    parser.add_argument(
        "--vidur-profiles",
        type=Path,
        default=VIDUR_PROFILES,
        metavar="DIR",
        help="the local copies of Vidur's Hugging Face datasets, DIR/<org>/<dataset>/ (default "
        "bench/peers_data/vidur; see its README.md)",
    )
    args = parser.parse_args()
    out = args.out or (
        Path(tempfile.gettempdir()) / "peers-serving-quick.json"
        if args.quick
        else "bench/results/peers_serving.json"
    )
    datasets = dict(VIDUR_DATASETS)
    for given in args.vidur_dataset:
        model, _, names = given.partition("=")
        compute, _, network = names.partition(",")
        datasets[(model, "h100-sxm5-80gb")] = (
            compute,
            network or VIDUR_DATASETS[("llama-3-8b", "h100-sxm5-80gb")][1],
        )
    versions = figures.peer_versions(PEERS, "bench/peers_serving.py", "peers_serving")
    versions["castcore"] = metadata.version("castcore")
    os.environ.setdefault("WANDB_MODE", "disabled")  # Vidur imports wandb; nothing is logged anywhere
    castcore = Castcore()
    rows, started = [], time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="peers-serving-") as work:
        aic, vidur = AIConfigurator(Path(work)), Vidur(Path(work), datasets, args.vidur_profiles)
        todo = scenarios(args.quick)
        for i, s in enumerate(todo, 1):
            clock = time.perf_counter()
            row = {**asdict(s), "label": s.label, "deployment": s.deployment, "traffic": s.traffic}
            row["castcore"] = castcore.run(s)
            row["castcore_s"] = time.perf_counter() - clock
            for key, peer in (("aiconfigurator", aic), ("vidur", vidur)):
                clock = time.perf_counter()
                row[key] = peer.run(s)
                row[f"{key}_s"] = time.perf_counter() - clock
                row[f"castcore_vs_{key}"] = compare(s, row["castcore"], row[key], castcore)
            rows.append(row)
            print(
                f"[{i}/{len(todo)}] {s.label}: "
                + text.progress(row)
                + f" ({time.perf_counter() - started:.0f} s)",
                file=sys.stderr,
                flush=True,
            )
    result = {
        "versions": versions,
        "engine": ENGINE,
        "seed": SEED,
        "quick": args.quick,
        "aiconfigurator_backend": {"backend": AIC_BACKEND[0], "version": AIC_BACKEND[1]},
        "aiconfigurator_models": AIC_MODELS,
        "vidur_models": VIDUR_MODELS,
        "gap": text.GAP,
        "vidur_datasets": {f"{m} on {d}": list(v) for (m, d), v in datasets.items()},
        "vidur_profiles": profile_digests(args.vidur_profiles, datasets),
        "seconds": time.perf_counter() - started,
        "rows": rows,
    }
    result["summary"] = text.summary(rows)
    figures.write(out, result, lambda machine: text.markdown(result, machine))
    if any("crash" in row["castcore"] for row in rows):
        sys.exit("bench/peers_serving.py: castcore failed on some scenarios (tracebacks above)")


if __name__ == "__main__":
    main()
