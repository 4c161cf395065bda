"""mkdocs hook: the command reference made from castcore's own parsers, and no page naming an option castcore lacks.

- A line ``<!-- castcore-reference: estimate -->`` becomes ``castcore.cli.reference.markdown("estimate")``. The page
  holding such markers must hold one for every command (``castcore.cli.reference.commands()``).
- A long option castcore's command line does not have (``--bacth``) fails the build, naming the page and the
  option, where a page writes it as castcore's: an inline code span that is an option (`` `--batch N` ``) or a
  castcore command line (`` `castcore serve --max-batch` ``), and the ``castcore ...`` lines of code blocks.
  Other programs' command lines (`` `python bench/scale.py --models ...` ``, ``nox``, ``pip``) are theirs.
"""

from __future__ import annotations

import re

MARKER = re.compile(r"^<!--\s*castcore-reference:\s*([\w-]+)\s*-->[ \t]*$", re.MULTILINE)
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>```+|~~~+)[^\n]*\n.*?^(?P=indent)(?P=fence)[ \t]*$",
                   re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.DOTALL)
LONG_OPTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
COMMAND_LINE = re.compile(r"^\s*(?:\$\s*)?castcore\s")


def _known_options() -> set[str]:
    from castcore.cli import reference
    from castcore.cli.main import build_parser

    known = set(reference.flags())
    # castcore's own options, before the command (--version, --help).
    known.update(s for action in build_parser()._actions for s in action.option_strings if s.startswith("--"))
    return known


def _options_written(markdown: str) -> list[str]:
    """The long options ``markdown`` writes as castcore's, in order."""
    found: list[str] = []
    for block in FENCE.finditer(markdown):
        for line in block.group(0).splitlines()[1:-1]:
            if COMMAND_LINE.match(line):
                found += LONG_OPTION.findall(line)
    prose = FENCE.sub("", markdown)
    for span in CODE_SPAN.finditer(prose):
        text = span.group(2).strip()
        if text.startswith("--") or COMMAND_LINE.match(text):
            found += LONG_OPTION.findall(text)
    return found


def _fail(message: str):
    from mkdocs.exceptions import PluginError  # here, so the checks above can be used without mkdocs (tests)

    raise PluginError(message)


def on_page_markdown(markdown: str, page, config, files) -> str:
    from castcore.cli import reference

    where = page.file.src_uri
    known = _known_options()
    unknown = sorted(set(_options_written(markdown)) - known)
    if unknown:
        _fail(f"{where} names {', '.join(unknown)}, which no castcore command has (castcore.cli.reference.flags())")

    named = MARKER.findall(markdown)
    if not named:
        return markdown
    commands = reference.commands()
    missing = [c for c in commands if c not in named]
    strays = [c for c in named if c not in commands]
    if missing or strays:
        _fail(f"{where}: " + "; ".join(filter(None, [
            missing and f"no reference marker for {', '.join(missing)}",
            strays and f"a marker for {', '.join(strays)}, which is no castcore command"])))
    return MARKER.sub(lambda m: reference.markdown(m.group(1)).rstrip("\n"), markdown)
