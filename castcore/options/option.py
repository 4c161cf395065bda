"""One option as castcore declares it, checked the same way whoever gives it, and named in its giver's terms.

A Python caller says ``batch=0``, the shell ``--batch 0``, a sweep spec ``batch = 0``: ``terms`` sets which of
these an error message uses (the command line and the sweep set theirs; Python's is the default), and ``say``
writes an option (and a value) that way.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from castcore.errors import ModelError, did_you_mean

TERMS = ("python", "cli", "spec")
# beyond any count a deployment has, and below what would exhaust memory as a count of things
COUNT_LIMIT = 10**9
_terms: ContextVar[str] = ContextVar("castcore_option_terms", default="python")
_ABSENT = object()


class Placeholder(str):
    """A value that stands for any (``N``): written as itself in every terms, never quoted."""

    def __repr__(self) -> str:
        return str(self)


@contextmanager
def terms(kind: str) -> Iterator[None]:
    """Name options as ``kind`` ("python", "cli", "spec") in the errors raised inside."""
    if kind not in TERMS:
        raise ValueError(f"terms are one of {TERMS}, not {kind!r}")
    token = _terms.set(kind)
    try:
        yield
    finally:
        _terms.reset(token)


def current_terms() -> str:
    return _terms.get()


@dataclass(frozen=True)
class Option:
    """One option: its Python name, its command-line spelling, its sweep-spec key, its type and its check.

    ``kind`` is "int" (whole numbers of at least ``minimum``), "number" (finite, above zero, or at least zero with
    ``minimum`` 0), "str", "bool" (a
    switch), "time" (``50ms``, ``1s`` or seconds), "objective" (a time, or a statistic and a time: ``p99:500ms``)
    or "path". ``negated``: the command-line switch sets the option to False (``--eager`` is
    ``fuse=False``). ``many``: a list of values (``--tp 1 2 4``; a path option repeats instead).
    """

    name: str
    help: str
    group: str
    kind: str = "str"
    default: Any = None
    choices: tuple[str, ...] | None = None
    minimum: int = 1
    maximum: int | None = (
        COUNT_LIMIT  # a bound on what a count makes castcore generate (None: any, as a seed)
    )
    optional: bool = False  # None is a value (the default of most such options): "not given"
    flag: str | None = None  # the command-line spelling when it is not --name-with-dashes
    negated: bool = False
    many: bool = False
    metavar: str | None = None
    shown_default: str | None = None  # the default as --help says it, when not the value itself
    python: str | None = None  # how Python says it, when not ``name=`` (serve's --max-batch is batch="max")
    positional: bool = False  # a command-line argument without a flag (``castcore measure OP``)
    short: str | None = None  # a one-letter flag too (``-o``)

    @property
    def cli(self) -> str:
        if self.positional:
            return self.metavar or self.name.upper()
        return self.flag or "--" + self.name.replace("_", "-")

    @property
    def key(self) -> str:
        """The sweep spec's key and a sweep row's column: the command-line name without dashes."""
        return self.cli.removeprefix("--").replace("-", "_")

    @property
    def switch(self) -> bool:
        return self.kind == "bool"

    def spelled(self, value: Any = _ABSENT, kind: str | None = None) -> str:
        """The option, with ``value`` when given, as ``kind`` (default: the current terms) writes it."""
        kind = kind or _terms.get()
        given = value is not _ABSENT
        if kind == "python":
            return f"{self.name}={value!r}" if given else self.name
        if kind == "spec":
            if given and self.negated and isinstance(value, bool):
                value = not value
            return f"{self.key} = {_toml(value)}" if given else self.key
        if not given:
            return self.cli
        if self.positional:
            return f"{self.cli} {value}"
        if self.switch and isinstance(value, bool):  # --sp, --eager: the flag is the value
            return self.cli if value != self.negated else f"no {self.cli}"
        shown = " ".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
        return f"{self.cli} {shown}"

    def check(self, value: Any) -> Any:
        """``value`` when this option takes it (a list for ``many``); ModelError naming the option and the value."""
        if self.many and not self.switch and self.kind != "path":
            if value is None and self.optional:
                return None
            values = list(value) if isinstance(value, (list, tuple)) else [value]
            if not values:
                raise self.error(value, "give at least one value")
            return [self._one(v) for v in values]
        if self.kind == "path" and self.many:
            values = [value] if isinstance(value, str) else value
            if values is None:
                return None
            if not isinstance(values, (list, tuple)) or not all(isinstance(v, str) for v in values):
                raise self.error(value, "give a path or a list of paths")
            return list(values)
        return self._one(value)

    def _one(self, value: Any) -> Any:
        if value is None and self.optional:
            return None
        if self.switch:
            if not isinstance(value, bool):
                raise self.error(
                    value,
                    "is a switch: give true or false"
                    if _terms.get() == "spec"
                    else "is a switch: give True or False",
                )
            return value
        if self.kind == "int":
            if isinstance(value, bool) or not isinstance(value, int) or value < self.minimum:
                raise self.error(value, f"must be a whole number of at least {self.minimum}")
            if self.maximum is not None and value > self.maximum:
                raise self.error(value, f"is over {self.maximum:,}, castcore's limit for {self.spelled()}")
            return value
        if self.kind == "time":
            return seconds(value, self)
        if self.kind == "objective":
            return Objective.parse(value, self)
        if self.kind == "number":
            zero = self.minimum == 0  # 0 is a value (--expert-skew 0: balanced)
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not (0 <= value < math.inf if zero else 0 < value < math.inf)
            ):
                raise self.error(
                    value, "must be a number of 0 or more" if zero else "must be a number above zero"
                )
            return float(value)
        if self.kind == "path" and isinstance(value, os.PathLike):
            return os.fspath(value)
        if (
            self.kind == "str"
            and not self.choices
            and isinstance(value, (int, float))
            and not isinstance(value, bool)
        ):
            value = str(value)  # free text as the command line reads it: --output 8, --acceptance 0.7
        if not isinstance(value, str):
            wanted = f"one of {', '.join(self.choices)}" if self.choices else self.metavar or "a word"
            raise self.error(value, f"takes one value as text: {wanted}")
        if self.choices is not None and value not in self.choices:
            raise self.error(
                value,
                f"is not supported{did_you_mean(value, self.choices)}; use one of {', '.join(self.choices)}",
            )
        return value

    def error(self, value: Any, reason: str) -> ModelError:
        return ModelError(f"{self.spelled(value)}: {reason}")


_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6}


def seconds(value: Any, option: Option) -> float:
    """Seconds from ``1s``, ``50ms``, ``200us`` or a plain number of seconds: above zero and finite."""
    import re

    if isinstance(value, (int, float)) and not isinstance(value, bool):
        found = float(value)
    else:
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e-?[0-9]+)?)\s*(s|ms|us|µs)?\s*", str(value))
        found = float(match.group(1)) * _UNITS[match.group(2) or "s"] if match else 0.0
    if not 0 < found < math.inf:
        raise option.error(value, "give a time above zero such as 1s, 50ms, 200us or 0.5 (seconds)")
    return found


@dataclass(frozen=True)
class Objective:
    """A latency objective: ``statistic`` of the requests' times (mean, median, p90, p95 or p99, as
    ``vllm bench serve`` reports them) at most ``seconds``. A plain time is p99: nearly every request."""

    statistic: str
    seconds: float

    STATISTICS = ("mean", "median", "p90", "p95", "p99")

    @classmethod
    def parse(cls, value: Any, option: Option) -> Objective:
        if isinstance(value, Objective):
            return value
        statistic, colon, time = str(value).rpartition(":") if isinstance(value, str) else ("", "", value)
        statistic = {"p50": "median", "": "p99"}.get(statistic.strip().lower(), statistic.strip().lower())
        if statistic not in cls.STATISTICS:
            raise option.error(
                value,
                f"give TIME or STATISTIC:TIME with a statistic of {', '.join(cls.STATISTICS)}"
                " (p50 is the median), such as p99:500ms",
            )
        return cls(statistic, seconds(time, option))

    def field(self, metric: str) -> str:
        """The summary's key of this statistic of ``metric`` (ttft, tpot): ``p99_ttft_ms``."""
        return f"{self.statistic}_{metric}_ms"

    def __str__(self) -> str:
        return (
            f"{self.statistic} {self.seconds * 1e3:g}ms"
            if self.seconds < 1
            else f"{self.statistic} {self.seconds:g}s"
        )


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, Placeholder):
        return value
    return json.dumps(value) if isinstance(value, str) else repr(value)
