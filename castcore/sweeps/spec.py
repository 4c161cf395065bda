"""A sweep spec: the command, and for each of its options a value or a list of values; the grid is their product.

The keys are the command's options as castcore's option catalog declares them (castcore.options.catalog), spelled
as on the command line without the dashes, so a sweep cannot accept an option or a value the command would
refuse: each value goes through its option's own check, each point through the command's (``Command.to_job``:
build_workload, serving.check_request), and an error names the key as the spec writes it (``batch = 0``), with
the spec file's line. Torch-free.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from castcore.errors import did_you_mean
from castcore.options.catalog import AXIS, OUTPUT, SESSION, CommandOptions
from castcore.options.option import Option, terms
from castcore.tomlfiles import read_text, read_toml
from castcore.workload.spec import ModelError, Workload

MAX_POINTS = 100_000  # more only with --yes


@dataclass(frozen=True)
class Job:
    """One point as a worker runs it: ``Session.estimate(workload, device=)``, ``Session.serve(device=, **serve)`` or
    ``Session.simulate(device=, **simulate)``."""

    command: str
    device: str
    workload: Workload | None = None
    serve: dict[str, Any] | None = None
    simulate: dict[str, Any] | None = None

    def shared(self) -> tuple:
        """What points capturing the same model steps have in common: everything but the device."""
        options = self.workload.options() if self.workload is not None else (self.serve or self.simulate)
        return (self.command, tuple(sorted((k, repr(v)) for k, v in options.items())))

    def kept(self) -> tuple:
        """What a worker keeps in memory after this point for the next: a simulation's step-time model does not
        depend on the traffic or the replica count (castcore.serving.kv_capacity.step_times), so a plan's later
        rounds of a layout find it made."""
        if self.command != "simulate" or self.simulate is None:
            return self.shared()
        from castcore.serving.simulation_plan import TRAFFIC_NAMES

        options = {k: v for k, v in self.simulate.items() if k not in TRAFFIC_NAMES and k != "dp"}
        return (self.command, self.device, tuple(sorted((k, repr(v)) for k, v in options.items())))


@dataclass(frozen=True)
class Command:
    """What a sweep needs of one castcore command: its options, and its own checks of one point's values (by
    Python name), which make the job or raise ModelError."""

    options: CommandOptions
    to_job: Callable[[dict[str, Any]], Job]

    @property
    def name(self) -> str:
        return self.options.name

    def axes(self) -> list[str]:
        """The keys a point's row holds, in the order the command's --help lists them."""
        return [o.key for o in self.options.scoped(AXIS)]

    def by_key(self) -> dict[str, tuple[Option, str]]:
        return {o.key: (o, scope) for o, scope in self.options.options}


@dataclass
class Spec:
    """A checked spec: the command, each axis' values by key (as the spec gives them), the sweep-wide settings by
    Python name."""

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


def key_lines(path: str | Path) -> dict[str, int]:
    """The line each top-level key of a spec file is on, for errors that name it."""
    found: dict[str, int] = {}
    for number, line in enumerate(read_text(path, ModelError, "sweep spec", form="TOML").splitlines(), 1):
        match = re.match(r"\s*([A-Za-z0-9_-]+)\s*=", line)
        if match:
            found.setdefault(match.group(1), number)
    return found


def from_spec(option: Option, value: Any) -> Any:
    """A spec's value as the option's Python value: a spec says ``eager = true`` where Python says fuse=False."""
    return (not value) if option.negated and isinstance(value, bool) else value


def to_spec(option: Option, value: Any) -> Any:
    return from_spec(option, value)


def check_spec(
    data: Mapping[str, Any], commands: Mapping[str, Command], lines: Mapping[str, int] | None = None
) -> Spec:
    """Check every key and value of a spec (see the module docstring); ModelError names the key, its line when
    ``lines`` are known, and the fix."""
    name = data.get("command")
    if not isinstance(name, str) or name not in commands:  # one command a spec: a list is no axis of it
        raise ModelError(
            f"{_where('command', lines)}: name the command: command = "
            f"{' or '.join(repr(c) for c in commands)}"
            + (f" (got {name!r}; one command a spec)" if name is not None else "")
        )
    command = commands[name]
    keys = command.by_key()
    spec = Spec(command=command, axes={})
    for key, raw in data.items():
        if key == "command":
            continue
        where = _where(key, lines)
        found = keys.get(key.replace("-", "_"))
        if found is None:
            axes = [k for k, (_, scope) in keys.items() if scope != OUTPUT]
            raise ModelError(
                f"{where}: unknown key {key!r} for castcore {name}"
                f"{did_you_mean(key.replace('-', '_'), axes)}; its axes: {', '.join(axes)}"
            )
        option, scope = found
        with terms("spec"):
            try:
                if scope == OUTPUT:
                    raise ModelError(
                        f"{option.key} is how castcore {name} prints; a sweep writes every point's "
                        "figures to --out: drop it"
                    )
                if scope == SESSION:
                    if isinstance(raw, list) and not option.many:
                        raise option.error(raw, "applies to the whole sweep: give one value, not a list")
                    spec.session[option.name] = from_spec(option, option.check(raw))
                    continue
                values = raw if isinstance(raw, list) else [raw]
                if not values:
                    raise ModelError(
                        f"{option.key} is an empty list, so the grid has no point; give it at least "
                        "one value, or drop it for the command's default"
                    )
                spec.axes[option.key] = [
                    to_spec(option, option.check(from_spec(option, _as_written(option, v)))) for v in values
                ]
            except ModelError as exc:
                raise ModelError(f"{where}: {exc}") from None
    _check_together(spec, lines)
    return spec


def _as_written(option: Option, value: Any) -> Any:
    """A value as the command line would read its text: "32" is a whole number for a number option (a number is
    text for a text option: Option.check)."""
    if option.kind == "int" and isinstance(value, str) and value.strip().isdigit():
        return int(value)
    return value


def _where(key: str, lines: Mapping[str, int] | None) -> str:
    line = (lines or {}).get(key)
    return f"sweep spec line {line}" if line else "sweep spec"


def _check_together(spec: Spec, lines: Mapping[str, int] | None) -> None:
    """Options the command takes only one of (batch and max_batch) refused as the command refuses them."""
    keys = spec.command.by_key()
    for pair in spec.command.options.exclusive:
        given = [
            o
            for o, _ in (keys[spec.command.options[n].key] for n in pair)
            if any(v != to_spec(o, o.default) and v is not False for v in spec.axes.get(o.key, ()))
        ]
        if len(given) >= 2:
            raise ModelError(
                f"{_where(given[1].key, lines)}: {given[0].key} and {given[1].key} cannot go together; "
                "keep one of them"
            )


def check_devices(spec: Spec, installed: Mapping[str, Any]) -> None:
    """Every device the spec names is installed (or given by a device file)."""
    for name in spec.axes.get("device", ()):
        if name not in installed:
            raise ModelError(
                f"sweep spec: device = {name!r} is not installed; installed: "
                f"{', '.join(installed) or 'none'} (castcore devices lists them; add device_file = "
                '["my.toml"] for your own)'
            )


def check_size(spec: Spec, yes: bool = False) -> int:
    """The number of points; ModelError past MAX_POINTS unless ``yes``."""
    size = spec.size
    if size > MAX_POINTS and not yes:
        widest = max(spec.axes, key=lambda a: len(spec.axes[a]))
        raise ModelError(
            f"the spec expands to {size:,} points, more than {MAX_POINTS:,}: pass --yes to run them "
            f"all, or shorten an axis ({widest} has {len(spec.axes[widest])} values)"
        )
    return size


def combinations(spec: Spec) -> Iterator[dict[str, Any]]:
    """Every point's axis values, the last axis varying fastest."""
    names = list(spec.axes)
    for values in itertools.product(*(spec.axes[n] for n in names)):
        yield dict(zip(names, values))


def make_points(command: Command, chosen: list[dict[str, Any]], default_device: str) -> list[Point]:
    """Points from each point's chosen values (by key, as a spec gives them), the rest at the command's defaults;
    a point the command refuses keeps its reason, in the spec's terms, in ``error``."""
    axes = command.options.scoped(AXIS)
    points = []
    for index, values in enumerate(chosen):
        options = {o.name: from_spec(o, values[o.key]) if o.key in values else o.default for o in axes}
        if options.get("device") is None:
            options["device"] = default_device
        point = Point(index=index, params={o.key: to_spec(o, options[o.name]) for o in axes})
        with terms("spec"):
            try:
                point.job = command.to_job(options)
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
                option = spec.command.by_key()[axis][0]
                raise ModelError(
                    f"sweep spec: {option.spelled(from_spec(option, value), 'spec')} is refused at "
                    f"every point: {at[0].error}"
                )
    return points


def one_line(exc: BaseException) -> str:
    """An error as one line: castcore's own messages as they are, anything else with its type."""
    from castcore.errors import CastcoreError

    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if isinstance(exc, CastcoreError) else f"{type(exc).__name__}: {text}"
