"""The base of every error a user can cause: the command line prints its message as one line, exit 2."""

from __future__ import annotations


class CastcoreError(Exception):
    """Bad input, a plugin's bad answer, or a model castcore cannot run; the message names the culprit and the fix."""


class ModelError(CastcoreError, ValueError):
    """A model or workload castcore cannot build; the message says what is accepted."""


class StrictFailure(CastcoreError):
    """``strict`` turned a reported problem into a failure (the command line exits 1)."""
