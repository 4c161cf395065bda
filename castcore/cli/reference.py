"""The command reference of the documentation, made from the command line's own parsers, so it cannot drift."""

from __future__ import annotations

import re

from castcore.cli.main import command_parsers


def markdown(command: str) -> str:
    """One command's reference as Markdown: what it does, and its options."""
    parsers = command_parsers()
    if command not in parsers:
        raise KeyError(f"no castcore command {command!r}; the commands: {', '.join(parsers)}")
    parser = parsers[command]
    text = parser.format_help()
    return f"{parser.description or ''}\n\n```text\n{text.rstrip()}\n```\n"


def commands() -> list[str]:
    return list(command_parsers())


def flags() -> set[str]:
    """Every long option of every command (``--batch``, ``--max-batch``, ...)."""
    found = set()
    for parser in command_parsers().values():
        found.update(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", parser.format_usage() + parser.format_help()))
    return found
