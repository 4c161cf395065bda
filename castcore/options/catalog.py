"""Every option castcore takes, once: the command line's options, a sweep's axes, ``build_workload``'s keywords, the
``Workload``'s fields and the documentation's option tables are all made from these declarations."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from castcore.devices.dtypes import MODEL_DTYPES, TENSOR_DTYPES
from castcore.options.option import Option, Placeholder

DEFAULT_MODEL = "llama-3-8b"
PHASES = ("prefill", "decode")
BLOCK_FP8 = "fp8-block"  # fp8 weights in 128 x 128 blocks, W8A8 by itself: its activations fp8 in 1 x 128 groups
WEIGHT_DTYPES = ("bf16", "fp16", "fp8", BLOCK_FP8, "int8", "int4", "nvfp4", "mxfp4")
ACTIVATION_DTYPES = ("int8", "fp8")  # W8A8 with weights of the same kind; fp8 with int4 weights is W4A8
KV_CACHE_DTYPES = ("bf16", "fp16", "fp8", "int8")
KV_READS = ("group", "head")  # a fused attention kernel reads each grouped K/V head once, or once per query head
EP_KERNELS = ("normal", "low-latency", "auto")  # expert-parallel dispatch and combine, as DeepEP's two kernel sets

# Scopes: an "axis" is a point's parameter (a sweep varies it); a "session" option sets up plugins and devices
# (one setting for a whole sweep); an "output" option says how a command prints (no meaning in a sweep).
AXIS, SESSION, OUTPUT = "axis", "session", "output"

MODEL, KERNELS, PARALLEL, REQUEST = "model", "kernels and quantization", "parallelism (figures are per device)", "request"
PLUGINS, PRINTING, SEARCH, RUNNING = "plugins and devices", "output", "search", "running"
OPERATOR, CALL, ARGUMENTS = "operator", "the example call", "arguments"


def _int(name: str, default: int | None, help: str, group: str, **more: Any) -> Option:
    return Option(name, help, group, kind="int", default=default, metavar=more.pop("metavar", "N"), **more)


def _switch(name: str, help: str, group: str, **more: Any) -> Option:
    return Option(name, help, group, kind="bool", default=more.pop("default", False), **more)


MODEL_OPTION = Option("model", "a preset ({presets}), a transformers config.json path, or package.module:factory",
                      MODEL, default=DEFAULT_MODEL)
DTYPE = Option("dtype", "weights and activations; tf32 is float32 with TF32 matrix products", MODEL,
               default="bf16", choices=MODEL_DTYPES)
STEP = (
    MODEL_OPTION,
    _int("batch", 1, "sequences per batch", MODEL),
    _int("seq", 2048, "tokens per sequence", MODEL),
    DTYPE,
    Option("phase", "prefill: --seq tokens at once; decode: one new token per sequence over a KV cache", MODEL,
           default="prefill", choices=PHASES),
    _int("kv_len", None, "tokens already in the KV cache for --phase decode", MODEL, optional=True,
         shown_default="--seq"),
    _switch("train", "a training step: forward and backward of the loss", MODEL),
    _switch("all_logits", "a prefill computes the LM head for every token (scoring), not only the last one a server "
            "samples from (the default)", MODEL),
    _switch("reuse", "run every one of a model's identical layers on fake tensors instead of capturing one and "
            "replaying it for the rest (same totals, slower)", MODEL, default=True, flag="--no-reuse", negated=True),
)
DEPLOYMENT = (
    _switch("fuse", "price the Hugging Face graph as it runs eagerly, instead of the fused kernels a serving engine "
            "runs (fused attention, RMSNorm, add+RMSNorm, rotary, SwiGLU, MoE)", KERNELS, default=True,
            flag="--eager", negated=True),
    Option("weights", "quantized weights; alone, weight-only quantization (dequantized in the matmul, activations "
           "stay in --dtype); fp8-block: fp8 with a scale per 128x128 block, its activations quantized per 1x128 "
           "group (DeepSeek-V3's checkpoints); nvfp4: fp4 with an fp8 scale per 16, its activations NVFP4 too (W4A4 "
           "at the device's fp4 rate, which it must have); mxfp4: fp4 with a power-of-two scale per 32 (gpt-oss's "
           "experts), MXFP8 activations where the device has an fp4 rate, else weight-only; a checkpoint's own "
           "quantization_config is the default", KERNELS, choices=WEIGHT_DTYPES, optional=True, metavar="DTYPE",
           shown_default="--dtype"),
    Option("activations", "with --weights of the same dtype: W8A8 / FP8 matmuls (activations quantized per token); "
           "fp8 with --weights int4: W4A8, products at the fp8 rate",
           KERNELS, choices=ACTIVATION_DTYPES, optional=True, metavar="DTYPE", shown_default="--dtype"),
    Option("kv_cache", "KV cache dtype", KERNELS, choices=KV_CACHE_DTYPES, optional=True, metavar="DTYPE",
           shown_default="--dtype"),
    Option("kv_reads", "how the fused attention kernel reads grouped K/V heads (GQA): 'group' once per K/V head for "
           "its query heads (FlashAttention, FlashInfer, TensorRT-LLM's XQA), 'head' once per query head, as "
           "TensorRT-LLM's masked MHA kernel did before 0.7", KERNELS, default="group", choices=KV_READS),
    _int("tp", 1, "tensor parallel over N devices (torch's parallelize_module on a fake process group): estimate "
         "one device's compute, memory and collectives", PARALLEL),
    _switch("sp", "sequence parallelism with --tp: norms and elementwise ops on 1/N of the tokens, reduce-scatter "
            "and all-gather instead of all-reduce", PARALLEL),
    _int("ep", 1, "expert parallel over N devices (MoE models): experts split across them, tokens dispatched and "
         "combined by all-to-all; above --tp, attention runs data-parallel over ep/tp groups", PARALLEL),
    _int("attention_dp", 1, "attention data parallel over N groups of --tp devices, the experts split over all "
         "N x tp of them (--ep N x tp), as TensorRT-LLM's and SGLang's DP attention run DeepSeek", PARALLEL),
    Option("ep_kernels", "how --ep dispatches and combines: 'normal' the fastest all-to-all, hierarchical across the "
           "fast domain and the network across nodes (DeepEP's normal kernels); 'low-latency' every rank sending "
           "straight to every other in one step, one network latency (DeepEP's low-latency kernels); 'auto' "
           "low-latency for decode steps (SGLang's DeepEP mode auto)", PARALLEL, default="normal", choices=EP_KERNELS),
    Option("expert_skew", "MoE routing as uneven as real traffic: expert loads a power law of exponent ALPHA (1.01 "
           "fits DeepSeek-V3, 1.2 Qwen3-235B, as NVIDIA's AIConfigurator draws them): fewer experts' weights read, "
           "with --ep the busiest device takes more rows (default: balanced)", PARALLEL, kind="number",
           optional=True, metavar="ALPHA"),
    _int("pp", 1, "pipeline parallel over N stages: layers split into stages, activations sent between them", PARALLEL),
    _int("micro_batches", 1, "with --pp: the batch goes through the stages in M micro-batches", PARALLEL, metavar="M"),
    _int("lora_rank", None, "multi-LoRA: adapters of rank R on every attention and MLP projection, each token's "
         "applied by grouped GEMMs (with --adapters)", KERNELS, optional=True, metavar="R"),
    _int("adapters", None, "multi-LoRA: N adapters resident, requests spread over them", KERNELS, optional=True),
    _int("dp", 1, "data-parallel replicas of the whole deployment, for throughput", PARALLEL),
)
DEVICE = Option("device", "device profile name (castcore devices lists them; default: the configured default_device, "
                "else the first profile marked default)", MODEL, optional=True, metavar="NAME")
NO_CACHE = _switch("no_cache", "capture anew and keep nothing: by default a capture is stored in castcore's cache "
                   "(castcore cache info) and a later run with the same model, options and castcore, torch, "
                   "transformers and pack versions loads it instead of building the model", PLUGINS)
PLUGIN_OPTIONS = (
    Option("custom_op_dir", "load every *.py in DIR as a plugin that beats installed packs (repeatable; also "
           "CASTCORE_CUSTOM_OP_PATH)", PLUGINS, kind="path", many=True, optional=True, metavar="DIR"),
    _switch("no_default_custom_op_dirs", "do not load custom_op/ in the project root and "
            "$XDG_CONFIG_HOME/castcore/custom_op (also default_custom_op_dirs = false in castcore.toml)", PLUGINS),
    Option("device_file", "add a device profile from a TOML file (repeatable); the first is the default device",
           PLUGINS, kind="path", many=True, optional=True, metavar="TOML"),
    _switch("no_packs", "load no installed packs (same as CASTCORE_LOAD_PACKS=)", PLUGINS),
    Option("strict", "fail on any plugin that did not load, and as each command says (also CASTCORE_STRICT=1)",
           PLUGINS, kind="bool", optional=True),
    _switch("debug", "show tracebacks instead of one-line errors", PLUGINS),
)
JSON = _switch("json", "print the figures as JSON", PRINTING)
REQUEST_TOKENS = (
    _int("input_tokens", 2048, "prompt tokens per request", REQUEST, flag="--input"),
    _int("output_tokens", 256, "tokens each request generates", REQUEST, flag="--output"),
)
SERVE_BATCH = (
    _int("batch", 1, "requests served together", REQUEST),
    _switch("max_batch", "use the largest batch whose memory fits the device (bisection over peak memory per batch, "
            "confirmed by capture)", REQUEST, python='batch="max"'),
)
COST = "cost"
PRICE = Option("price_per_device_hour", "dollars one device costs an hour: adds $ per million input tokens (the "
               "prefill's device time), $ per million output tokens (the decode's) and the deployment's $/hour",
               COST, kind="number", optional=True, metavar="USD")
WORKERS = (
    _int("workers", None, "local worker processes (default: the CPU count)", RUNNING, optional=True),
    Option("backend", "local processes, or Ray tasks (needs castcore[ray])", RUNNING, default="local",
           choices=("local", "ray")),
    Option("ray_address", "the Ray cluster to run on (default: RAY_ADDRESS, else a local Ray instance of --workers "
           "CPUs)", RUNNING, optional=True, metavar="ADDR"),
)


@dataclass(frozen=True)
class CommandOptions:
    """One command's options, in the order its --help lists them, each with its scope; groups given one at most."""

    name: str
    options: tuple[tuple[Option, str], ...]
    exclusive: tuple[tuple[str, ...], ...] = ()  # groups of options given one at most

    def __getitem__(self, name: str) -> Option:
        return next(o for o, _ in self.options if o.name == name)

    def scoped(self, *scopes: str) -> list[Option]:
        return [o for o, scope in self.options if scope in scopes]

    def only(self, *names: str) -> CommandOptions:
        """These of the command's options, as a command of their own (the plugin options other commands take)."""
        return replace(self, options=tuple((o, s) for o, s in self.options if o.name in names), exclusive=())


def _scoped(scope: str, options: Iterable[Option]) -> tuple[tuple[Option, str], ...]:
    return tuple((o, scope) for o in options)


def _with(option: Option, **changes: Any) -> Option:
    return replace(option, **changes)


ESTIMATE = CommandOptions("estimate", (
    *_scoped(AXIS, (*STEP, *DEPLOYMENT, DEVICE)),
    *_scoped(OUTPUT, (
        _int("top", 30, "rows in the table, slowest first", PRINTING, metavar="K"),
        _with(JSON, help="print the whole report (every op and module row, totals, coverage, memory, workload, "
              "notes) as JSON"),
        _switch("csv", "print the rows (see --by) and a TOTAL row as CSV", PRINTING),
        Option("by", "rows by operator, or by module (layer) that made the calls", PRINTING, default="op",
               choices=("op", "module")),
        Option("trace", "write a Chrome trace (JSON) that Perfetto opens: one slice per op", PRINTING, kind="path",
               optional=True, metavar="FILE"),
        Option("plot", "write a roofline chart (needs matplotlib: castcore[plot])", PRINTING, kind="path",
               optional=True, metavar="PNG"))),
    *_scoped(SESSION, (
        Option("on_error", "when a plugin raises or answers nonsense: stop (raise, the default) or record it and ask "
               "the next plugin (fallback)", PLUGINS, choices=("raise", "fallback"), optional=True),
        NO_CACHE, *PLUGIN_OPTIONS)),
), exclusive=(("json", "csv"),))

SERVE = CommandOptions("serve", (
    *_scoped(AXIS, (MODEL_OPTION, *REQUEST_TOKENS, *SERVE_BATCH, DTYPE, *DEPLOYMENT, DEVICE, PRICE)),
    *_scoped(OUTPUT, (_with(JSON, help="print the figures as JSON (ttft_s, tpot_s, latency_s, output_tokens_per_s, "
                            "memory, ...)"),)),
    *_scoped(SESSION, (NO_CACHE, *PLUGIN_OPTIONS)),
), exclusive=(("batch", "max_batch"),))

TRAFFIC, ENGINE = "traffic", "engine (each defaults to the --engine preset's)"
SPECULATION, DISAGGREGATION = "speculative decoding and prefix caching", "disaggregated prefill and decode"
REQUESTS = _int("requests", 1000, "requests to simulate (with --dataset: its lines)", TRAFFIC)
RATE = Option("rate", "requests per second, arriving as a Poisson process (default: all at once, the offline maximum "
              "throughput)", TRAFFIC, kind="number", optional=True, metavar="QPS")
CONCURRENCY = _int("concurrency", None, "a closed loop of C requests in flight: one starts when one finishes", TRAFFIC,
                   optional=True, metavar="C")
ENGINE_PRESET = Option("engine", "the serving engine whose documented scheduler and memory defaults are simulated",
                       ENGINE, default="vllm", choices=("vllm", "sglang", "trtllm"))
EMIT = Option("emit", "after the plan, print the best deployment's launch command for ENGINE (parallel sizes, "
              "quantization, the engine limits simulated), a benchmark of the same traffic with the engine's own "
              "client, and the castcore simulate --json command whose figures diff against its result file",
              PRINTING, choices=("vllm", "sglang", "trtllm"), optional=True, metavar="ENGINE")
OBJECTIVE = ("at most TIME (500ms, 1s); under traffic (--rate, --concurrency, --max-rate) a statistic of the "
             "simulated requests, STATISTIC:TIME with mean, median, p90, p95 or p99 (a plain TIME is p99)")

PLAN = CommandOptions("plan", (
    *_scoped(AXIS, (
        _with(MODEL_OPTION, default=None, help="a preset, a transformers config.json, or package.module:factory"),
        *REQUEST_TOKENS,
        Option("ttft", f"time to first token {OBJECTIVE}", REQUEST, kind="objective", optional=True,
               metavar="[STATISTIC:]TIME"),
        Option("tpot", f"time per output token {OBJECTIVE}", REQUEST, kind="objective", optional=True,
               metavar="[STATISTIC:]TIME"),
        _with(RATE, help="plan for requests arriving at QPS per second (Poisson), each deployment simulated under "
              "them (castcore simulate) instead of priced as one static batch; replicas (dp) are added until the "
              "objectives are met"),
        _with(CONCURRENCY, help="plan for a closed loop of C requests in flight, simulated as --rate is"),
        _switch("max_rate", "find each deployment's highest request rate that meets --ttft/--tpot (a bisection of "
                "simulations up to its offline throughput), and rank by that rate per device", TRAFFIC),
        _with(REQUESTS, default=500, help="requests each simulation serves (with --rate, --concurrency, --max-rate)"),
        _with(ENGINE_PRESET, help="the serving engine simulated (with --rate, --concurrency, --max-rate)"),
        DTYPE,
        Option("devices", "devices to search (default: every installed one)", SEARCH, flag="--device", many=True,
               optional=True, metavar="NAME"),
        _int("max_devices", 8, "devices in one replica at most", SEARCH),
        _int("tp", None, "tensor parallel sizes (default: the divisors of the attention heads within a node)", SEARCH,
             many=True, optional=True),
        _int("pp", None, "pipeline stages (default: 1, and more beyond a node's tensor parallelism)", SEARCH,
             many=True, optional=True),
        Option("weights", "weight dtypes", SEARCH, default=("bf16", "int8"), choices=WEIGHT_DTYPES, many=True,
               metavar="DTYPE"),
        _int("top", 5, "deployments to print", SEARCH, metavar="K"),
        Option("objective", "what the best maximise: throughput, output tokens/s per device (under --max-rate, "
               "requests/s per device); cost, the fewest $ per million output tokens (needs "
               "--price-per-device-hour); energy, the most output tokens per joule (needs devices with power "
               "numbers)", SEARCH, default="throughput", choices=("throughput", "cost", "energy")),
        PRICE,
        Option("device_prices", "a price per device-hour of its own for a named device, NAME=USD (repeatable "
               "in one list: --device-price b200=6 h100-sxm5-80gb=2.5); the others take --price-per-device-hour",
               COST, flag="--device-price", many=True, optional=True, metavar="NAME=USD"),
        *WORKERS)),
    *_scoped(OUTPUT, (_with(JSON, help="print the best and the fewest as JSON"), EMIT)),
    *_scoped(SESSION, PLUGIN_OPTIONS),
), exclusive=(("rate", "concurrency", "max_rate"),))

SWEEP = CommandOptions("sweep", (
    *_scoped(OUTPUT, (
        Option("out", "write the rows to FILE: .parquet (needs pyarrow: castcore[sweep]), .csv or .jsonl (default: "
               "CSV on stdout)", RUNNING, kind="path", optional=True, metavar="FILE"),
        *WORKERS,
        _switch("resume", "keep the rows already in --out that have no error, and run only the other points",
                RUNNING),
        _switch("yes", "run a spec of more than 100,000 points", RUNNING),
        Option("plot", "draw latency against throughput per device, the Pareto front marked, one colour per device "
               "(needs castcore[plot])", RUNNING, kind="path", optional=True, metavar="PNG"))),
    *_scoped(SESSION, PLUGIN_OPTIONS),
))

AUDIT = CommandOptions("audit", (
    *_scoped(OUTPUT, (
        _with(DEVICE, help="audit this device only (default: every installed device; with --model, the default "
              "device)"),
        Option("op", "only this operator, e.g. aten::mm (every overload) or aten::add.Tensor", PRINTING,
               optional=True),
        _with(JSON, help="print JSON"))),
    *_scoped(AXIS, (_with(MODEL_OPTION, default=None, optional=True, help=MODEL_OPTION.help + "; audit the ops it "
                          "runs (default: no model, every claim)"), *STEP[1:], *DEPLOYMENT)),
    *_scoped(SESSION, PLUGIN_OPTIONS),
))

_LISTING = (_with(JSON, help="print JSON"), *PLUGIN_OPTIONS)
PACKS = CommandOptions("packs", (*_scoped(OUTPUT, _LISTING[:1]), *_scoped(SESSION, _LISTING[1:])))
DEVICES = CommandOptions("devices", PACKS.options)

TARGET = Option("op", "module:function or path/to/file.py:function", OPERATOR, positional=True, metavar="OP")
EXAMPLE_CALL = (
    Option("input", "one positional argument, in order: a tensor 4096x1024 or 4096x1024:bf16, 'scalar', 'none', or a "
           "literal such as 0.5; a bare 8 is a tensor of 8 elements, so pass integers with --arg (repeatable)", CALL,
           kind="path", many=True, default=(), metavar="SPEC"),
    Option("arg", "a named argument, e.g. h=8 for a hidden dim (h t); numbers stay numbers, a tensor is written "
           "4096x1024[:dtype] (repeatable)", CALL, kind="path", many=True, default=(), metavar="NAME=VALUE"),
    Option("dtype", "dtype of tensors given without one", CALL, default="bf16", choices=tuple(sorted(TENSOR_DTYPES))),
)
PARTITION = CommandOptions("partition", (*_scoped(AXIS, (
    TARGET, _int("ways", None, "number of devices to split over", OPERATOR), *EXAMPLE_CALL,
    _with(DEVICE, help="device profile (default: the default device)", group=OPERATOR))),
    *_scoped(OUTPUT, (_with(JSON, help="print the plan as JSON"),)), *_scoped(SESSION, PLUGIN_OPTIONS)))
MEASURE = CommandOptions("measure", (*_scoped(AXIS, (
    TARGET, *EXAMPLE_CALL,
    _int("warmup", 3, "untimed runs first", RUNNING, minimum=0),
    _int("repeat", 10, "timed runs; the median is shown", RUNNING),
    _with(DEVICE, help="device profile to estimate on (default: the default device)", group=OPERATOR))),
    *_scoped(OUTPUT, (_with(JSON, help="print JSON"),)), *_scoped(SESSION, PLUGIN_OPTIONS)))
DEBUG = _with(PLUGIN_OPTIONS[-1], group=PRINTING)
CALIBRATE = CommandOptions("calibrate", (
    *_scoped(OUTPUT, (
        Option("output", "file to write, or - for stdout", PRINTING, kind="path", default="local.toml", short="-o",
               metavar="FILE"),
        Option("name", "the profile's device name", PRINTING, default="local"),
        _switch("quick", "small sizes: seconds instead of a minute, numbers well below peak", RUNNING))),
    *_scoped(SESSION, (DEBUG,))))
NEW_PACK = CommandOptions("new-pack", (
    *_scoped(OUTPUT, (
        Option("name", "the pack's distribution name: lowercase letters, digits and hyphens, e.g. castpack-mynpu; the "
               "module, entry-point and device names default to names derived from it", ARGUMENTS, positional=True,
               metavar="NAME"),
        Option("output_dir", "make the pack in DIR/NAME; DIR/NAME must not exist", PRINTING, kind="path", default=".",
               metavar="DIR", shown_default="the current directory"),
        _switch("no_input", "ask nothing: take the default for every answer", PRINTING))),
    *_scoped(SESSION, (DEBUG,))))
CACHE = CommandOptions("cache", (*_scoped(OUTPUT, (
    Option("action", "info: entries, size, location; clear: remove them", ARGUMENTS, positional=True,
           choices=("info", "clear")),
    _with(JSON, help="info as JSON"))),))

SIMULATE = CommandOptions("simulate", (
    *_scoped(AXIS, (
        MODEL_OPTION,
        REQUESTS,
        Option("input_lengths", "prompt tokens per request: N, uniform:LOW:HIGH, normal:MEAN:STD or "
               "lognormal:MEDIAN:SIGMA (drawn with --seed)", TRAFFIC, default="1024", flag="--input", metavar="LENGTHS"),
        Option("output_lengths", "tokens each request generates, as --input", TRAFFIC, default="128", flag="--output",
               metavar="LENGTHS"),
        Option("dataset", "requests from a JSONL file, one per line: input_tokens and output_tokens (or prompt_len "
               "and output_len), optionally arrival_s", TRAFFIC, kind="path", optional=True, metavar="FILE.jsonl"),
        RATE,
        Option("burstiness", "with --rate: the gamma shape of the gaps between arrivals, as vllm bench serve's (1: "
               "Poisson; lower: burstier)", TRAFFIC, kind="number", default=1.0),
        CONCURRENCY,
        _int("seed", 0, "seed of the lengths and arrivals drawn", TRAFFIC, minimum=0),
        ENGINE_PRESET,
        _int("max_running_requests", None, "requests running at once", ENGINE, optional=True),
        _int("max_batched_tokens", None, "tokens one iteration runs (prefill chunks and decode tokens)", ENGINE,
             optional=True),
        Option("chunked_prefill", "split prompts over iterations within the token budget", ENGINE,
               choices=("on", "off"), optional=True),
        _int("block_size", None, "KV cache tokens per block", ENGINE, optional=True),
        Option("kv_memory_fraction", "the share of memory the engine takes (vllm, sglang: of the device; trtllm: "
               "of what the weights leave free)", ENGINE, kind="number", optional=True, metavar="F"),
        Option("kv_policy", "preempt: take KV blocks as tokens come and preempt a request when they run out (vllm, "
               "sglang); reserve: admit a request only when its whole prompt and output fit, never preempting "
               "(trtllm's GUARANTEED_NO_EVICT)", ENGINE, choices=("preempt", "reserve"), optional=True),
        _int("scheduler_steps", None, "iterations per scheduling decision, as vLLM 0.6's --num-scheduler-steps: a "
             "request that arrives meanwhile waits for the next decision (default 1)", ENGINE, optional=True),
        _int("prefill_instances", None, "X prefill instances run the prompts, each prompt's KV cache then sent to "
             "--decode-instances", DISAGGREGATION, optional=True, metavar="X"),
        _int("decode_instances", None, "Y decode instances generate the tokens after the first", DISAGGREGATION,
             optional=True, metavar="Y"),
        Option("prefill_deployment", "where a prefill instance differs: deployment OPTION=VALUE pairs and device "
               "('tp=4 weights=fp8 device=h200-sxm')", DISAGGREGATION, optional=True, metavar="PAIRS"),
        Option("decode_deployment", "as --prefill-deployment, a decode instance", DISAGGREGATION, optional=True),
        _int("prefix_len", None, "prompts start with a shared prefix of N tokens (a system prompt): a request whose "
             "prefix is cached skips its whole KV blocks, and they are held once", SPECULATION, optional=True),
        Option("prefix_hit_rate", "with --prefix-len: the share of requests starting with it (default 1)", SPECULATION,
               kind="number", optional=True, metavar="SHARE"),
        _int("spec_tokens", None, "each decode step verifies K draft tokens of --draft-model in one pass, keeping the "
             "accepted ones", SPECULATION, optional=True, metavar="K"),
        Option("acceptance", "with --spec-tokens: how often a draft token is accepted, a rate (0.7: position i "
               "kept with 0.7^i) or one per position as engines report them (0.9,0.7,0.5)", SPECULATION,
               optional=True, metavar="RATE|LIST"),
        Option("draft_model", "with --spec-tokens: the draft model proposing the tokens (a preset or config.json), "
               "priced on the same devices; it must share the model's vocabulary", SPECULATION, optional=True,
               metavar="MODEL"),
        Option("slo_ttft", "goodput counts requests whose time to first token is at most TIME", TRAFFIC, kind="time",
               optional=True, metavar="TIME"),
        Option("slo_tpot", "goodput counts requests whose time per output token is at most TIME", TRAFFIC,
               kind="time", optional=True, metavar="TIME"),
        DTYPE, *DEPLOYMENT, DEVICE, _with(PRICE, help="dollars one device costs an hour: adds $ per million input "
                                          "and output tokens (each iteration's time split between its prompt and "
                                          "decode tokens) and the deployment's $/hour"))),
    *_scoped(OUTPUT, (_with(JSON, help="print the figures as JSON, under vllm bench serve --save-result's names, "
                            "with the engine's (iterations, mean running batch, KV usage over time)"),
                      Option("trace", "write a Chrome trace (JSON) that Perfetto opens: the engine's iterations, the KV "
                             "cache's use, and each request from arrival to its last token", PRINTING, kind="path",
                             optional=True, metavar="FILE"),
                      Option("plot", "draw the TTFT and TPOT distributions and output tokens/s over time (needs "
                             "matplotlib: castcore[plot])", PRINTING, kind="path", optional=True, metavar="PNG"),
                      _with(EMIT, help="after the figures, print this deployment's launch command for ENGINE (the "
                            "--engine simulated) and a benchmark of the same requests with the engine's own client, "
                            "whose result file diffs against --json (fixed --input and --output lengths)"))),
    *_scoped(SESSION, (NO_CACHE, *PLUGIN_OPTIONS)),
), exclusive=(("rate", "concurrency"),))

COMMANDS = {c.name: c for c in (ESTIMATE, SERVE, SIMULATE, AUDIT, PACKS, DEVICES, NEW_PACK, PARTITION, MEASURE, CALIBRATE,
                                SWEEP, PLAN, CACHE)}
ENGINE_OPTIONS = ("max_running_requests", "max_batched_tokens", "chunked_prefill", "block_size", "kv_memory_fraction",
                  "kv_policy", "scheduler_steps")


def _spellings() -> dict[str, Option]:
    """Each option name's spelling; two options of one name (serve's batch, estimate's) must spell it alike."""
    found: dict[str, Option] = {}
    for command in COMMANDS.values():
        for option, _ in command.options:
            if option.positional:  # no flag to spell: an argument is named by its place
                continue
            first = found.setdefault(option.name, option)
            if (first.cli, first.negated) != (option.cli, option.negated):
                raise AssertionError(f"option {option.name} is spelled {first.cli} and {option.cli}")
    return found


_SPELLINGS = _spellings()


def say(name: str, *value: Any) -> str:
    """Option ``name`` (with a value when given) in the current terms: ``tp=8``, ``--tp 8`` or ``tp = 8``."""
    return _SPELLINGS[name].spelled(*value)


def any_value(text: str) -> Placeholder:
    """A stand-in for a value in a message: ``say("tp", any_value("N"))`` is ``--tp N`` on the command line."""
    return Placeholder(text)


WORKLOAD_OPTIONS = (*STEP, *DEPLOYMENT)  # build_workload's keywords and the Workload's fields, in this order
DEPLOYMENT_NAMES = tuple(o.name for o in (DTYPE, *DEPLOYMENT))  # how serve passes a deployment to every step
