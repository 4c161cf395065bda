"""The options of plan: the model and traffic planned for, the objectives, and the deployments searched."""

from __future__ import annotations

from castcore.options.html import paged
from castcore.options.option import Option
from castcore.devices.dtypes import MODEL_DTYPES
from castcore.options.parts import (
    ACTIVATION_DTYPES,
    AXIS,
    COST,
    CommandOptions,
    DEPLOYMENT,
    DTYPE,
    JSON,
    MODEL_OPTION,
    OUTPUT,
    PLUGIN_OPTIONS,
    PRICE,
    REQUEST,
    SEARCH,
    SESSION,
    WEIGHT_DTYPES,
    WORKERS,
    changed,
    int_option,
    scoped,
    switch,
)
from castcore.options.traffic import (
    MOST_REQUESTS,
    CONCURRENCY,
    EMIT,
    ENGINE_PRESET,
    RATE,
    REQUESTS,
    SIMULATE,
    TRAFFIC,
)

OBJECTIVE = (
    "at most TIME (500ms, 1s); under traffic (--rate, --concurrency, --max-rate) a statistic of the "
    "simulated requests, STATISTIC:TIME with mean, median, p90, p95 or p99 (a plain TIME is p99)"
)
UNDER_TRAFFIC = "(under --rate, --concurrency or --max-rate; a static plan refuses it)"
# simulate's traffic options plan passes on to each simulation, declared once in castcore.options.traffic
SHARED_TRAFFIC = (
    "dataset",
    "burstiness",
    "seed",
    "prefix_len",
    "prefix_hit_rate",
    "spec_tokens",
    "acceptance",
    "draft_model",
    "max_model_len",
)

PLAN = paged(
    CommandOptions(
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
                    # plan's Python names are input_tokens and output_tokens, simulate's declarations
                    changed(
                        SIMULATE["input_lengths"],
                        name="input_tokens",
                        default="2048",
                        help="prompt tokens per request: N, or under --rate, --concurrency or --max-rate a "
                        "distribution as simulate's: uniform:LOW:HIGH, normal:MEAN:STD or lognormal:MEDIAN:SIGMA "
                        "(drawn with --seed; a static plan prices one batch of N)",
                    ),
                    changed(SIMULATE["output_lengths"], name="output_tokens", default="256"),
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
                        CONCURRENCY,
                        help="plan for a closed loop of C requests in flight, simulated as --rate is",
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
                    switch(
                        "frontier",
                        "for each of the best layouts, output tokens/s per device against output tokens/s per "
                        "user: one replica simulated as a closed loop of 1, 2, 4, ... requests in flight until "
                        "its throughput stops rising (8 points at most) " + UNDER_TRAFFIC,
                        TRAFFIC,
                    ),
                    changed(
                        REQUESTS,
                        default=500,
                        help="requests each simulation serves (with --rate, --concurrency, --max-rate)",
                    ),
                    int_option(
                        "validate",
                        3,
                        "the best K confirmed by longer simulations (--validate-requests): judged on their steady "
                        "state with 95%% confidence intervals, saturation refused, one more replica tried where "
                        "one misses; workers a round would leave idle confirm the next in rank (0: print the "
                        "search's ranking unconfirmed)",
                        TRAFFIC,
                        minimum=0,
                        metavar="K",
                    ),
                    int_option(
                        "validate_requests",
                        4000,
                        "requests each confirming simulation serves (enough for the queue to reach its steady "
                        f"state), at most {MOST_REQUESTS:,}",
                        TRAFFIC,
                        minimum=1,
                        maximum=MOST_REQUESTS,
                    ),
                    *(
                        changed(SIMULATE[name], help=f"{SIMULATE[name].help} {UNDER_TRAFFIC}")
                        for name in SHARED_TRAFFIC
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
                    *(
                        changed(
                            option,
                            many=True,
                            group=SEARCH,
                            help=f"{option.help}; one or more to search"
                            + (
                                ", the model's --dtype among them for unquantized activations (--weights bf16 fp8 "
                                "--activations bf16 fp8: bf16, fp8 weight-only and W8A8 fp8; the pairs no kernel "
                                "runs are skipped and counted)"
                                if option.name == "activations"
                                else ""
                            ),
                            **(
                                {"choices": (*ACTIVATION_DTYPES, *MODEL_DTYPES)}
                                if option.name == "activations"
                                else {}
                            ),
                        )
                        for option in DEPLOYMENT
                        if option.name in ("activations", "kv_cache")
                    ),
                    *(
                        changed(
                            SIMULATE[name],
                            many=True,
                            group=SEARCH,
                            help=f"{SIMULATE[name].help}: one or more to search (default: the --engine preset's) "
                            f"{UNDER_TRAFFIC}",
                        )
                        for name in ("max_batched_tokens", "max_running_requests")
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
)
