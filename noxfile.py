"""Test sessions, each in its own venv. `python3 -m nox` runs the default ones; `nox -l` lists all.

torch==2.13.0 is installed first everywhere: it is a CPU build on this machine's disk, and
asking for plain torch would pull a CUDA build of several GB.
"""

from __future__ import annotations

import nox

nox.options.sessions = ["tests", "ascend", "collectives"]
nox.options.error_on_missing_interpreters = True

TORCH = "torch==2.13.0"


def _install_core(session: nox.Session) -> None:
    session.install(TORCH)
    session.install(".[test]")


@nox.session
def tests(session: nox.Session) -> None:
    """The core's tests, with no pack installed (tests install throwaway packs themselves)."""
    _install_core(session)
    session.run("pytest", "tests", *session.posargs)


@nox.session
def ascend(session: nox.Session) -> None:
    """castpack-ascend's own tests, in a venv with only castcore and that pack."""
    _install_core(session)
    session.install("packs/castpack-ascend")
    session.run("pytest", "packs/castpack-ascend/tests", *session.posargs)


@nox.session
def collectives(session: nox.Session) -> None:
    """castpack-collectives' own tests, in a venv with only castcore and that pack."""
    _install_core(session)
    session.install("packs/castpack-collectives")
    session.run("pytest", "packs/castpack-collectives/tests", *session.posargs)


@nox.session
def demo(session: nox.Session) -> None:
    """The README's first command in a fresh venv: all packs, then `castcore estimate`."""
    session.install(TORCH)
    session.install(".", "packs/castpack-ascend", "packs/castpack-collectives")
    session.run("castcore", "estimate")
