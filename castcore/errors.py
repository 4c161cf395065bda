"""The base of every error a user can cause: the command line prints its message as one line, exit 2."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class CastcoreError(Exception):
    """Bad input, a plugin's bad answer, or a model castcore cannot run; the message names the culprit and the fix."""


class ModelError(CastcoreError, ValueError):
    """A model or workload castcore cannot build; the message says what is accepted."""


class StrictFailure(CastcoreError):
    """``strict`` turned a reported problem into a failure (the command line exits 1)."""


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """``" (did you mean 'h100-sxm5-80gb'?)"`` naming the nearest of ``choices`` to a mistyped ``name`` (at most
    three: spelled alike, or starting with or holding what was typed), or "" when none is near."""
    choices = list(dict.fromkeys(map(str, choices)))
    typed = name.lower()
    near = [c for c in choices if c.lower().startswith(typed) or typed in c.lower()] if len(typed) > 1 else []
    near += difflib.get_close_matches(name, choices, n=3, cutoff=0.6)
    near = list(dict.fromkeys(c for c in near if c != name))[:3]
    if not near:
        return ""
    return f" (did you mean {' or '.join(repr(c) for c in near)}?)"
