"""Test sessions, each in its own venv. `python3 -m nox` runs the default ones; `nox -l` lists all.

torch==2.13.0 is installed first everywhere: it is a CPU build on this machine's disk, and
asking for plain torch would pull a CUDA build of several GB.
"""

from __future__ import annotations

import nox

nox.options.sessions = ["lint", "tests", "ascend", "collectives", "template"]
nox.options.error_on_missing_interpreters = True

TORCH = "torch==2.13.0"


def _install_core(session: nox.Session) -> None:
    session.install(TORCH)
    session.install(".[test]")


@nox.session
def lint(session: nox.Session) -> None:
    """ruff (undefined names, unused imports, syntax errors), the import layers (import-linter), and mypy
    over the examples, which use both public faces (castcore and castcore.pack)."""
    _install_core(session)
    session.install("ruff", "import-linter", "mypy")
    session.run("ruff", "check", "--select", "F,E9", "--exclude", "castcore/pack_template",
                "castcore", "packs", "tests", "bench", "examples", "noxfile.py")
    session.run("lint-imports")
    # Silent: castcore's own modules are read for their types, and only the examples are checked.
    session.run("mypy", "--follow-imports=silent", "examples")


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


@nox.session
def template(session: nox.Session) -> None:
    """castcore new-pack from a non-editable install: render, install the pack, run its tests, see it win."""
    import shutil
    import tempfile
    from pathlib import Path

    session.install(TORCH)
    session.install(".")
    # Outside the checkout, so neither pytest nor castcore picks up this repository's pyproject.toml.
    tmp = Path(tempfile.mkdtemp(prefix="castcore-template-"))
    # cookiecutter keeps a replay of every rendering in ~ unless its config says otherwise.
    (tmp / "cookiecutter.yaml").write_text(f"replay_dir: {tmp / 'replay'}\n")
    try:
        session.run("castcore", "new-pack", "castpack-demo", "--no-input", "--output-dir", str(tmp),
                    env={"COOKIECUTTER_CONFIG": str(tmp / "cookiecutter.yaml")})
        pack = tmp / "castpack-demo"
        session.install(f"{pack}[test]")
        checker = str(Path("tests/template_check.py").resolve())
        with session.chdir(pack):
            session.run("pytest", "-p", "no:cacheprovider", "tests", *session.posargs)
            session.run("python", checker, str(pack), "castpack-demo", "demo", "demo")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@nox.session
def bench(session: nox.Session) -> None:
    """Speed and memory figures (not tests): writes bench/results/*.json and prints tables."""
    _install_core(session)
    session.run("python", "bench/scale.py", "--out", "bench/results/scale.json", *session.posargs)
    session.run("python", "bench/resolution.py", "--out", "bench/results/resolution.json")
    session.run("python", "bench/stock.py", "--out", "bench/results/stock.json")
    session.run("python", "bench/serve.py", "--out", "bench/results/serve.json")


@nox.session
def fidelity(session: nox.Session) -> None:
    """Fidelity report (not a test): estimates vs timings on this machine and vs published figures.

    Writes bench/results/fidelity.json and fidelity.md; about half a minute. Not a default session.
    """
    _install_core(session)
    session.install("packs/castpack-ascend")  # the Ascend 910B2 published figure is estimated with it
    session.run("python", "bench/fidelity.py", "--out", "bench/results/fidelity.json", *session.posargs)
