"""A command's argparse options made from castcore's option catalog, and the values parsed back under their names."""

from __future__ import annotations

import argparse
from typing import Any

from castcore.options.catalog import CommandOptions
from castcore.options.option import Option


def described(option: Option) -> str:
    """The option's help with what it accepts and its default, as --help and the documentation say it."""
    from castcore.workload.spec import preset_names

    text = option.help.replace("{presets}", ", ".join(preset_names()))
    if option.choices and option.metavar:  # the choices are hidden behind the metavar: say them
        text += f" ({', '.join(option.choices)})"
    default = option.shown_default or _default_text(option)
    return f"{text} (default: {default})" if default else text


def _default_text(option: Option) -> str | None:
    if option.switch or option.default is None or option.kind == "path":
        return None
    if isinstance(option.default, (list, tuple)):
        return " ".join(map(str, option.default))
    return str(option.default)


def add_options(parser: argparse.ArgumentParser, command: CommandOptions, *scopes: str) -> None:
    """The command's options of ``scopes`` (all when none), in groups as the catalog groups them."""
    groups: dict[str, Any] = {}
    exclusive: dict[str, Any] = {}
    for option, scope in command.options:
        if scopes and scope not in scopes:
            continue
        group = groups.get(option.group) or groups.setdefault(
            option.group, parser.add_argument_group(option.group)
        )
        together = next((p for p in command.exclusive if option.name in p), None)
        if together is not None:
            group = exclusive.get(together) or exclusive.setdefault(
                together, group.add_mutually_exclusive_group()
            )
        if option.positional:
            group.add_argument(option.name, help=described(option), **_argparse(option))
        else:
            flags = (option.short, option.cli) if option.short else (option.cli,)
            group.add_argument(*flags, dest=option.name, help=described(option), **_argparse(option))


def _argparse(option: Option) -> dict[str, Any]:
    if option.switch:
        if option.negated:
            return {"action": "store_false", "default": option.default}
        return {"action": "store_true", "default": option.default}
    more: dict[str, Any] = {"metavar": option.metavar}
    if option.kind == "int":
        more["type"] = int
    elif option.kind == "number":
        more["type"] = float
    if option.choices:
        more["choices"] = option.choices
    if option.kind == "path" and option.many:
        more["action"] = "append"
    elif option.many:
        more["nargs"] = "+"
    default = list(option.default) if isinstance(option.default, tuple) else option.default
    if option.positional:
        return (
            {**more, "metavar": option.cli}
            if option.default is None
            else {**more, "nargs": "?", "default": default}
        )
    if default is None and not option.optional:
        more["required"] = True
    return {**more, "default": default}


def values(args: argparse.Namespace, command: CommandOptions, *scopes: str) -> dict[str, Any]:
    """The parsed values of the command's options of ``scopes``, by their Python names."""
    return {o.name: getattr(args, o.name) for o in command.scoped(*scopes)}
