"""The option catalog is the one place options are declared: the command line, the sweep's axes, build_workload and
the Workload, and the documentation's tables all agree with it, and a value is named in its caller's terms."""

from __future__ import annotations

from dataclasses import fields

import pytest

import castcore
from castcore.cli.main import command_parsers
from castcore.cli.reference import flags, markdown
from castcore.options.catalog import AXIS, COMMANDS, WORKLOAD_OPTIONS, say
from castcore.options.option import terms
from castcore.sweeps.sweep import commands


REQUIRED = {
    "sweep": ["x.toml"],
    "plan": ["--model", "m"],
    "partition": ["m:f", "--ways", "2"],
    "measure": ["m:f"],
    "new-pack": ["castpack-x"],
    "cache": ["info"],
    "report": ["r.json", "--html", "r.html"],
}


def test_every_command_is_in_the_catalog():
    assert list(command_parsers()) == list(COMMANDS)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_each_command_line_takes_exactly_the_catalog_options_with_their_defaults(name):
    given = REQUIRED.get(name, [])
    parsed = vars(command_parsers()[name].parse_args(given))
    declared = {o.name: o for o, _ in COMMANDS[name].options}
    assert set(parsed) - {"func", "quick_exit", "spec", "debug"} == set(declared) - {"debug"}
    for option in declared.values():
        default = list(option.default) if isinstance(option.default, tuple) else option.default
        if option.default is not None or option.optional:  # the required ones were given above
            assert parsed[option.name] == default, option.name


def test_the_sweep_axes_and_the_workload_are_the_catalog():
    for name, command in commands().items():
        assert command.axes() == [o.key for o in COMMANDS[name].scoped(AXIS)]
    written = [f.name for f in fields(castcore.Workload) if f.name not in ("args", "kwargs")]
    assert written == [o.name for o in WORKLOAD_OPTIONS]
    made = castcore.build_workload(**{o.name: o.default for o in WORKLOAD_OPTIONS})
    assert made == castcore.Workload()


def test_build_workload_refuses_a_keyword_it_does_not_take_naming_the_close_one():
    with pytest.raises(
        castcore.ModelError,
        match=r"build_workload has no option 'micro_batch' \(did you mean "
        r"'micro_batches'\?\)",
    ):
        castcore.build_workload("llama-3-8b", micro_batch=2)


@pytest.mark.parametrize(
    ("kind", "batch", "eager", "placeholder"),
    [
        ("python", "batch=0", "fuse=False", "tp=N"),
        ("cli", "--batch 0", "--eager", "--tp N"),
        ("spec", "batch = 0", "eager = true", "tp = N"),
    ],
)
def test_an_option_is_spelled_in_each_callers_terms(kind, batch, eager, placeholder):
    from castcore.options.catalog import any_value

    with terms(kind):
        assert (say("batch", 0), say("fuse", False), say("tp", any_value("N"))) == (batch, eager, placeholder)
        with pytest.raises(castcore.ModelError, match=f"^{batch}: must be a whole number of at least 1$"):
            castcore.build_workload("llama-3-8b", batch=0)


def test_the_reference_tables_list_every_catalog_option_of_each_command():
    for name, command in COMMANDS.items():
        page = markdown(name)
        for option, _ in command.options:
            assert f"| `{option.cli}" in page, (name, option.cli)
    assert all(flag.startswith("--") for flag in flags())
    assert {"--batch", "--max-batch", "--eager", "--kv-reads", "--ttft", "--resume"} <= flags()
    assert "--bacth" not in flags()
