"""The options of the commands around an estimate: audit, packs, devices, partition and measure (one operator),
calibrate, new-pack and cache."""

from __future__ import annotations

from castcore.devices.dtypes import TENSOR_DTYPES
from castcore.options.option import Option
from castcore.options.parts import (
    ARGUMENTS,
    AXIS,
    CALL,
    CommandOptions,
    DEPLOYMENT,
    DEVICE,
    JSON,
    MODEL_OPTION,
    OPERATOR,
    OUTPUT,
    PLUGIN_OPTIONS,
    PRINTING,
    RUNNING,
    SESSION,
    STEP,
    changed,
    int_option,
    scoped,
    switch,
)

AUDIT = CommandOptions(
    "audit",
    (
        *scoped(
            OUTPUT,
            (
                changed(
                    DEVICE,
                    help="audit this device only (default: every installed device; with --model, the default "
                    "device)",
                ),
                Option(
                    "op",
                    "only this operator, e.g. aten::mm (every overload) or aten::add.Tensor",
                    PRINTING,
                    optional=True,
                ),
                changed(JSON, help="print JSON"),
            ),
        ),
        *scoped(
            AXIS,
            (
                changed(
                    MODEL_OPTION,
                    default=None,
                    optional=True,
                    help=MODEL_OPTION.help + "; audit the ops it runs (default: no model, every claim)",
                ),
                *STEP[1:],
                *DEPLOYMENT,
            ),
        ),
        *scoped(SESSION, PLUGIN_OPTIONS),
    ),
)

_LISTING = (changed(JSON, help="print JSON"), *PLUGIN_OPTIONS)
PACKS = CommandOptions("packs", (*scoped(OUTPUT, _LISTING[:1]), *scoped(SESSION, _LISTING[1:])))
DEVICES = CommandOptions("devices", PACKS.options)

TARGET = Option("op", "module:function or path/to/file.py:function", OPERATOR, positional=True, metavar="OP")
EXAMPLE_CALL = (
    Option(
        "input",
        "one positional argument, in order: a tensor 4096x1024 or 4096x1024:bf16, 'scalar', 'none', or a "
        "literal such as 0.5; a bare 8 is a tensor of 8 elements, so pass integers with --arg (repeatable)",
        CALL,
        kind="path",
        many=True,
        default=(),
        metavar="SPEC",
    ),
    Option(
        "arg",
        "a named argument, e.g. h=8 for a hidden dim (h t); numbers stay numbers, a tensor is written "
        "4096x1024[:dtype] (repeatable)",
        CALL,
        kind="path",
        many=True,
        default=(),
        metavar="NAME=VALUE",
    ),
    Option(
        "dtype",
        "dtype of tensors given without one",
        CALL,
        default="bf16",
        choices=tuple(sorted(TENSOR_DTYPES)),
    ),
)
PARTITION = CommandOptions(
    "partition",
    (
        *scoped(
            AXIS,
            (
                TARGET,
                int_option("ways", None, "number of devices to split over", OPERATOR),
                *EXAMPLE_CALL,
                changed(DEVICE, help="device profile (default: the default device)", group=OPERATOR),
            ),
        ),
        *scoped(OUTPUT, (changed(JSON, help="print the plan as JSON"),)),
        *scoped(SESSION, PLUGIN_OPTIONS),
    ),
)
MEASURE = CommandOptions(
    "measure",
    (
        *scoped(
            AXIS,
            (
                TARGET,
                *EXAMPLE_CALL,
                int_option("warmup", 3, "untimed runs first", RUNNING, minimum=0),
                int_option("repeat", 10, "timed runs; the median is shown", RUNNING),
                changed(
                    DEVICE, help="device profile to estimate on (default: the default device)", group=OPERATOR
                ),
            ),
        ),
        *scoped(OUTPUT, (changed(JSON, help="print JSON"),)),
        *scoped(SESSION, PLUGIN_OPTIONS),
    ),
)
DEBUG = changed(PLUGIN_OPTIONS[-1], group=PRINTING)
CALIBRATE = CommandOptions(
    "calibrate",
    (
        *scoped(
            OUTPUT,
            (
                Option(
                    "output",
                    "file to write, or - for stdout",
                    PRINTING,
                    kind="path",
                    default="local.toml",
                    short="-o",
                    metavar="FILE",
                ),
                Option("name", "the profile's device name", PRINTING, default="local"),
                switch("quick", "small sizes: seconds instead of a minute, numbers well below peak", RUNNING),
            ),
        ),
        *scoped(SESSION, (DEBUG,)),
    ),
)
NEW_PACK = CommandOptions(
    "new-pack",
    (
        *scoped(
            OUTPUT,
            (
                Option(
                    "name",
                    "the pack's distribution name: lowercase letters, digits and hyphens, e.g. castpack-mynpu; the "
                    "module, entry-point and device names default to names derived from it",
                    ARGUMENTS,
                    positional=True,
                    metavar="NAME",
                ),
                Option(
                    "output_dir",
                    "make the pack in DIR/NAME; DIR/NAME must not exist",
                    PRINTING,
                    kind="path",
                    default=".",
                    metavar="DIR",
                    shown_default="the current directory",
                ),
                switch("no_input", "ask nothing: take the default for every answer", PRINTING),
                switch(
                    "profiles_only",
                    "a pack of device profiles only (as castpack-nvidia is): no ops.py, no example estimators",
                    PRINTING,
                ),
            ),
        ),
        *scoped(SESSION, (DEBUG,)),
    ),
)
CACHE = CommandOptions(
    "cache",
    (
        *scoped(
            OUTPUT,
            (
                Option(
                    "action",
                    "info: entries, size, location; clear: remove them",
                    ARGUMENTS,
                    positional=True,
                    choices=("info", "clear"),
                ),
                changed(JSON, help="info as JSON"),
            ),
        ),
    ),
)
