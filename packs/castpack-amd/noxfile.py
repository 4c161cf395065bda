"""This pack's tests in a fresh venv: `python3 -m nox`.

torch==2.13.0 is installed first on purpose: it is the CPU build, and letting pip pick plain
`torch` (as castcore's dependency) pulls a CUDA build of several GB.
"""

from __future__ import annotations

import os

import nox

nox.options.sessions = ["tests"]

TORCH = "torch==2.13.0"
# Where castcore comes from: the package index by default; CASTCORE_PIP_SPEC=/path/to/castcore
# (a checkout) or any other pip requirement to test against another castcore.
CASTCORE = os.environ.get("CASTCORE_PIP_SPEC", "castcore")


@nox.session
def tests(session: nox.Session) -> None:
    """Install torch, castcore and this pack (not editable), then run tests/."""
    session.install(TORCH)
    session.install(CASTCORE)
    session.install(".[test]")
    session.run("pytest", "tests", *session.posargs)
