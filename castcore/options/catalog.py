"""Every option castcore takes, once: the command line's options, a sweep's axes, ``build_workload``'s keywords, the
``Workload``'s fields and the documentation's option tables are all made from these declarations. COMMANDS gathers
every command's: estimate's, serve's, sweep's and report's are here, simulate's in castcore.options.traffic, plan's in
castcore.options.plan, the other commands' in castcore.options.tools (the options several share are in
castcore.options.parts)."""

from __future__ import annotations

from typing import Any

from castcore.options.html import HTML, paged
from castcore.options.option import Option, Placeholder
from castcore.options.parts import (
    ARGUMENTS,
    AXIS,
    CommandOptions,
    DEPLOYMENT,
    DEVICE,
    DTYPE,
    JSON,
    MODEL_OPTION,
    NO_CACHE,
    OUTPUT,
    PLUGINS,
    PLUGIN_OPTIONS,
    PRICE,
    PRINTING,
    REQUEST_TOKENS,
    RUNNING,
    SERVE_BATCH,
    SESSION,
    STEP,
    WORKERS,
    changed,
    int_option,
    scoped,
    switch,
)
from castcore.options.plan import PLAN
from castcore.options.tools import AUDIT, CACHE, CALIBRATE, DEVICES, MEASURE, NEW_PACK, PACKS, PARTITION
from castcore.options.traffic import SIMULATE

ESTIMATE = paged(
    CommandOptions(
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
)

SERVE = paged(
    CommandOptions(
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
)

SWEEP = paged(
    CommandOptions(
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
)

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
