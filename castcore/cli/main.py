"""The ``castcore`` command: parse, run one subcommand, turn a user's error into one line and exit 2.

Every subcommand module imports torch only inside its run function, so ``--help`` and ``--version`` are quick.
"""

from __future__ import annotations

import argparse
import errno
import os
import sys
from collections.abc import Sequence

from castcore.cli import audit, devices, estimate, measure, new_pack, packs, partition, serve
from castcore.cli import cache, plan, report, simulate, sweep
from castcore.errors import CastcoreError, ModelError, StrictFailure, did_you_mean
from castcore.options.catalog import say
from castcore.options.option import terms


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("castcore")
    except PackageNotFoundError:
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    return _build()[0]


def command_parsers() -> dict[str, argparse.ArgumentParser]:
    """Each command's parser by its name, in the order ``castcore --help`` lists them."""
    return _build()[1]


class _Parser(argparse.ArgumentParser):
    """argparse's parser, naming the nearest choices to a mistyped one (a command, --engine, --dtype, ...)."""

    def _check_value(self, action: argparse.Action, value: object) -> None:
        if action.choices is not None and value not in action.choices:
            raise argparse.ArgumentError(
                action,
                f"invalid choice: {value!r}{did_you_mean(str(value), action.choices)} "
                f"(choose from {', '.join(map(str, action.choices))})",
            )


def _build() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    parser = _Parser(
        prog="castcore",
        description="Estimate how fast a PyTorch model runs on an accelerator you may not have.",
    )
    parser.add_argument("--version", action="version", version=f"castcore {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    estimate.add_parser(sub)
    serve.add_parser(sub)
    simulate.add_parser(sub)
    audit.add_parser(sub)
    packs.add_parser(sub)
    devices.add_parser(sub)
    new_pack.add_parser(sub)
    partition.add_parser(sub)
    measure.add_parsers(sub)
    sweep.add_parser(sub)
    plan.add_parser(sub)
    cache.add_parser(sub)
    report.add_parser(sub)
    return parser, dict(sub.choices)


_quick_exit = False  # set by main() for a command that may skip the interpreter's teardown (see console)


def main(argv: Sequence[str] | None = None) -> int:
    global _quick_exit
    parser = build_parser()
    args = parser.parse_args(argv)
    _quick_exit = getattr(args, "quick_exit", False)
    if args.command is None:
        parser.print_help()
        return 2
    if sys.stdout is None:  # started with standard output closed (>&-): the results would be lost
        print(
            "castcore: error: standard output is closed, and castcore prints its results there: redirect it to a "
            "file or /dev/null",
            file=sys.stderr,
        )
        return 2
    try:
        with terms("cli"):  # errors name options as the shell gives them: --batch 0
            _check_expert_parallel(args)
            code = args.func(args)
        sys.stdout.flush()  # a full disk or a bad descriptor fails here, never as a result silently lost
        return code
    except BrokenPipeError:  # output piped into head & co: not an error
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        print("castcore: interrupted", file=sys.stderr)
        return 130
    except StrictFailure as exc:
        print(f"castcore: error: {exc}", file=sys.stderr)
        return 1
    except CastcoreError as exc:
        if args.debug:
            raise
        print(f"castcore: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # after CastcoreError: an OutputError is an OSError too
        # a file's error is the command's to word
        if exc.errno not in _OUTPUT_ERRORS or exc.filename is not None:
            raise
        _discard_stdout()
        print(f"castcore: error: cannot write standard output: {exc.strerror}", file=sys.stderr)
        return 2


def _check_expert_parallel(args: argparse.Namespace) -> None:
    """An --ep above --tp without --attention-dp is refused: read as vLLM's -tp N --enable-expert-parallel it is
    tensor parallelism as wide, read as TensorRT-LLM's and SGLang's DP attention it is data-parallel attention."""
    tp, ep, groups = (getattr(args, name, None) for name in ("tp", "ep", "attention_dp"))
    if not all(isinstance(v, int) for v in (tp, ep, groups)) or ep <= tp or ep % tp or groups > 1:
        return
    given = f"{say('tp', tp)} {say('ep', ep)}" if tp > 1 else say("ep", ep)
    raise ModelError(
        f"{given} leaves open what runs the attention: give {say('tp', ep)} {say('ep', ep)} (attention "
        f"and experts over {ep} devices, as vLLM's -tp {ep} --enable-expert-parallel) or {given} "
        f"{say('attention_dp', ep // tp)} (attention data-parallel over {ep // tp} groups of {tp} "
        "device(s), the experts over all of them)"
    )


_OUTPUT_ERRORS = (errno.ENOSPC, errno.EBADF, errno.EIO, errno.EFBIG, errno.EDQUOT)


def _discard_stdout() -> None:
    """Drop what could not be written, so the interpreter's exit does not try (and complain) again."""
    try:
        sys.stdout.close()
    except OSError:
        pass
    sys.stdout = open(os.devnull, "w")


def console() -> None:
    """The castcore script (and ``python -m castcore``): main(), then the exit. estimate and serve start no process
    and leave nothing open once they have printed, so they end without the interpreter's teardown: tearing torch
    down takes about 0.4 s, a fifth of a cached estimate."""
    code = main()
    if code == 130:
        # CPython 3.11 remembers a Ctrl-C that escaped an eval() of a string (torch's schema parsing runs them) and,
        # under python -m, exits by SIGINT though main() handled it; an eval that ends normally forgets it
        eval("None")
    if not _quick_exit:
        sys.exit(code)
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (BrokenPipeError, ValueError):  # a reader that went away (as main allows), a closed stream
            pass
    os._exit(code)


if __name__ == "__main__":
    console()
