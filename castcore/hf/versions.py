"""The torch and transformers releases castcore is tested on, and what a failure inside transformers becomes.

``TESTED`` is the range the test suite runs on: ``nox -s tests`` runs the newest, ``nox -s oldest`` the lowest
bound pyproject admits. Relies on no transformers module: it looks for the imported package in ``sys.modules``.
"""

from __future__ import annotations

import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from castcore.errors import ModelError

# The releases the test suite runs on: from the lowest pyproject admits to the newest checked, any patch release.
TESTED = {"transformers": ("5.5.0", "5.24"), "torch": ("2.13.0", "2.13")}


def installed(package: str) -> str | None:
    try:
        return version(package)
    except PackageNotFoundError:
        return None


def release(found: str) -> tuple[int, ...]:
    """A version's (major, minor), (0,) when it is not one."""
    from packaging.version import InvalidVersion, Version

    try:
        return Version(found).release[:2]
    except InvalidVersion:
        return (0,)


def older_than_tested(package: str) -> str | None:
    """The installed version when it is older than the newest the tests run on (a newer one may read what it
    refuses), else None."""
    found = installed(package) or "0"
    return found if release(found) < release(TESTED[package][1]) else None


def tested_range(package: str) -> str:
    low, high = TESTED[package]
    return f"{low} to {high}.x"


def in_tested_range(package: str, found: str) -> bool:
    from packaging.version import InvalidVersion, Version

    low, high = TESTED[package]
    try:
        release = Version(found).release
    except InvalidVersion:
        return False
    return Version(low).release <= release and release[:2] <= Version(high).release[:2]


def version_warnings() -> list[str]:
    """One line for each of torch and transformers installed at a version the test suite does not run on."""
    lines = []
    for package in TESTED:
        found = installed(package)
        if found is not None and not in_tested_range(package, found):
            low, high = TESTED[package]
            major, minor = (int(part) for part in high.split("."))
            lines.append(
                f"{package} {found} is installed; castcore is tested on {package} {tested_range(package)}: "
                f"its estimates may fail or differ (pip install '{package}>={low},<{major}.{minor + 1}')"
            )
    return lines


def raised_inside(exc: BaseException) -> bool:
    """Whether ``exc`` was raised by transformers' own code or by castcore's touches of it here: the innermost
    frame is in one of them (an operator failing under a transformers model is torch's, not this)."""
    module = sys.modules.get("transformers")
    home = module.__file__ if module is not None else None
    if not home:
        return False
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    where = Path(tb.tb_frame.f_code.co_filename) if tb is not None else None
    return where is not None and (
        where.is_relative_to(Path(home).parent) or where.is_relative_to(Path(__file__).parent)
    )


def internals_error(exc: BaseException, model_class: str) -> ModelError:
    """The one line a failure inside transformers becomes: the model class, the installed and tested versions."""
    return ModelError(
        f"{model_class} failed inside transformers {installed('transformers')} ({one_line(exc)}); "
        f"castcore is tested on transformers {tested_range('transformers')}: install one of those, "
        "or run with --debug for the traceback"
    )


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}{'...' if len(text) > 300 else ''}"
