"""castcore new-pack: the template renders with the names substituted, bad input is a one-line error, and the
rendered pack pip-installs and wins its example op on its own device."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cookiecutter.exceptions import FailedHookException
from cookiecutter.main import cookiecutter

import castcore
from castcore.cli.main import main
from castcore.tomlfiles import tomllib
from castcore.cli.new_pack import TEMPLATE

HERE = Path(__file__).parents[1]
ROOT = HERE.parent


def cli(*args: str, site: Path | None = None, cwd: Path = HERE) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CASTCORE_")}
    if site:
        env["PYTHONPATH"] = str(site)
    return subprocess.run(
        [sys.executable, "-m", "castcore", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
    )


@pytest.fixture(scope="module", autouse=True)
def cookiecutter_home(tmp_path_factory):
    """cookiecutter keeps replay files in ~; point it (and the CLI runs, which inherit it) at a temp dir."""
    home = tmp_path_factory.mktemp("cookiecutter")
    (home / "config.yaml").write_text(
        f"cookiecutters_dir: {home / 'templates'}\nreplay_dir: {home / 'replay'}\n"
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("COOKIECUTTER_CONFIG", str(home / "config.yaml"))
        yield home


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("rendered")
    done = cli("new-pack", "castpack-acme-x1", "--no-input", "--output-dir", str(out))
    assert done.returncode == 0, done.stderr
    assert str(out / "castpack-acme-x1") in done.stdout
    return out / "castpack-acme-x1"


def test_files_exist_with_the_names_substituted(rendered):
    for name in (
        ".gitignore",
        "README.md",
        "noxfile.py",
        "pyproject.toml",
        "tests/test_pack.py",
        "castpack_acme_x1/__init__.py",
        "castpack_acme_x1/ops.py",
        "castpack_acme_x1/profiles/acme-x1.toml",
    ):
        assert (rendered / name).is_file(), name
    files = [p for p in rendered.rglob("*") if p.is_file()]
    assert not [p for p in files if "{{" in str(p) or "{{" in p.read_text() or "{%" in p.read_text()]
    assert not list(rendered.rglob("__pycache__"))
    pyproject = tomllib.loads((rendered / "pyproject.toml").read_text())
    assert pyproject["project"]["name"] == "castpack-acme-x1"
    assert pyproject["project"]["entry-points"]["castcore"] == {"acme_x1": "castpack_acme_x1"}
    assert "device=DEVICES" in (rendered / "castpack_acme_x1" / "ops.py").read_text()
    assert 'DEVICES = "acme-x1*"' in (rendered / "castpack_acme_x1" / "ops.py").read_text()
    noxfile = (rendered / "noxfile.py").read_text()
    assert 'TORCH = "torch==2.13.0"' in noxfile and noxfile.index("session.install(TORCH)") < noxfile.index(
        "session.install(CASTCORE)"
    )
    readme = (rendered / "README.md").read_text()
    assert "castcore audit --device acme-x1 --op aten::mm" in readme
    assert "castpack-acme-x1 0.1.0 (estimator)" in readme


def test_example_profile_loads_and_its_sources_say_placeholder(rendered):
    profile = castcore.load_device_file(rendered / "castpack_acme_x1" / "profiles" / "acme-x1.toml")
    assert (profile.name, profile.vendor) == ("acme-x1", "Acme")
    assert profile.sources and all("PLACEHOLDER" in source for source in profile.sources.values())


def test_bad_name_is_a_one_line_error_from_the_hook_rules(tmp_path, capsys):
    assert main(["new-pack", "Castpack_Bad", "--no-input", "--output-dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "castcore: error: pack name 'Castpack_Bad' is invalid: use lowercase letters, digits and single hyphens, "
        "starting with a letter (e.g. castpack-mynpu); nothing was written"
    ]
    assert main(["new-pack", "torch", "--no-input", "--output-dir", str(tmp_path)]) == 2
    assert "would shadow" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_pre_gen_hook_rejects_a_bad_answer_when_cookiecutter_runs_it(tmp_path, capfd):
    with pytest.raises(FailedHookException):
        cookiecutter(
            str(TEMPLATE),
            no_input=True,
            output_dir=str(tmp_path),
            extra_context={"pack_name": "castpack-ok", "device_name": "ok npu*"},
        )
    hook_lines = [line for line in capfd.readouterr().err.splitlines() if line.startswith("error:")]
    assert hook_lines == [
        "error: device name 'ok npu*' is invalid: use lowercase letters, digits, '-', '_' and '.' "
        "(no spaces or glob characters; e.g. mynpu-x1); nothing was written"
    ]
    assert list(tmp_path.iterdir()) == []


def test_existing_directory_is_a_clear_error_and_is_left_alone(tmp_path, capsys):
    (tmp_path / "castpack-here").mkdir()
    (tmp_path / "castpack-here" / "mine.txt").write_text("keep me")
    assert main(["new-pack", "castpack-here", "--no-input", "--output-dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"castcore: error: {tmp_path / 'castpack-here'} already exists; remove it, or choose another NAME or --output-dir"
    ]
    assert [p.name for p in (tmp_path / "castpack-here").iterdir()] == ["mine.txt"]


def test_rendered_pack_installs_and_wins_mm_on_its_device_only(rendered, tmp_path):
    site = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--target",
            str(site),
            str(rendered),
        ],
        check=True,
    )
    done = cli(
        "audit",
        "--json",
        "--op",
        "aten::mm",
        "--device-file",
        str(HERE / "data" / "h100-sxm.toml"),
        site=site,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    rows = {row["device"]: row for row in json.loads(done.stdout)}
    winner = rows["acme-x1"]["winner"]
    assert (winner["plugin"], winner["kind"], winner["device"], winner["function"]) == (
        "castpack-acme-x1 0.1.0",
        "estimator",
        "acme-x1*",
        "mm",
    )
    assert rows["acme-x1"]["status"] == "ok"
    assert rows["h100-sxm"]["winner"]["plugin"] == "core"
    packs = {row["name"]: row for row in json.loads(cli("packs", "--json", site=site, cwd=tmp_path).stdout)}
    assert (packs["acme_x1"]["status"], packs["acme_x1"]["claims"]) == ("loaded", 2)


def test_every_template_file_is_package_data():
    """pip install . ships only files the package-data globs match; * and ** skip dotfiles and dot-folders."""
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"][
        "castcore"
    ]
    shipped = {
        Path(f)
        for pattern in patterns
        for f in glob.glob(pattern, root_dir=ROOT / "castcore", recursive=True)
    }
    template = {
        p.relative_to(ROOT / "castcore")
        for p in TEMPLATE.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    assert template and template <= shipped, sorted(map(str, template - shipped))


def test_packs_castpack_template_is_a_relative_symlink_to_the_shipped_template():
    link = ROOT / "packs" / "castpack-template"
    assert link.is_symlink() and not os.path.isabs(os.readlink(link))
    assert link.resolve() == TEMPLATE.resolve()


def test_new_pack_help_names_its_options(capsys):
    with pytest.raises(SystemExit):
        main(["new-pack", "--help"])
    out = capsys.readouterr().out
    assert "--output-dir" in out and "--no-input" in out and "castpack-mynpu" in out


def test_profiles_only_makes_a_pack_without_ops_or_estimator_tests(tmp_path):
    done = cli("new-pack", "castpack-acme-p1", "--no-input", "--profiles-only", "--output-dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    made = tmp_path / "castpack-acme-p1"
    assert "estimators in ops.py" not in done.stdout
    assert not (made / "castpack_acme_p1" / "ops.py").exists()
    assert sorted(p.name for p in (made / "tests").iterdir()) == ["test_pack.py"]
    files = [p for p in made.rglob("*") if p.is_file()]
    assert not [p for p in files if "{{" in p.read_text() or "{%" in p.read_text()]
    assert "import ops" not in (made / "castpack_acme_p1" / "__init__.py").read_text()
    assert "claims no op" in (made / "tests" / "test_pack.py").read_text()
    assert "| `castpack_acme_p1/ops.py` |" not in (made / "README.md").read_text()
    pyproject = tomllib.loads((made / "pyproject.toml").read_text())
    assert pyproject["project"]["entry-points"]["castcore.profiles"] == {
        "acme_p1": "castpack_acme_p1.profiles"
    }
    profile = castcore.load_device_file(made / "castpack_acme_p1" / "profiles" / "acme-p1.toml")
    assert profile.name == "acme-p1"
