"""--html, the option of every command whose result makes a page, and how a command takes it."""

from __future__ import annotations

from dataclasses import replace

from castcore.options.option import Option
from castcore.options.parts import OUTPUT, PRINTING, CommandOptions

HTML = Option(
    "html",
    "also write one self-contained HTML page of the result: interactive charts and sortable "
    "tables, opened offline in any browser (needs plotly: castcore[html])",
    PRINTING,
    kind="path",
    optional=True,
    metavar="FILE",
)


def paged(command: CommandOptions) -> CommandOptions:
    """``command`` with --html last among its options."""
    return replace(command, options=(*command.options, (HTML, OUTPUT)))
