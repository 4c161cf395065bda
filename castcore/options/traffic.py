"""The options of serving under traffic: the requests and how they arrive, the engine simulated, disaggregation,
speculative decoding, and the simulate command that takes them all (plan shares the traffic ones)."""

from __future__ import annotations

from castcore.options.html import paged
from castcore.options.option import Option
from castcore.options.parts import (
    AXIS,
    CommandOptions,
    DEPLOYMENT,
    DEVICE,
    DTYPE,
    JSON,
    MODEL_OPTION,
    NO_CACHE,
    OUTPUT,
    PLUGIN_OPTIONS,
    PRICE,
    PRINTING,
    SESSION,
    changed,
    int_option,
    scoped,
    switch,
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
MAX_MODEL_LEN = int_option(
    "max_model_len",
    None,
    "the engine's context cap in tokens, as vLLM's --max-model-len (default and most: the model's position "
    "limit): a request whose prompt and output exceed it is rejected and counted as failed; engines do not "
    "truncate it",
    TRAFFIC,
    optional=True,
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

SIMULATE = paged(
    CommandOptions(
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
                    MAX_MODEL_LEN,
                    ENGINE_PRESET,
                    int_option(
                        "max_running_requests", None, "requests running at once", ENGINE, optional=True
                    ),
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
                    Option(
                        "mixed_chunk",
                        "run decodes in the iterations that compute prompt chunks (vllm, trtllm: always; "
                        "sglang: off by default, its --enable-mixed-chunk)",
                        ENGINE,
                        choices=("on", "off"),
                        optional=True,
                    ),
                    int_option("block_size", None, "KV cache tokens per block", ENGINE, optional=True),
                    Option(
                        "kv_memory_fraction",
                        "the share of memory the engine takes (vllm, sglang: of the device, sglang's "
                        "default its own for the device and TP; trtllm: of what the weights and "
                        "activations leave free)",
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
                    switch(
                        "enforce_eager",
                        "run without CUDA graphs, as vLLM's --enforce-eager: every iteration launches its "
                        "kernels one by one (docs/simulate.md, engine overheads)",
                        ENGINE,
                    ),
                    int_option(
                        "max_capture_size",
                        None,
                        "the largest decode batch captured in a CUDA graph (vLLM's max_cudagraph_capture_size, "
                        "SGLang's cuda_graph_max_bs, TensorRT-LLM's cuda_graph_config max_batch_size)",
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
                    switch(
                        "stop_saturated",
                        "with --rate: end the run as soon as its steady window shows the queue growing "
                        "(SATURATED): its figures are then of the requests finished by then; castcore plan's "
                        "search runs this way",
                        TRAFFIC,
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
)
ENGINE_OPTIONS = (
    "max_running_requests",
    "max_batched_tokens",
    "chunked_prefill",
    "mixed_chunk",
    "block_size",
    "kv_memory_fraction",
    "kv_policy",
    "scheduler_steps",
    "enforce_eager",
    "max_capture_size",
)
