"""Every option castcore takes, once: the command line's options, a sweep's axes, ``build_workload``'s keywords, the
``Workload``'s fields and the documentation's option tables are all made from these declarations (the options
several commands share are in castcore.options.parts)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from castcore.devices.dtypes import TENSOR_DTYPES
from castcore.options.option import Option, Placeholder
from castcore.options.parts import (
    ARGUMENTS,
    AXIS,
    CALL,
    COST,
    CommandOptions,
    DEPLOYMENT,
    DEVICE,
    DTYPE,
    JSON,
    MODEL_OPTION,
    NO_CACHE,
    OPERATOR,
    OUTPUT,
    PLUGINS,
    PLUGIN_OPTIONS,
    PRICE,
    PRINTING,
    REQUEST,
    REQUEST_TOKENS,
    RUNNING,
    SEARCH,
    SERVE_BATCH,
    SESSION,
    STEP,
    WEIGHT_DTYPES,
    WORKERS,
    changed,
    int_option,
    scoped,
    switch,
)

ESTIMATE = CommandOptions(
    "estimate",
    (
        *scoped(AXIS, (*STEP, *DEPLOYMENT, DEVICE)),
        *scoped(
            OUTPUT,
            (
                int_option("top", 30, "rows in the table, slowest first", PRINTING, metavar="K"),
                changed(
                    JSON,
                    help="print the whole report (every op and module row, totals, coverage, memory, workload, "
                    "notes) as JSON",
                ),
                switch("csv", "print the rows (see --by) and a TOTAL row as CSV", PRINTING),
                Option(
                    "by",
                    "rows by operator, or by module (layer) that made the calls",
                    PRINTING,
                    default="op",
                    choices=("op", "module"),
                ),
                Option(
                    "trace",
                    "write a Chrome trace (JSON) that Perfetto opens: one slice per op",
                    PRINTING,
                    kind="path",
                    optional=True,
                    metavar="FILE",
                ),
                Option(
                    "plot",
                    "write a roofline chart (needs matplotlib: castcore[plot])",
                    PRINTING,
                    kind="path",
                    optional=True,
                    metavar="PNG",
                ),
            ),
        ),
        *scoped(
            SESSION,
            (
                Option(
                    "on_error",
                    "when a plugin raises or answers nonsense: stop (raise, the default) or record it and ask "
                    "the next plugin (fallback)",
                    PLUGINS,
                    choices=("raise", "fallback"),
                    optional=True,
                ),
                NO_CACHE,
                *PLUGIN_OPTIONS,
            ),
        ),
    ),
    exclusive=(("json", "csv"),),
)

SERVE = CommandOptions(
    "serve",
    (
        *scoped(AXIS, (MODEL_OPTION, *REQUEST_TOKENS, *SERVE_BATCH, DTYPE, *DEPLOYMENT, DEVICE, PRICE)),
        *scoped(
            OUTPUT,
            (
                changed(
                    JSON,
                    help="print the figures as JSON (ttft_s, tpot_s, latency_s, output_tokens_per_s, "
                    "memory, ...)",
                ),
            ),
        ),
        *scoped(SESSION, (NO_CACHE, *PLUGIN_OPTIONS)),
    ),
    exclusive=(("batch", "max_batch"),),
)

TRAFFIC, ENGINE = "traffic", "engine (each defaults to the --engine preset's)"
SPECULATION, DISAGGREGATION = "speculative decoding and prefix caching", "disaggregated prefill and decode"
MOST_REQUESTS = 10**6  # a run's requests all live in memory, with their token times
REQUESTS = int_option(
    "requests",
    1000,
    f"requests to simulate (with --dataset: its lines), at most {MOST_REQUESTS:,}",
    TRAFFIC,
    maximum=MOST_REQUESTS,
)
RATE = Option(
    "rate",
    "requests per second, arriving as a Poisson process (default: all at once, the offline maximum "
    "throughput)",
    TRAFFIC,
    kind="number",
    optional=True,
    metavar="QPS",
)
CONCURRENCY = int_option(
    "concurrency",
    None,
    "a closed loop of C requests in flight: one starts when one finishes",
    TRAFFIC,
    optional=True,
    metavar="C",
)
ENGINE_PRESET = Option(
    "engine",
    "the serving engine whose documented scheduler and memory defaults are simulated",
    ENGINE,
    default="vllm",
    choices=("vllm", "sglang", "trtllm"),
)
EMIT = Option(
    "emit",
    "after the plan, print the best deployment's launch command for ENGINE (parallel sizes, "
    "quantization, the engine limits simulated), a benchmark of the same traffic with the engine's own "
    "client, and the castcore simulate --json command whose figures diff against its result file",
    PRINTING,
    choices=("vllm", "sglang", "trtllm"),
    optional=True,
    metavar="ENGINE",
)
OBJECTIVE = (
    "at most TIME (500ms, 1s); under traffic (--rate, --concurrency, --max-rate) a statistic of the "
    "simulated requests, STATISTIC:TIME with mean, median, p90, p95 or p99 (a plain TIME is p99)"
)

PLAN = CommandOptions(
    "plan",
    (
        *scoped(
            AXIS,
            (
                changed(
                    MODEL_OPTION,
                    default=None,
                    help="a preset, a transformers config.json, or package.module:factory",
                ),
                *REQUEST_TOKENS,
                Option(
                    "ttft",
                    f"time to first token {OBJECTIVE}",
                    REQUEST,
                    kind="objective",
                    optional=True,
                    metavar="[STATISTIC:]TIME",
                ),
                Option(
                    "tpot",
                    f"time per output token {OBJECTIVE}",
                    REQUEST,
                    kind="objective",
                    optional=True,
                    metavar="[STATISTIC:]TIME",
                ),
                changed(
                    RATE,
                    help="plan for requests arriving at QPS per second (Poisson), each deployment simulated under "
                    "them (castcore simulate) instead of priced as one static batch; replicas (dp) are added until the "
                    "objectives are met",
                ),
                changed(
                    CONCURRENCY, help="plan for a closed loop of C requests in flight, simulated as --rate is"
                ),
                switch(
                    "max_rate",
                    "find each deployment's highest request rate that meets --ttft/--tpot (a bisection of "
                    "simulations up to its offline throughput), and rank by that rate per device",
                    TRAFFIC,
                ),
                switch(
                    "disaggregated",
                    "also search disaggregated layouts: each layout as X prefill and Y decode instances "
                    "(1 to 4 each, within --max-devices), simulated as castcore simulate --prefill-instances X "
                    "--decode-instances Y; the plan says which kind wins and why (with --rate or --max-rate)",
                    TRAFFIC,
                ),
                changed(
                    REQUESTS,
                    default=500,
                    help="requests each simulation serves (with --rate, --concurrency, --max-rate)",
                ),
                changed(
                    ENGINE_PRESET,
                    help="the serving engine simulated (with --rate, --concurrency, --max-rate)",
                ),
                DTYPE,
                Option(
                    "devices",
                    "devices to search (default: every installed one)",
                    SEARCH,
                    flag="--device",
                    many=True,
                    optional=True,
                    metavar="NAME",
                ),
                int_option("max_devices", 8, "devices in one replica at most", SEARCH),
                int_option(
                    "tp",
                    None,
                    "tensor parallel sizes (default: the divisors of the attention heads within a node)",
                    SEARCH,
                    many=True,
                    optional=True,
                ),
                int_option(
                    "pp",
                    None,
                    "pipeline stages (default: 1, and more beyond a node's tensor parallelism)",
                    SEARCH,
                    many=True,
                    optional=True,
                ),
                Option(
                    "weights",
                    "weight dtypes",
                    SEARCH,
                    default=("bf16", "int8"),
                    choices=WEIGHT_DTYPES,
                    many=True,
                    metavar="DTYPE",
                ),
                int_option("top", 5, "deployments to print", SEARCH, metavar="K"),
                Option(
                    "objective",
                    "what the best maximise: throughput, output tokens/s per device (under --max-rate, "
                    "requests/s per device); cost, the fewest $ per million output tokens (needs "
                    "--price-per-device-hour); energy, the most output tokens per joule (needs devices with power "
                    "numbers)",
                    SEARCH,
                    default="throughput",
                    choices=("throughput", "cost", "energy"),
                ),
                PRICE,
                Option(
                    "device_prices",
                    "a price per device-hour of its own for a named device, NAME=USD (repeatable "
                    "in one list: --device-price b200=6 h100-sxm5-80gb=2.5); the others take --price-per-device-hour",
                    COST,
                    flag="--device-price",
                    many=True,
                    optional=True,
                    metavar="NAME=USD",
                ),
                *WORKERS,
            ),
        ),
        *scoped(OUTPUT, (changed(JSON, help="print the best and the fewest as JSON"), EMIT)),
        *scoped(SESSION, PLUGIN_OPTIONS),
    ),
    exclusive=(("rate", "concurrency", "max_rate"),),
)

SWEEP = CommandOptions(
    "sweep",
    (
        *scoped(
            OUTPUT,
            (
                Option(
                    "out",
                    "write the rows to FILE: .parquet (needs pyarrow: castcore[sweep]), .csv or .jsonl (default: "
                    "CSV on stdout)",
                    RUNNING,
                    kind="path",
                    optional=True,
                    metavar="FILE",
                ),
                *WORKERS,
                switch(
                    "resume",
                    "keep the rows already in --out that have no error, and run only the other points",
                    RUNNING,
                ),
                switch("yes", "run a spec of more than 100,000 points", RUNNING),
                Option(
                    "plot",
                    "draw latency against throughput per device, the Pareto front marked, one colour per device "
                    "(needs castcore[plot])",
                    RUNNING,
                    kind="path",
                    optional=True,
                    metavar="PNG",
                ),
            ),
        ),
        *scoped(SESSION, PLUGIN_OPTIONS),
    ),
)

AUDIT = CommandOptions(
    "audit",
    (
        *scoped(
            OUTPUT,
            (
                changed(
                    DEVICE,
                    help="audit this device only (default: every installed device; with --model, the default "
                    "device)",
                ),
                Option(
                    "op",
                    "only this operator, e.g. aten::mm (every overload) or aten::add.Tensor",
                    PRINTING,
                    optional=True,
                ),
                changed(JSON, help="print JSON"),
            ),
        ),
        *scoped(
            AXIS,
            (
                changed(
                    MODEL_OPTION,
                    default=None,
                    optional=True,
                    help=MODEL_OPTION.help + "; audit the ops it runs (default: no model, every claim)",
                ),
                *STEP[1:],
                *DEPLOYMENT,
            ),
        ),
        *scoped(SESSION, PLUGIN_OPTIONS),
    ),
)

_LISTING = (changed(JSON, help="print JSON"), *PLUGIN_OPTIONS)
PACKS = CommandOptions("packs", (*scoped(OUTPUT, _LISTING[:1]), *scoped(SESSION, _LISTING[1:])))
DEVICES = CommandOptions("devices", PACKS.options)

TARGET = Option("op", "module:function or path/to/file.py:function", OPERATOR, positional=True, metavar="OP")
EXAMPLE_CALL = (
    Option(
        "input",
        "one positional argument, in order: a tensor 4096x1024 or 4096x1024:bf16, 'scalar', 'none', or a "
        "literal such as 0.5; a bare 8 is a tensor of 8 elements, so pass integers with --arg (repeatable)",
        CALL,
        kind="path",
        many=True,
        default=(),
        metavar="SPEC",
    ),
    Option(
        "arg",
        "a named argument, e.g. h=8 for a hidden dim (h t); numbers stay numbers, a tensor is written "
        "4096x1024[:dtype] (repeatable)",
        CALL,
        kind="path",
        many=True,
        default=(),
        metavar="NAME=VALUE",
    ),
    Option(
        "dtype",
        "dtype of tensors given without one",
        CALL,
        default="bf16",
        choices=tuple(sorted(TENSOR_DTYPES)),
    ),
)
PARTITION = CommandOptions(
    "partition",
    (
        *scoped(
            AXIS,
            (
                TARGET,
                int_option("ways", None, "number of devices to split over", OPERATOR),
                *EXAMPLE_CALL,
                changed(DEVICE, help="device profile (default: the default device)", group=OPERATOR),
            ),
        ),
        *scoped(OUTPUT, (changed(JSON, help="print the plan as JSON"),)),
        *scoped(SESSION, PLUGIN_OPTIONS),
    ),
)
MEASURE = CommandOptions(
    "measure",
    (
        *scoped(
            AXIS,
            (
                TARGET,
                *EXAMPLE_CALL,
                int_option("warmup", 3, "untimed runs first", RUNNING, minimum=0),
                int_option("repeat", 10, "timed runs; the median is shown", RUNNING),
                changed(
                    DEVICE, help="device profile to estimate on (default: the default device)", group=OPERATOR
                ),
            ),
        ),
        *scoped(OUTPUT, (changed(JSON, help="print JSON"),)),
        *scoped(SESSION, PLUGIN_OPTIONS),
    ),
)
DEBUG = changed(PLUGIN_OPTIONS[-1], group=PRINTING)
CALIBRATE = CommandOptions(
    "calibrate",
    (
        *scoped(
            OUTPUT,
            (
                Option(
                    "output",
                    "file to write, or - for stdout",
                    PRINTING,
                    kind="path",
                    default="local.toml",
                    short="-o",
                    metavar="FILE",
                ),
                Option("name", "the profile's device name", PRINTING, default="local"),
                switch("quick", "small sizes: seconds instead of a minute, numbers well below peak", RUNNING),
            ),
        ),
        *scoped(SESSION, (DEBUG,)),
    ),
)
NEW_PACK = CommandOptions(
    "new-pack",
    (
        *scoped(
            OUTPUT,
            (
                Option(
                    "name",
                    "the pack's distribution name: lowercase letters, digits and hyphens, e.g. castpack-mynpu; the "
                    "module, entry-point and device names default to names derived from it",
                    ARGUMENTS,
                    positional=True,
                    metavar="NAME",
                ),
                Option(
                    "output_dir",
                    "make the pack in DIR/NAME; DIR/NAME must not exist",
                    PRINTING,
                    kind="path",
                    default=".",
                    metavar="DIR",
                    shown_default="the current directory",
                ),
                switch("no_input", "ask nothing: take the default for every answer", PRINTING),
            ),
        ),
        *scoped(SESSION, (DEBUG,)),
    ),
)
CACHE = CommandOptions(
    "cache",
    (
        *scoped(
            OUTPUT,
            (
                Option(
                    "action",
                    "info: entries, size, location; clear: remove them",
                    ARGUMENTS,
                    positional=True,
                    choices=("info", "clear"),
                ),
                changed(JSON, help="info as JSON"),
            ),
        ),
    ),
)

SIMULATE = CommandOptions(
    "simulate",
    (
        *scoped(
            AXIS,
            (
                MODEL_OPTION,
                REQUESTS,
                Option(
                    "input_lengths",
                    "prompt tokens per request: N, uniform:LOW:HIGH, normal:MEAN:STD or "
                    "lognormal:MEDIAN:SIGMA (drawn with --seed)",
                    TRAFFIC,
                    default="1024",
                    flag="--input",
                    metavar="LENGTHS",
                ),
                Option(
                    "output_lengths",
                    "tokens each request generates, as --input",
                    TRAFFIC,
                    default="128",
                    flag="--output",
                    metavar="LENGTHS",
                ),
                Option(
                    "dataset",
                    "requests from a JSONL file, one per line: input_tokens and output_tokens (or prompt_len "
                    "and output_len), optionally arrival_s",
                    TRAFFIC,
                    kind="path",
                    optional=True,
                    metavar="FILE.jsonl",
                ),
                RATE,
                Option(
                    "burstiness",
                    "with --rate: the gamma shape of the gaps between arrivals, as vllm bench serve's (1: "
                    "Poisson; lower: burstier)",
                    TRAFFIC,
                    kind="number",
                    default=1.0,
                ),
                CONCURRENCY,
                int_option(
                    "seed", 0, "seed of the lengths and arrivals drawn", TRAFFIC, minimum=0, maximum=None
                ),
                ENGINE_PRESET,
                int_option("max_running_requests", None, "requests running at once", ENGINE, optional=True),
                int_option(
                    "max_batched_tokens",
                    None,
                    "tokens one iteration runs (prefill chunks and decode tokens)",
                    ENGINE,
                    optional=True,
                ),
                Option(
                    "chunked_prefill",
                    "split prompts over iterations within the token budget",
                    ENGINE,
                    choices=("on", "off"),
                    optional=True,
                ),
                int_option("block_size", None, "KV cache tokens per block", ENGINE, optional=True),
                Option(
                    "kv_memory_fraction",
                    "the share of memory the engine takes (vllm, sglang: of the device; trtllm: "
                    "of what the weights leave free)",
                    ENGINE,
                    kind="number",
                    optional=True,
                    metavar="F",
                ),
                Option(
                    "kv_policy",
                    "preempt: take KV blocks as tokens come and preempt a request when they run out (vllm, "
                    "sglang); reserve: admit a request only when its whole prompt and output fit, never preempting "
                    "(trtllm's GUARANTEED_NO_EVICT)",
                    ENGINE,
                    choices=("preempt", "reserve"),
                    optional=True,
                ),
                int_option(
                    "scheduler_steps",
                    None,
                    "iterations per scheduling decision, as vLLM 0.6's --num-scheduler-steps: "
                    "a request that arrives meanwhile waits for the next decision (default 1)",
                    ENGINE,
                    optional=True,
                ),
                int_option(
                    "prefill_instances",
                    None,
                    "X prefill instances run the prompts, each prompt's KV cache then sent "
                    "to --decode-instances",
                    DISAGGREGATION,
                    optional=True,
                    metavar="X",
                ),
                int_option(
                    "decode_instances",
                    None,
                    "Y decode instances generate the tokens after the first",
                    DISAGGREGATION,
                    optional=True,
                    metavar="Y",
                ),
                Option(
                    "prefill_deployment",
                    "where a prefill instance differs: deployment OPTION=VALUE pairs and device "
                    "('tp=4 weights=fp8 device=h200-sxm')",
                    DISAGGREGATION,
                    optional=True,
                    metavar="PAIRS",
                ),
                Option(
                    "decode_deployment",
                    "as --prefill-deployment, a decode instance",
                    DISAGGREGATION,
                    optional=True,
                ),
                int_option(
                    "prefix_len",
                    None,
                    "prompts start with a shared prefix of N tokens (a system prompt): a request "
                    "whose prefix is cached skips its whole KV blocks, and they are held once",
                    SPECULATION,
                    optional=True,
                ),
                Option(
                    "prefix_hit_rate",
                    "with --prefix-len: the share of requests starting with it (default 1)",
                    SPECULATION,
                    kind="number",
                    optional=True,
                    metavar="SHARE",
                ),
                int_option(
                    "spec_tokens",
                    None,
                    "each decode step verifies K draft tokens of --draft-model in one pass, "
                    "keeping the accepted ones",
                    SPECULATION,
                    optional=True,
                    metavar="K",
                ),
                Option(
                    "acceptance",
                    "with --spec-tokens: how often a draft token is accepted, a rate (0.7: position i "
                    "kept with 0.7^i) or one per position as engines report them (0.9,0.7,0.5)",
                    SPECULATION,
                    optional=True,
                    metavar="RATE|LIST",
                ),
                Option(
                    "draft_model",
                    "with --spec-tokens: the draft model proposing the tokens (a preset or config.json of "
                    "the model's vocabulary), or a head of the model's own: mtp (its multi-token-prediction layers) or "
                    "eagle (one layer of its shape); priced on the same devices",
                    SPECULATION,
                    optional=True,
                    metavar="MODEL",
                ),
                Option(
                    "slo_ttft",
                    "goodput counts requests whose time to first token is at most TIME",
                    TRAFFIC,
                    kind="time",
                    optional=True,
                    metavar="TIME",
                ),
                Option(
                    "slo_tpot",
                    "goodput counts requests whose time per output token is at most TIME",
                    TRAFFIC,
                    kind="time",
                    optional=True,
                    metavar="TIME",
                ),
                DTYPE,
                *DEPLOYMENT,
                DEVICE,
                changed(
                    PRICE,
                    help="dollars one device costs an hour: adds $ per million input "
                    "and output tokens (each iteration's time split between its prompt and "
                    "decode tokens) and the deployment's $/hour",
                ),
            ),
        ),
        *scoped(
            OUTPUT,
            (
                changed(
                    JSON,
                    help="print the figures as JSON, under vllm bench serve --save-result's names, "
                    "with the engine's (iterations, mean running batch, KV usage over time)",
                ),
                Option(
                    "trace",
                    "write a Chrome trace (JSON) that Perfetto opens: the engine's iterations, the "
                    "KV cache's use, and each request from arrival to its last token",
                    PRINTING,
                    kind="path",
                    optional=True,
                    metavar="FILE",
                ),
                Option(
                    "plot",
                    "draw the TTFT and TPOT distributions and output tokens/s over time (needs "
                    "matplotlib: castcore[plot])",
                    PRINTING,
                    kind="path",
                    optional=True,
                    metavar="PNG",
                ),
                changed(
                    EMIT,
                    help="after the figures, print this deployment's launch command for ENGINE (the "
                    "--engine simulated) and a benchmark of the same requests with the engine's own client, "
                    "whose result file diffs against --json (fixed --input and --output lengths)",
                ),
            ),
        ),
        *scoped(SESSION, (NO_CACHE, *PLUGIN_OPTIONS)),
    ),
    exclusive=(("rate", "concurrency"),),
)

HTML = Option(
    "html",
    "also write one self-contained HTML page of the result: interactive charts and sortable "
    "tables, opened offline in any browser (needs plotly: castcore[html])",
    PRINTING,
    kind="path",
    optional=True,
    metavar="FILE",
)


def _paged(command: CommandOptions) -> CommandOptions:
    """``command`` with --html last among its options."""
    return replace(command, options=(*command.options, (HTML, OUTPUT)))


ESTIMATE, SERVE, SIMULATE, SWEEP, PLAN = (_paged(c) for c in (ESTIMATE, SERVE, SIMULATE, SWEEP, PLAN))
REPORT = CommandOptions(
    "report",
    (
        *scoped(
            OUTPUT,
            (
                Option(
                    "results",
                    "a results file castcore wrote: estimate, serve, simulate or plan --json (.json), or "
                    "sweep --out rows (.jsonl, .csv, .parquet)",
                    ARGUMENTS,
                    kind="path",
                    positional=True,
                    metavar="RESULTS",
                ),
                changed(
                    HTML,
                    help="the HTML page to write: one self-contained file, opened offline (needs plotly: "
                    "castcore[html])",
                    optional=False,
                ),
            ),
        ),
        *scoped(SESSION, PLUGIN_OPTIONS[-1:]),  # --debug
    ),
)

COMMANDS = {
    c.name: c
    for c in (
        ESTIMATE,
        SERVE,
        SIMULATE,
        AUDIT,
        PACKS,
        DEVICES,
        NEW_PACK,
        PARTITION,
        MEASURE,
        CALIBRATE,
        SWEEP,
        PLAN,
        CACHE,
        REPORT,
    )
}
ENGINE_OPTIONS = (
    "max_running_requests",
    "max_batched_tokens",
    "chunked_prefill",
    "block_size",
    "kv_memory_fraction",
    "kv_policy",
    "scheduler_steps",
)


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
