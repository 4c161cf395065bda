"""The pieces every command's options are made of: the dtypes and groups, the model, step and deployment options
shared by several commands, and ``CommandOptions``, one command's options (castcore.options.catalog holds them)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from castcore.devices.dtypes import MODEL_DTYPES
from castcore.options.option import Option

DEFAULT_MODEL = "llama-3-8b"
PHASES = ("prefill", "decode")
BLOCK_FP8 = (
    "fp8-block"  # fp8 weights in 128 x 128 blocks, W8A8 by itself: its activations fp8 in 1 x 128 groups
)
WEIGHT_DTYPES = ("bf16", "fp16", "fp8", BLOCK_FP8, "int8", "int4", "nvfp4", "mxfp4")
# W8A8 with weights of the same kind; fp8 with int4 weights is W4A8; mxfp4 with mxfp4 weights is W4A4
ACTIVATION_DTYPES = ("int8", "fp8", "mxfp4")
KV_CACHE_DTYPES = ("bf16", "fp16", "fp8", "int8")
# a fused attention kernel reads each grouped K/V head once, or once per query head
KV_READS = (
    "group",
    "head",
)
# expert-parallel dispatch and combine, as DeepEP's two kernel sets
EP_KERNELS = (
    "normal",
    "low-latency",
    "auto",
)

# Scopes: an "axis" is a point's parameter (a sweep varies it); a "session" option sets up plugins and devices
# (one setting for a whole sweep); an "output" option says how a command prints (no meaning in a sweep).
AXIS, SESSION, OUTPUT = "axis", "session", "output"

MODEL, KERNELS, REQUEST = "model", "kernels and quantization", "request"
PARALLEL = "parallelism (figures are per device)"
PLUGINS, PRINTING, SEARCH, RUNNING = "plugins and devices", "output", "search", "running"
OPERATOR, CALL, ARGUMENTS = "operator", "the example call", "arguments"


def int_option(name: str, default: int | None, help: str, group: str, **more: Any) -> Option:
    return Option(name, help, group, kind="int", default=default, metavar=more.pop("metavar", "N"), **more)


def switch(name: str, help: str, group: str, **more: Any) -> Option:
    return Option(name, help, group, kind="bool", default=more.pop("default", False), **more)


MODEL_OPTION = Option(
    "model",
    "a preset ({presets}), a transformers config.json path, or package.module:factory",
    MODEL,
    default=DEFAULT_MODEL,
)
DTYPE = Option(
    "dtype",
    "weights and activations; tf32 is float32 with TF32 matrix products",
    MODEL,
    default="bf16",
    choices=MODEL_DTYPES,
)
STEP = (
    MODEL_OPTION,
    int_option("batch", 1, "sequences per batch", MODEL),
    int_option("seq", 2048, "tokens per sequence", MODEL),
    DTYPE,
    Option(
        "phase",
        "prefill: --seq tokens at once; decode: one new token per sequence over a KV cache",
        MODEL,
        default="prefill",
        choices=PHASES,
    ),
    int_option(
        "kv_len",
        None,
        "tokens already in the KV cache for --phase decode",
        MODEL,
        optional=True,
        shown_default="--seq",
    ),
    switch("train", "a training step: forward and backward of the loss", MODEL),
    switch(
        "all_logits",
        "a prefill computes the LM head for every token (scoring), not only the last one a server "
        "samples from (the default)",
        MODEL,
    ),
    switch(
        "reuse",
        "run every one of a model's identical layers on fake tensors instead of capturing one and "
        "replaying it for the rest (same totals, slower)",
        MODEL,
        default=True,
        flag="--no-reuse",
        negated=True,
    ),
)
DEPLOYMENT = (
    switch(
        "fuse",
        "price the Hugging Face graph as it runs eagerly, instead of the fused kernels a serving engine "
        "runs (fused attention, RMSNorm, add+RMSNorm, rotary, SwiGLU, MoE)",
        KERNELS,
        default=True,
        flag="--eager",
        negated=True,
    ),
    Option(
        "weights",
        "quantized weights; alone, weight-only quantization (dequantized in the matmul, activations "
        "stay in --dtype); fp8-block: fp8 with a scale per 128x128 block, its activations quantized per 1x128 "
        "group (DeepSeek-V3's checkpoints); nvfp4: fp4 with an fp8 scale per 16, its activations NVFP4 too (W4A4 "
        "at the device's fp4 rate, which it must have); mxfp4: fp4 with a power-of-two scale per 32 (gpt-oss's "
        "experts), MXFP8 activations where the device has an fp4 rate, else weight-only; a checkpoint's own "
        "quantization_config is the default",
        KERNELS,
        choices=WEIGHT_DTYPES,
        optional=True,
        metavar="DTYPE",
        shown_default="--dtype",
    ),
    Option(
        "activations",
        "with --weights of the same dtype: W8A8 / FP8 matmuls (activations quantized per token); "
        "fp8 with --weights int4: W4A8, products at the fp8 rate; mxfp4 with --weights mxfp4: W4A4 MXFP4 "
        "(activations quantized per 32 columns), products at the fp4 rate",
        KERNELS,
        choices=ACTIVATION_DTYPES,
        optional=True,
        metavar="DTYPE",
        shown_default="--dtype",
    ),
    Option(
        "kv_cache",
        "KV cache dtype",
        KERNELS,
        choices=KV_CACHE_DTYPES,
        optional=True,
        metavar="DTYPE",
        shown_default="--dtype",
    ),
    Option(
        "kv_reads",
        "how the fused attention kernel reads grouped K/V heads (GQA): 'group' once per K/V head for "
        "its query heads (FlashAttention, FlashInfer, TensorRT-LLM's XQA), 'head' once per query head, as "
        "TensorRT-LLM's masked MHA kernel did before 0.7",
        KERNELS,
        default="group",
        choices=KV_READS,
    ),
    int_option(
        "tp",
        1,
        "tensor parallel over N devices (torch's parallelize_module on a fake process group): estimate "
        "one device's compute, memory and collectives",
        PARALLEL,
    ),
    switch(
        "sp",
        "sequence parallelism with --tp: norms and elementwise ops on 1/N of the tokens, reduce-scatter "
        "and all-gather instead of all-reduce",
        PARALLEL,
    ),
    int_option(
        "ep",
        1,
        "expert parallel over N devices (MoE models): experts split across them, tokens dispatched and "
        "combined by all-to-all; above --tp, give --attention-dp ep/tp (attention data-parallel) or --tp as wide",
        PARALLEL,
    ),
    int_option(
        "attention_dp",
        1,
        "attention data parallel over N groups of --tp devices, the experts split over all "
        "N x tp of them (--ep N x tp), as TensorRT-LLM's and SGLang's DP attention run DeepSeek",
        PARALLEL,
    ),
    Option(
        "ep_kernels",
        "how --ep dispatches and combines under attention data parallelism (--ep above --tp; at or below it "
        "nothing is dispatched): 'normal' the fastest all-to-all, hierarchical across the "
        "fast domain and the network across nodes (DeepEP's normal kernels); 'low-latency' every rank sending "
        "straight to every other in one step, one network latency (DeepEP's low-latency kernels); 'auto' "
        "low-latency for decode steps (SGLang's DeepEP mode auto)",
        PARALLEL,
        default="normal",
        choices=EP_KERNELS,
    ),
    Option(
        "expert_skew",
        "MoE routing as uneven as real traffic: expert loads a power law of exponent ALPHA, as NVIDIA's "
        "AIConfigurator draws them: fewer experts' weights read, with --ep the busiest device takes more rows "
        "on fewer of its experts; 0 is balanced (default: the fit for the model's family, 1.01 for "
        "DeepSeek-V3's architecture, 1.2 for every other)",
        PARALLEL,
        kind="number",
        minimum=0,
        optional=True,
        metavar="ALPHA",
    ),
    int_option(
        "pp",
        1,
        "pipeline parallel over N stages: layers split into stages, activations sent between them",
        PARALLEL,
    ),
    int_option(
        "micro_batches",
        1,
        "with --pp: the batch goes through the stages in M micro-batches",
        PARALLEL,
        metavar="M",
    ),
    int_option(
        "lora_rank",
        None,
        "multi-LoRA: adapters of rank R on every attention and MLP projection, each token's "
        "applied by grouped GEMMs (with --adapters)",
        KERNELS,
        optional=True,
        metavar="R",
    ),
    int_option(
        "adapters", None, "multi-LoRA: N adapters resident, requests spread over them", KERNELS, optional=True
    ),
    Option(
        "adapter_skew",
        "multi-LoRA: the adapters' popularity a power law of exponent ALPHA, as --expert-skew "
        "draws expert loads (S-LoRA serves power-law adapter traffic): a batch touches fewer adapters' weights "
        "(default: even)",
        KERNELS,
        kind="number",
        optional=True,
        metavar="ALPHA",
    ),
    int_option("dp", 1, "data-parallel replicas of the whole deployment, for throughput", PARALLEL),
)
DEVICE = Option(
    "device",
    "device profile name (castcore devices lists them; default: the configured default_device, "
    "else the first profile marked default)",
    MODEL,
    optional=True,
    metavar="NAME",
)
NO_CACHE = switch(
    "no_cache",
    "capture anew and keep nothing: by default a capture is stored in castcore's cache "
    "(castcore cache info) and a later run with the same model, options and castcore, torch, "
    "transformers and pack versions loads it instead of building the model",
    PLUGINS,
)
PLUGIN_OPTIONS = (
    Option(
        "custom_op_dir",
        "load every *.py in DIR as a plugin that beats installed packs (repeatable; also "
        "CASTCORE_CUSTOM_OP_PATH)",
        PLUGINS,
        kind="path",
        many=True,
        optional=True,
        metavar="DIR",
    ),
    switch(
        "no_default_custom_op_dirs",
        "do not load custom_op/ in the project root and "
        "$XDG_CONFIG_HOME/castcore/custom_op (also default_custom_op_dirs = false in castcore.toml)",
        PLUGINS,
    ),
    Option(
        "device_file",
        "add a device profile from a TOML file (repeatable); the first is the default device",
        PLUGINS,
        kind="path",
        many=True,
        optional=True,
        metavar="TOML",
    ),
    switch("no_packs", "load no installed packs (same as CASTCORE_LOAD_PACKS=)", PLUGINS),
    Option(
        "strict",
        "fail on any plugin that did not load, and as each command says (also CASTCORE_STRICT=1)",
        PLUGINS,
        kind="bool",
        optional=True,
    ),
    switch("debug", "show tracebacks instead of one-line errors", PLUGINS),
)
JSON = switch("json", "print the figures as JSON", PRINTING)
REQUEST_TOKENS = (
    int_option("input_tokens", 2048, "prompt tokens per request", REQUEST, flag="--input"),
    int_option("output_tokens", 256, "tokens each request generates", REQUEST, flag="--output"),
)
SERVE_BATCH = (
    int_option("batch", 1, "requests served together", REQUEST),
    switch(
        "max_batch",
        "use the largest batch whose memory fits the device (bisection over peak memory per batch, "
        "confirmed by capture)",
        REQUEST,
        python='batch="max"',
    ),
)
COST = "cost"
PRICE = Option(
    "price_per_device_hour",
    "dollars one device costs an hour: adds $ per million input tokens (the "
    "prefill's device time), $ per million output tokens (the decode's) and the deployment's $/hour",
    COST,
    kind="number",
    optional=True,
    metavar="USD",
)
WORKERS = (
    int_option("workers", None, "local worker processes (default: the CPU count)", RUNNING, optional=True),
    Option(
        "backend",
        "local processes, or Ray tasks (needs castcore[ray])",
        RUNNING,
        default="local",
        choices=("local", "ray"),
    ),
    Option(
        "ray_address",
        "the Ray cluster to run on (default: RAY_ADDRESS, else a local Ray instance of --workers CPUs)",
        RUNNING,
        optional=True,
        metavar="ADDR",
    ),
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


def scoped(scope: str, options: Iterable[Option]) -> tuple[tuple[Option, str], ...]:
    return tuple((o, scope) for o in options)


def changed(option: Option, **changes: Any) -> Option:
    return replace(option, **changes)
