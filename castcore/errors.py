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
    """``" (did you mean 'h100-sxm5-80gb'?)"`` naming the nearest of ``choices`` to a mistyped ``name``, or "" when
    none is near: those starting with or holding what was typed, else those spelled alike; at most three."""
    choices = [c for c in dict.fromkeys(map(str, choices)) if c != name]
    typed = name.lower()

    def score(choice: str) -> float:
        return difflib.SequenceMatcher(None, typed, choice.lower()).ratio()

    near = [c for c in choices if typed in c.lower()] if len(typed) > 1 else []
    if not near:
        alike = sorted(difflib.get_close_matches(name, choices, n=3, cutoff=0.6), key=score, reverse=True)
        near = [c for c in alike if score(c) >= score(alike[0]) - 0.15]  # the nearest, not all that are near
    if not near:
        return ""
    return f" (did you mean {' or '.join(repr(c) for c in sorted(near, key=score, reverse=True)[:3])}?)"
