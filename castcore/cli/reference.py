"""The command reference of the documentation, made from the option catalog (castcore.options.catalog) and the
command line's parsers, so it cannot drift from what the commands take."""

from __future__ import annotations

from castcore.cli.main import command_parsers
from castcore.cli.options import described
from castcore.options.catalog import AXIS, COMMANDS, OUTPUT, SESSION
from castcore.options.option import Option

_WHERE = {AXIS: "a sweep axis", SESSION: "sweep-wide", OUTPUT: "command line only"}


def commands() -> list[str]:
    return list(command_parsers())


def markdown(command: str) -> str:
    """One command's reference as Markdown: its usage and what it does, then its options: a table per group for
    the commands the catalog declares, the --help text for the others."""
    parsers = command_parsers()
    if command not in parsers:
        raise KeyError(f"no castcore command {command!r}; the commands: {', '.join(parsers)}")
    parser = parsers[command]
    head = f"```text\n{parser.format_usage().strip()}\n```\n\n{parser.description or ''}\n"
    declared = COMMANDS[command]
    groups: dict[str, list[tuple[Option, str]]] = {}
    for option, scope in declared.options:
        groups.setdefault(option.group, []).append((option, scope))
    parts = [head]
    for group, rows in groups.items():
        parts.append(
            f"\n**{group}**\n\n| option | Python | in a sweep spec | what it does |\n|---|---|---|---|"
        )
        for option, scope in rows:
            value = option.metavar or ("{" + ",".join(option.choices) + "}" if option.choices else "VALUE")
            shown = option.cli if option.switch else f"{option.cli} {value}"
            python = option.python or (f"{option.name}=False" if option.negated else option.name)
            where = f"`{option.key}`" + ("" if scope == AXIS else f" ({_WHERE[scope]})")
            if scope == OUTPUT or command not in ("estimate", "serve"):
                where = "-"
            parts.append(f"| `{shown}` | `{python}` | {where} | {_cell(described(option))} |")
    if declared.exclusive:
        groups = "; ".join(", ".join(declared[n].cli for n in group) for group in declared.exclusive)
        parts.append(f"\nGiven one at most: {groups}.")
    return "\n".join(parts) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def flags() -> set[str]:
    """Every long option of every command (``--batch``, ``--max-batch``, ...)."""
    return {o.cli for command in COMMANDS.values() for o, _ in command.options if not o.positional}
