"""Check the answers before anything is written: one line on stderr and exit 1 for the first bad one.

``castcore new-pack`` imports ``problem`` from this file to check a name before rendering, so
the rules live here only. The file stays valid Python before cookiecutter renders it.
"""

from __future__ import annotations

import json
import keyword
import re
import sys

PACK_NAME = re.compile(r"[a-z][a-z0-9]*(-[a-z0-9]+)*")
MODULE_NAME = re.compile(r"[a-z][a-z0-9_]*")
DEVICE_NAME = re.compile(r"[a-z0-9][a-z0-9._-]*")
# Package names a pack must not take: importing the pack would shadow these.
TAKEN = {"castcore", "torch", "pluggy", "tests", "test"} | set(sys.stdlib_module_names)


def _module_problem(module: str) -> str | None:
    if keyword.iskeyword(module):
        return f"'{module}', a Python keyword; pick another"
    if module in TAKEN:
        return f"'{module}', which would shadow Python's, torch's or castcore's own; pick another"
    return None


def problem(answers: dict) -> str | None:
    """Why these answers would make a broken pack (the first reason), or None. Checks the keys present."""
    if "pack_name" in answers:
        name = answers["pack_name"]
        if not PACK_NAME.fullmatch(name):
            return (f"pack name {name!r} is invalid: use lowercase letters, digits and single hyphens, "
                    "starting with a letter (e.g. castpack-mynpu)")
        found = _module_problem(name.replace("-", "_"))
        if found:
            return f"pack name {name!r} makes the package name {found}"
    if "module_name" in answers:
        module = answers["module_name"]
        if not MODULE_NAME.fullmatch(module):
            return (f"module name {module!r} is invalid: use lowercase letters, digits and underscores, "
                    "starting with a letter (e.g. castpack_mynpu)")
        found = _module_problem(module)
        if found:
            return f"module name {found}"
    if "device_name" in answers:
        device = answers["device_name"]
        if not DEVICE_NAME.fullmatch(device):
            return (f"device name {device!r} is invalid: use lowercase letters, digits, '-', '_' and '.' "
                    "(no spaces or glob characters; e.g. mynpu-x1)")
    for field in ("vendor", "author"):
        if field in answers:
            text = answers[field]
            if not text.strip() or any(c in text for c in '"\\') or not text.isprintable():
                return f"{field} {text!r} is invalid: give a non-empty name without quotes or backslashes"
    return None


if __name__ == "__main__":
    # cookiecutter renders this line: the answers as JSON (which escapes any quote), read back here.
    found = problem(json.loads(r'''{{ cookiecutter | tojson }}'''))
    if found:
        print(f"error: {found}; nothing was written", file=sys.stderr)
        sys.exit(1)
