"""``castcore new-pack``: a new pack directory rendered from the cookiecutter template shipped in castcore.

The template is package data (``castcore/pack_template``), so this works from a normal install.
Its pre-generation hook holds the naming rules; the name is checked with them here first so a bad
name is a one-line error before cookiecutter asks anything.
"""

from __future__ import annotations

import argparse
import logging
import shutil
from pathlib import Path
from types import ModuleType

from castcore.cli.options import add_options
from castcore.errors import CastcoreError
from castcore.options.tools import NEW_PACK

TEMPLATE = Path(__file__).parent.parent / "pack_template"
HOOK = TEMPLATE / "hooks" / "pre_gen_project.py"


class NewPackError(CastcoreError, ValueError):
    """A pack that cannot be made (bad name, existing directory, rejected answer); the message says which."""


def _hook() -> ModuleType:
    # Compiled by hand, not imported: an import would leave __pycache__ inside the template.
    module = ModuleType("castcore_pack_template_hook")
    exec(compile(HOOK.read_text(encoding="utf-8"), str(HOOK), "exec"), module.__dict__)
    return module


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a pack's distribution name, or None: the template hook's own rule."""
    return _hook().problem({"pack_name": name})


def new_pack(
    name: str, output_dir: str | Path = ".", no_input: bool = False, profiles_only: bool = False
) -> Path:
    """Render the template into ``output_dir/name`` and return that directory.

    ``no_input`` takes every default (module, entry point and device names derived from ``name``);
    otherwise cookiecutter asks for each answer with those defaults. ``profiles_only`` answers the
    template's ``estimators`` question with "no": the pack ships device profiles and no ``ops.py``.
    """
    problem = name_problem(name)
    if problem:
        raise NewPackError(f"{problem}; nothing was written")
    target = Path(output_dir) / name
    if target.exists():
        raise NewPackError(f"{target} already exists; remove it, or choose another NAME or --output-dir")

    # Imported here: cookiecutter (and rich, requests under it) is only needed by this command.
    from cookiecutter.exceptions import (
        CookiecutterException,
        FailedHookException,
        OutputDirExistsException,
    )
    from cookiecutter.main import cookiecutter

    log = logging.getLogger("cookiecutter")
    level = log.level
    # it logs a traceback for a failed hook, burying the hook's one-line message
    log.setLevel(logging.CRITICAL)
    try:
        made = cookiecutter(
            str(TEMPLATE),
            no_input=no_input,
            extra_context={"pack_name": name, **({"estimators": "no"} if profiles_only else {})},
            output_dir=str(output_dir),
        )
    except OutputDirExistsException as exc:  # a pack name changed at the prompt to an existing directory
        raise NewPackError(f"{exc}; remove it, or choose another name or --output-dir") from None
    except FailedHookException:  # the hook has printed which answer and why, on the line above
        raise NewPackError(
            "the template rejected an answer (see the line above); nothing was written"
        ) from None
    except CookiecutterException as exc:
        raise NewPackError(f"could not render the pack template {TEMPLATE}: {exc}") from None
    except EOFError:
        raise NewPackError(
            "no answers to read (stdin is not a terminal); pass --no-input to take the defaults"
        ) from None
    except KeyboardInterrupt:
        raise NewPackError("cancelled; nothing was written") from None
    finally:
        log.setLevel(level)
    made = Path(made)
    # pip byte-compiles the template's .py files where castcore is installed; the copies are junk here.
    for cache in [p for p in made.rglob("__pycache__") if p.is_dir()]:
        shutil.rmtree(cache)
    return made


def _run(args: argparse.Namespace) -> int:
    made = new_pack(args.name, args.output_dir, no_input=args.no_input, profiles_only=args.profiles_only)
    edit = "the device profile in profiles/" + (
        " and the estimators in ops.py" if any(made.glob("*/ops.py")) else ""
    )
    print(
        f"made {made}\n"
        f"next (its README.md says more): edit {edit}, then\n"
        f"  cd {made}\n"
        f"  pip install torch==2.13.0 -e '.[test]'\n"
        f"  castcore audit\n"
        f"  pytest"
    )
    return 0


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``new-pack`` subcommand to the ``castcore`` command's subparsers."""
    parser = subparsers.add_parser(
        "new-pack",
        help="make a new pack (a pip-installable plugin) from castcore's template",
        description="Make DIR/NAME, a pack ready to pip-install: pyproject.toml with the 'castcore' entry point, "
        "an example device profile (TOML, placeholder numbers to replace), one example "
        "register_op_estimator and one register_op_properties (none with --profiles-only), tests, a noxfile and a README saying "
        "what to edit and how to check it with castcore audit. Asks for the names, vendor and author "
        "unless --no-input.",
        epilog="example: castcore new-pack castpack-mynpu --no-input  (module castpack_mynpu, entry point and "
        "device mynpu)",
    )
    add_options(parser, NEW_PACK)
    parser.set_defaults(func=_run)
    return parser
