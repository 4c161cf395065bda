"""The page's options: ``--html FILE`` on estimate, serve, simulate, sweep and plan, and ``castcore report``'s. They are
declared here, beside the page, and added to the catalog's commands (castcore.options.catalog) rather than written
into it; ``COMMANDS`` is every command the command line has, the catalog's with these, which the parsers, the
documentation's reference and the catalog's tests read."""

from __future__ import annotations

from dataclasses import replace

from castcore.options import catalog
from castcore.options.option import Option
from castcore.options.parts import ARGUMENTS, OUTPUT, PLUGIN_OPTIONS, PRINTING, SESSION, CommandOptions, scoped

HTML = Option("html", "also write one self-contained HTML page of the result: interactive charts and sortable "
              "tables, opened offline in any browser (needs plotly: castcore[html])", PRINTING, kind="path",
              optional=True, metavar="FILE")
PAGED = ("estimate", "serve", "simulate", "sweep", "plan")

RESULTS = Option("results", "a results file castcore wrote: estimate, serve, simulate or plan --json (.json), or "
                 "sweep --out rows (.jsonl, .csv, .parquet)", ARGUMENTS, kind="path", positional=True,
                 metavar="RESULTS")
REPORT = CommandOptions("report", (
    *scoped(OUTPUT, (RESULTS, replace(HTML, help="the HTML page to write: one self-contained file, opened offline "
                                      "(needs plotly: castcore[html])", optional=False))),
    *scoped(SESSION, PLUGIN_OPTIONS[-1:]),  # --debug
))


def with_html(command: CommandOptions) -> CommandOptions:
    """``command`` with --html among its output options."""
    return replace(command, options=(*command.options, (HTML, OUTPUT)))


COMMANDS = {name: with_html(command) if name in PAGED else command for name, command in catalog.COMMANDS.items()}
COMMANDS["report"] = REPORT
ESTIMATE, SERVE, SIMULATE, SWEEP, PLAN = (COMMANDS[name] for name in PAGED)
