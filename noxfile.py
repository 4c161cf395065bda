"""Test sessions, each in its own venv. `python3 -m nox` runs the default ones; `nox -l` lists all.

torch==2.13.0 is installed first everywhere: it is a CPU build on this machine's disk, and
asking for plain torch would pull a CUDA build of several GB.
"""

from __future__ import annotations

import tempfile

import nox

nox.options.sessions = [
    "lint",
    "tests",
    "oldest",
    "ascend",
    "collectives",
    "nvidia",
    "amd",
    "template",
    "docs",
    "kernels",
    "browser",
]
nox.options.error_on_missing_interpreters = True

TORCH = "torch==2.13.0"
# The core's tests run on a worker per core (pytest-xdist), up to four: on CI's two cores that halves the longest
# session. Each worker has its own cache and config folders (tests/conftest.py) and starts its own local Ray.
PARALLEL = ["-n", "auto", "--maxprocesses", "4"]
# What `ruff format` keeps formatted (pyproject.toml sets the line length); packs and examples are left as written.
FORMATTED = ["castcore", "tests", "tests_browser", "bench", "noxfile.py"]
# The parts of castcore mypy checks in the lint session (the rest is read for its types).
TYPED = [
    "castcore/workload",
    "castcore/serving",
    "castcore/simulation",
    "castcore/session.py",
    "castcore/options",
    "castcore/ops",
    "castcore/hf",
    "castcore/plugins",
    "castcore/tomlfiles.py",
    "castcore/errors.py",
]


def _lowest(package: str) -> str:
    """The lowest version of ``package`` pyproject.toml admits (its ``>=`` bound)."""
    import tomllib

    from packaging.requirements import Requirement

    with open("pyproject.toml", "rb") as file:
        requirements = [Requirement(line) for line in tomllib.load(file)["project"]["dependencies"]]
    spec = next(r.specifier for r in requirements if r.name == package)
    return next(s.version for s in spec if s.operator == ">=")


def _say_versions(session: nox.Session) -> None:
    session.run(
        "python",
        "-c",
        "import importlib.metadata as m; print('tested on torch', m.version('torch'), "
        "'and transformers', m.version('transformers'))",
    )


def _install_core(session: nox.Session) -> None:
    session.install(TORCH)
    session.install(".[test]")  # a fresh venv: the newest transformers the index serves, as a user gets it
    _say_versions(session)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff (undefined names, unused imports, syntax errors, and the formatting), the import layers
    (import-linter), and mypy over the examples, which use both public faces (castcore and castcore.pack), and over
    the typed parts of castcore (TYPED)."""
    _install_core(session)
    session.install("ruff", "import-linter", "mypy")
    session.run(
        "ruff", "check", "--select", "F,E9", "castcore", "packs", "tests", "bench", "examples", "noxfile.py"
    )
    session.run("ruff", "format", "--check", *FORMATTED)
    session.run("lint-imports")
    # Silent: the modules named are checked, the rest read for their types. TYPED grows as modules are typed.
    session.run("mypy", "--follow-imports=silent", "examples", *TYPED)


@nox.session
def tests(session: nox.Session) -> None:
    """The core's tests, with no pack installed (tests install throwaway packs themselves)."""
    _install_core(session)
    # The sweep's Ray backend and Parquet files are tested on a local Ray instance; the docs build hook's tests
    # raise mkdocs' own error.
    session.install(".[ray,docs]")
    session.run("pytest", *PARALLEL, "tests", *session.posargs)


@nox.session
def oldest(session: nox.Session) -> None:
    """The tests that build transformers models (``-m models``) against the oldest transformers and torch
    pyproject.toml admits; the tests session runs everything against the newest."""
    from packaging.version import Version

    if Version(_lowest("torch")) != Version(TORCH.partition("==")[2]):  # the only CPU build installable here
        session.error(f"pyproject admits torch from {_lowest('torch')}, but only {TORCH} can be tested here")
    session.install(TORCH)
    session.install(".[test]", f"transformers=={_lowest('transformers')}")
    _say_versions(session)
    session.run("pytest", *PARALLEL, "-m", "models", "tests", *session.posargs)


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
def nvidia(session: nox.Session) -> None:
    """castpack-nvidia's own tests, in a venv with only castcore and that pack."""
    _install_core(session)
    session.install("packs/castpack-nvidia")
    session.run("pytest", "packs/castpack-nvidia/tests", *session.posargs)


@nox.session
def amd(session: nox.Session) -> None:
    """castpack-amd's own tests, in a venv with castcore, that pack and castpack-collectives (one test prices the
    Infinity Fabric's all-reduce against RCCL's measured times)."""
    _install_core(session)
    session.install("packs/castpack-amd", "packs/castpack-collectives")
    session.run("pytest", "packs/castpack-amd/tests", *session.posargs)


@nox.session
def demo(session: nox.Session) -> None:
    """The README's first command in a fresh venv: all packs and the extras its features need, then
    `castcore estimate`, and its page and chart (--html, --plot) to show those work there too."""
    session.install(TORCH)
    session.install(
        ".[html,plot]",
        "packs/castpack-ascend",
        "packs/castpack-collectives",
        "packs/castpack-nvidia",
        "packs/castpack-amd",
    )
    session.run("castcore", "estimate")
    with tempfile.TemporaryDirectory() as tmp:
        session.run("castcore", "estimate", "--html", f"{tmp}/estimate.html", "--plot", f"{tmp}/roofline.png")


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
        session.run(
            "castcore",
            "new-pack",
            "castpack-demo",
            "--no-input",
            "--output-dir",
            str(tmp),
            env={"COOKIECUTTER_CONFIG": str(tmp / "cookiecutter.yaml")},
        )
        pack = tmp / "castpack-demo"
        session.install(f"{pack}[test]")
        checker = str(Path("tests/template_check.py").resolve())
        with session.chdir(pack):
            session.run("pytest", "-p", "no:cacheprovider", "tests", *session.posargs)
            session.run("python", checker, str(pack), "castpack-demo", "demo", "demo")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@nox.session
def docs(session: nox.Session) -> None:
    """The documentation site (docs/, mkdocs.yml), built in strict mode: a broken link or anchor, a page left out of
    the navigation, or a castcore option a page names that no command has fails it. The command reference is made
    from castcore's own parsers while the site builds (docs/hooks/reference.py), so castcore is installed, torch
    first as everywhere. The site goes to the session's temporary folder."""
    from pathlib import Path

    session.install(TORCH)
    session.install(".[docs]")
    site = Path(session.create_tmp()) / "site"
    session.run("mkdocs", "build", "--strict", "--site-dir", str(site), env={"NO_MKDOCS_2_WARNING": "1"})


@nox.session
def browser(session: nox.Session) -> None:
    """The HTML pages (--html, castcore report) opened in a real headless Chromium with the network cut off
    (tests_browser/): charts drawn, tables sorted and filtered, no console error, no request; the screenshots go to
    docs/images/. The browser is the system's (Debian's chromium, installed here when missing), driven by
    Playwright's Python package through its executable path: Playwright's own browser downloads are never used."""
    import os

    if not os.path.exists("/usr/bin/chromium"):
        session.run("apt-get", "update", external=True)
        session.run("apt-get", "install", "-y", "chromium", external=True)
    session.install(TORCH)
    session.install(".[html,test]", "playwright")
    session.run("pytest", "-p", "no:cacheprovider", "tests_browser", *session.posargs)


@nox.session
def bench(session: nox.Session) -> None:
    """Speed and memory figures (not tests): writes bench/results/*.json and prints tables, then the peer
    comparison (see the peers session). The other scripts choose their packs, so the ones installed here for
    bench/peers.py do not change their figures."""
    _install_core(session)
    # As in the peers session: genz-llm needs no torch; llm-analysis pins transformers<5, which castcore cannot
    # use, for an import it makes only to fetch configs from the hub, so it goes in without its dependencies.
    session.install("packs/castpack-collectives", "genz-llm==0.0.16", "fire>=0.5,<0.6")
    session.install("--no-deps", "llm-analysis==0.2.2")
    session.run("python", "bench/scale.py", "--out", "bench/results/scale.json", *session.posargs)
    session.run("python", "bench/resolution.py", "--out", "bench/results/resolution.json")
    session.run("python", "bench/stock.py", "--out", "bench/results/stock.json")
    session.run("python", "bench/startup.py", "--out", "bench/results/startup.json")
    session.run("python", "bench/simulate_engine.py", "--out", "bench/results/simulate_engine.md")
    session.run("python", "bench/simulate_steps.py", "--out", "bench/results/simulate_steps.md")
    session.run("python", "bench/simulate_speed.py", "--out", "bench/results/simulate_speed.md")
    session.run("python", "bench/simulate_models_speed.py", "--out", "bench/results/simulate_models_speed.md")
    session.run("python", "bench/plan_speed.py", "--out", "bench/results/plan_speed.json")
    session.run("python", "bench/models_speed.py", "--out", "bench/results/models_speed.md")
    session.run("python", "bench/peers.py", "--out", "bench/results/peers.json")
    session.install(".[ray]")  # bench/sweep.py's Ray runs
    session.run("python", "bench/sweep.py", "--out", "bench/results/sweep.json")


@nox.session
def peers(session: nox.Session) -> None:
    """castcore against GenZ (genz-llm) and llm-analysis on the same scenarios and H100 numbers: writes
    bench/results/peers.json and peers.md. Part of bench; this runs it alone. ``nox -s peers -- --quick`` runs a
    smoke test instead and writes to the temp directory.

    genz-llm needs no torch; llm-analysis pins transformers<5, which castcore cannot use, for an import it makes
    only to fetch configs from the hub, so it goes in without its dependencies (fire is the one it needs)."""
    _install_core(session)
    session.install("packs/castpack-collectives", "genz-llm==0.0.16", "fire>=0.5,<0.6")
    session.install("--no-deps", "llm-analysis==0.2.2")
    session.run("python", "bench/peers.py", *(session.posargs or ["--out", "bench/results/peers.json"]))


@nox.session
def fidelity(session: nox.Session) -> None:
    """Fidelity report (not a test): castcore against published measurements (bench/fidelity/published.json,
    split into the points profile constants were fitted to and the held-out rest) and against this machine,
    calibrated on some shapes and timed on others. Writes bench/results/fidelity.json and fidelity.md; a few
    minutes (the local part alone under 2). Not a default session.

    The points' devices are castpack-nvidia's and castpack-ascend's profiles; castpack-collectives prices the
    collectives."""
    _install_core(session)
    session.install("packs/castpack-nvidia", "packs/castpack-ascend", "packs/castpack-collectives")
    session.run("python", "bench/fidelity/run.py", "--out", "bench/results/fidelity.json", *session.posargs)


@nox.session
def kernels(session: nox.Session) -> None:
    """castcore's kernel estimates against NVIDIA's measured vLLM and SGLang kernel tables in the
    aiconfigurator-core wheel (GEMM, fused MoE, attention, DeepSeek's latent-attention module, engine all-reduce,
    DeepEP), fitted and held-out points apart. By default the CI check: fails when a family's held-out median
    |error| rose by more than two points against bench/results/aic_tables.json, writing nothing (a few minutes).
    ``nox -s kernels -- --write`` rewrites bench/results/aic_tables.md and .json. The wheel is read here, never
    shipped or needed by castcore; its TensorRT-LLM and NCCL tables are not read."""
    _install_core(session)
    session.install("packs/castpack-nvidia", "packs/castpack-collectives", "aiconfigurator-core==0.12.0")
    write = "--write" in session.posargs
    rest = [a for a in session.posargs if a != "--write"]
    session.run("python", "bench/kernels/aic_tables.py", *([] if write else ["--check"]), *rest)


def _with_aiconfigurator(session: nox.Session) -> str:
    """castcore, castpack-nvidia and castpack-collectives, then AIConfigurator under a constraints file that pins
    torch to TORCH (neither it nor its data wheel names one): the constraints file, for what else goes in."""
    from pathlib import Path

    _install_core(session)
    session.install("packs/castpack-nvidia", "packs/castpack-collectives")
    constraints = Path(session.create_tmp()) / "torch-constraint.txt"
    constraints.write_text(f"{TORCH}\n")
    session.install("-c", str(constraints), "aiconfigurator==0.12.0", "aiconfigurator-core==0.12.0")
    return str(constraints)


@nox.session
def peers_serving(session: nox.Session) -> None:
    """castcore simulate against two peer serving simulators, Vidur (vidur) and AIConfigurator (aiconfigurator with
    its data wheel aiconfigurator-core), on the same traffic scenarios: writes bench/results/peers_serving.json and
    .md. A few minutes on 2 cores; not a default session and not part of bench. ``nox -s peers_serving -- --quick``
    runs a smoke test instead and writes to the temp directory.

    The peers go in under a constraints file that pins torch to TORCH, so that nothing they ask for can pull another
    torch (neither names one). aiconfigurator's requirements (numpy 2, pandas, pydantic 2, pyarrow, matplotlib,
    bokeh, plotly, ...) sit beside castcore's. vidur goes in without its dependencies: besides what its simulator
    imports (scikit-learn, wandb, plotly_express, ddsketch, fasteners; numpy, pandas and huggingface_hub are here
    already) they are streamlit, kaleido, seaborn, paretoset and ninja, for its config optimizer's dashboard, its
    plots and its profiling, which this comparison does not run. Vidur would fetch its profiles from Hugging Face at
    run time; the bench runs it offline from local copies of those datasets under bench/peers_data/vidur (its
    README.md), and where there are none the table says so."""
    constraints = _with_aiconfigurator(session)
    session.install("--no-deps", "vidur==0.0.26")
    session.install("-c", constraints, "scikit-learn", "wandb", "plotly_express", "ddsketch", "fasteners")
    session.run(
        "python",
        "bench/peers_serving.py",
        *(session.posargs or ["--out", "bench/results/peers_serving.json"]),
    )


@nox.session
def peers_static(session: nox.Session) -> None:
    """castcore serve against AIConfigurator's static mode (aiconfigurator with its data wheel aiconfigurator-core,
    SGLang backend) on static batches of MoE and dense models: writes bench/results/peers_static.json and .md. A few
    minutes on 2 cores; not a default session and not part of bench. ``nox -s peers_static -- --quick`` runs a
    smoke test instead and writes to the temp directory. AIConfigurator goes in under a constraints file pinning
    torch to TORCH, as in peers_serving."""
    _with_aiconfigurator(session)
    session.run(
        "python",
        "bench/peers_static.py",
        *(session.posargs or ["--out", "bench/results/peers_static.json"]),
    )


@nox.session
def peers_disagg_spec(session: nox.Session) -> None:
    """castcore simulate's disaggregated prefill/decode, speculative decoding and prefix caching against
    AIConfigurator (aiconfigurator with its data wheel aiconfigurator-core, vLLM backend) on the same scenarios:
    writes bench/results/peers_disagg_spec.json and .md. About a minute on 2 cores; not a default session and not
    part of bench. ``nox -s peers_disagg_spec -- --quick`` runs a smoke test instead and writes to the temp
    directory. AIConfigurator goes in under a constraints file pinning torch to TORCH, as in peers_serving."""
    _with_aiconfigurator(session)
    session.run(
        "python",
        "bench/peers_disagg_spec.py",
        *(session.posargs or ["--out", "bench/results/peers_disagg_spec.json"]),
    )
