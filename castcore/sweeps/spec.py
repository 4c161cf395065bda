"""A sweep spec: the command, and for each of its options a value or a list of values; the grid is their product.

The options are read off the command's own argparse parser (``Command.parser``, built by the command line with
the same functions ``castcore estimate`` and ``castcore serve`` use), so a sweep cannot accept an option or a
value the command would refuse. Each value goes through that parser; each point then through the command's own
check (``Command.to_job``: build_workload, serving.check_request). Torch-free.
"""

from __future__ import annotations

import argparse
import difflib
import itertools
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from castcore.tomlfiles import read_toml
from castcore.workload.spec import ModelError, Workload

MAX_POINTS = 100_000  # more only with --yes


@dataclass(frozen=True)
class Job:
    """One point as a worker runs it: ``Session.estimate(workload, device=)`` or ``Session.serve(device=, **serve)``."""

    command: str
    device: str
    workload: Workload | None = None
    serve: dict[str, Any] | None = None

    def shared(self) -> tuple:
        """What points capturing the same model steps have in common: everything but the device."""
        options = self.workload.options() if self.workload is not None else self.serve
        return (self.command, tuple(sorted((k, repr(v)) for k, v in options.items())))


@dataclass(frozen=True)
class Command:
    """What a sweep needs of one castcore command; the command line makes it from the command's parser."""

    name: str
    parser: argparse.ArgumentParser  # its error() raises ModelError instead of exiting
    session_options: frozenset[str]  # plugin and device options: one setting for the whole sweep
    output_options: frozenset[str]  # how the command prints: no meaning in a sweep
    to_job: Callable[[argparse.Namespace], Job]  # the command's own checks; raises ModelError

    def actions(self) -> dict[str, argparse.Action]:
        """The command's options by their destination name, in the order its --help lists them."""
        return {a.dest: a for a in self.parser._actions if a.option_strings and a.dest != "help"}

    def axes(self) -> list[str]:
        return [d for d in self.actions() if d not in self.session_options | self.output_options]


@dataclass
class Spec:
    """A checked spec: the command, each axis' values (as the parser gives them), the sweep-wide settings."""

    command: Command
    axes: dict[str, list[Any]]
    session: dict[str, Any] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return math.prod(len(values) for values in self.axes.values())


@dataclass
class Point:
    """One point of a grid: its row's parameters, and the job that runs it or why it cannot run."""

    index: int
    params: dict[str, Any]
    job: Job | None = None
    error: str | None = None


def read_spec(path: str | Path) -> dict[str, Any]:
    """The TOML file as a dict; ModelError naming the file and the fault."""
    return read_toml(path, ModelError, "sweep spec")


def check_spec(data: Mapping[str, Any], commands: Mapping[str, Command]) -> Spec:
    """Check every key and value of a spec (see the module docstring); ModelError names the key and the fix."""
    name = data.get("command")
    if not isinstance(name, str) or name not in commands:  # one command a spec: a list is no axis of it
        raise ModelError(f"sweep spec: name the command: command = {' or '.join(repr(c) for c in commands)}"
                         + (f" (got {name!r}; one command a spec)" if name is not None else ""))
    command = commands[name]
    actions = command.actions()
    spec = Spec(command=command, axes={})
    for key, raw in data.items():
        if key == "command":
            continue
        dest = key.replace("-", "_")
        if dest in command.output_options:
            raise ModelError(f"sweep spec: {key} is how castcore {name} prints; a sweep writes every point's "
                             "figures to --out: drop it")
        if dest not in actions:
            close = difflib.get_close_matches(dest, list(actions), n=1)
            raise ModelError(f"sweep spec: unknown key {key!r} for castcore {name}"
                             + (f" (did you mean {close[0]!r}?)" if close else "")
                             + f"; its axes: {', '.join(command.axes())}")
        action = actions[dest]
        if dest in command.session_options:
            spec.session[dest] = _session_value(key, raw, action)
            continue
        values = raw if isinstance(raw, list) else [raw]
        if not values:
            raise ModelError(f"sweep spec: {key} is an empty list, so the grid has no point; give it at least one "
                             "value, or drop it for the command's default")
        spec.axes[dest] = [_value(command, key, action, v) for v in values]
    _check_together(spec)
    return spec


def _session_value(key: str, raw: Any, action: argparse.Action) -> Any:
    if isinstance(action, argparse._AppendAction):  # --device-file, --custom-op-dir: every one applies
        values = raw if isinstance(raw, list) else [raw]
        if not all(isinstance(v, str) for v in values):
            raise ModelError(f"sweep spec: {key} takes a path or a list of paths (got {raw!r})")
        return values
    if not isinstance(raw, bool):
        raise ModelError(f"sweep spec: {key} applies to the whole sweep: give true or false (got {raw!r})")
    return raw


def _tokens(action: argparse.Action, key: str, value: Any) -> list[str]:
    """The command-line words that give ``value`` to ``action``."""
    flag = action.option_strings[-1]
    if action.nargs == 0:  # --eager, --train, --sp, ...
        if not isinstance(value, bool):
            raise ModelError(f"sweep spec: {key} = {value!r}: {key} is a switch; give true or false")
        return [flag] if value else []
    if isinstance(value, (bool, float, list, dict)):
        raise ModelError(f"sweep spec: {key} = {value!r}: give {flag}'s value as on the command line (a whole "
                         "number or a word)")
    return [flag, str(value)]


def _value(command: Command, key: str, action: argparse.Action, value: Any) -> Any:
    """``value`` as the command's parser reads it; ModelError naming the key and value when it refuses it."""
    try:
        parsed = command.parser.parse_args(_tokens(action, key, value))
    except ModelError as exc:
        if str(exc).startswith("sweep spec:"):
            raise
        raise ModelError(f"sweep spec: {key} = {value!r}: {exc}") from None
    return getattr(parsed, action.dest)


def _check_together(spec: Spec) -> None:
    """Options the command takes only one of (--batch and --max-batch) refused as the command refuses them."""
    actions = spec.command.actions()
    words: list[str] = []
    for dest, values in spec.axes.items():
        action = actions[dest]
        given = [v for v in values if v != action.default and v is not False]
        if given:
            words += [action.option_strings[-1]] if action.nargs == 0 else [action.option_strings[-1], str(given[0])]
    try:
        spec.command.parser.parse_args(words)
    except ModelError as exc:
        raise ModelError(f"sweep spec: {exc}; keep one of them") from None


def check_devices(spec: Spec, installed: Mapping[str, Any]) -> None:
    """Every device the spec names is installed (or given by a device file)."""
    for name in spec.axes.get("device", ()):
        if name not in installed:
            raise ModelError(f"sweep spec: device = {name!r} is not installed; installed: "
                             f"{', '.join(installed) or 'none'} (castcore devices lists them; add device_file = "
                             "[\"my.toml\"] for your own)")


def check_size(spec: Spec, yes: bool = False) -> int:
    """The number of points; ModelError past MAX_POINTS unless ``yes``."""
    size = spec.size
    if size > MAX_POINTS and not yes:
        widest = max(spec.axes, key=lambda a: len(spec.axes[a]))
        raise ModelError(f"the spec expands to {size:,} points, more than {MAX_POINTS:,}: pass --yes to run them "
                         f"all, or shorten an axis ({widest} has {len(spec.axes[widest])} values)")
    return size


def combinations(spec: Spec) -> Iterator[dict[str, Any]]:
    """Every point's axis values, the last axis varying fastest."""
    names = list(spec.axes)
    for values in itertools.product(*(spec.axes[n] for n in names)):
        yield dict(zip(names, values))


def make_points(command: Command, chosen: list[dict[str, Any]], default_device: str) -> list[Point]:
    """Points from each point's chosen option values, the rest at the command's defaults; a point the command
    refuses keeps its reason in ``error``."""
    defaults = vars(command.parser.parse_args([]))
    axes = command.axes()
    points = []
    for index, values in enumerate(chosen):
        options = {**defaults, **values}
        if options.get("device") is None:
            options["device"] = default_device
        point = Point(index=index, params={a: options[a] for a in axes})
        try:
            point.job = command.to_job(argparse.Namespace(**options))
        except ModelError as exc:
            point.error = one_line(exc)
        points.append(point)
    return points


def expand(spec: Spec, default_device: str) -> list[Point]:
    """The grid's points; ModelError when a value of an axis is refused at every point it is in (so it is the
    value, not one combination, at fault), or every point is refused."""
    chosen = list(combinations(spec))
    points = make_points(spec.command, chosen, default_device)
    refused = [p for p in points if p.error]
    if refused and len(refused) == len(points):
        raise ModelError(f"sweep spec: every point is refused: {refused[0].error}")
    for axis, values in spec.axes.items():
        if len(values) < 2:
            continue
        for value in values:
            at = [p for p, c in zip(points, chosen) if c[axis] == value]
            if all(p.error for p in at):
                raise ModelError(f"sweep spec: {axis} = {value!r} is refused at every point: {at[0].error}")
    return points


def one_line(exc: BaseException) -> str:
    """An error as one line: castcore's own messages as they are, anything else with its type."""
    from castcore.errors import CastcoreError

    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if isinstance(exc, CastcoreError) else f"{type(exc).__name__}: {text}"
