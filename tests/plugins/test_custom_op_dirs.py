"""The custom-op directories castcore loads unasked: ``custom_op/`` in the project root and the per-user one
under $XDG_CONFIG_HOME/castcore, their helpers (``_helpers.py``, sibling modules) and how to turn them off."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import castcore
from tests.plugin_files import mm_answer
from castcore.plugins.config import user_config_dir

HERE = Path(__file__).parents[1]
DEVICE_FILE = HERE / "data" / "h100-sxm.toml"


def mm_file(seconds: float) -> str:
    return f"""
import torch
import castcore

@castcore.register_op_estimator(torch.ops.aten.mm.default)
def mm(invoke, device):
    return {seconds}
"""


@pytest.fixture(autouse=True)
def _env(monkeypatch, tmp_path):
    for var in (
        "CASTCORE_CUSTOM_OP_PATH",
        "CASTCORE_LOAD_PACKS",
        "CASTCORE_DISABLE_PACKS",
        "CASTCORE_STRICT",
    ):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))


def project(tmp_path: Path, marker: str = "castcore.toml", **files: str) -> Path:
    """A project folder (``marker`` makes it the root) with ``custom_op/<name>.py`` for each file."""
    root = tmp_path / "project"
    (root / "custom_op").mkdir(parents=True)
    (root / marker).write_text("")
    for name, text in files.items():
        (root / "custom_op" / f"{name}.py").write_text(text)
    return root


def user_dir(tmp_path: Path, **files: str) -> Path:
    folder = tmp_path / "config" / "castcore" / "custom_op"
    folder.mkdir(parents=True)
    for name, text in files.items():
        (folder / f"{name}.py").write_text(text)
    return folder


def new_session(**overrides) -> castcore.Session:
    return castcore.Session(load_packs=[], device_files=[DEVICE_FILE], **overrides)


def test_the_projects_custom_op_is_loaded_without_a_flag(tmp_path, monkeypatch):
    root = project(tmp_path, mm=mm_file(2.0))
    monkeypatch.chdir(root)
    assert mm_answer(new_session()) == (f"file:{root / 'custom_op' / 'mm.py'} (estimator)", 2.0)


def test_the_project_root_is_found_from_a_subfolder_by_its_pyproject(tmp_path, monkeypatch):
    root = project(tmp_path, marker="pyproject.toml", mm=mm_file(2.0))
    (root / "src" / "deep").mkdir(parents=True)
    monkeypatch.chdir(root / "src" / "deep")
    assert mm_answer(new_session())[1] == 2.0


def test_the_per_user_directory_is_loaded_and_the_project_wins_over_it(tmp_path, monkeypatch):
    mine = user_dir(tmp_path, mm=mm_file(3.0))
    monkeypatch.chdir(tmp_path)
    assert mm_answer(new_session()) == (f"file:{mine / 'mm.py'} (estimator)", 3.0)
    root = project(tmp_path, mm=mm_file(2.0))
    monkeypatch.chdir(root)
    assert mm_answer(new_session())[1] == 2.0  # the project's file is asked first
    # A directory named by hand wins over both.
    named = tmp_path / "named"
    named.mkdir()
    (named / "mm.py").write_text(mm_file(1.0))
    assert mm_answer(new_session(custom_op_dirs=[named]))[1] == 1.0


def test_the_per_user_directory_is_under_dot_config_without_xdg_config_home(tmp_path, monkeypatch):
    monkeypatch.delenv("XDG_CONFIG_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert user_config_dir(os.environ) == tmp_path / ".config" / "castcore"


def test_the_test_run_never_reads_the_users_own_config_dir():
    # conftest points XDG_CONFIG_HOME at a folder of the run's own for every test and subprocess.
    assert user_config_dir(os.environ) != Path.home() / ".config" / "castcore"


def test_config_and_session_option_turn_the_default_directories_off(tmp_path, monkeypatch):
    user_dir(tmp_path, mm=mm_file(3.0))
    root = project(tmp_path, mm=mm_file(2.0))
    monkeypatch.chdir(root)
    assert mm_answer(new_session(default_custom_op_dirs=False))[0] == "core (properties)"
    (root / "castcore.toml").write_text("default_custom_op_dirs = false\n")
    assert mm_answer(new_session())[0] == "core (properties)"
    (root / "castcore.toml").write_text('default_custom_op_dirs = "no"\n')
    with pytest.raises(castcore.ConfigError, match="default_custom_op_dirs"):
        new_session()


def cli(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CASTCORE_")}
    return subprocess.run(
        [sys.executable, "-m", "castcore", *args, "--no-packs", "--device-file", str(DEVICE_FILE)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
    )


def test_castcore_packs_lists_the_default_directories_their_files_and_the_flag_turns_them_off(tmp_path):
    mine = user_dir(tmp_path, mm=mm_file(3.0))
    root = project(tmp_path, mm=mm_file(2.0), _helpers="X = 1\n")
    done = cli(root, "packs")
    assert done.returncode == 0, done.stderr
    assert f"{root / 'custom_op'} (project default)" in done.stdout
    assert f"{mine} (user default)" in done.stdout
    rows = {row["name"]: row for row in json.loads(cli(root, "packs", "--json").stdout)}
    assert rows[str(root / "custom_op" / "mm.py")]["status"] == "loaded"
    assert rows[str(mine / "mm.py")]["status"] == "loaded"
    # A file that is not loaded says why.
    assert rows[str(root / "custom_op" / "_helpers.py")]["status"].startswith(
        "skipped: its name starts with _"
    )

    off = cli(root, "packs", "--no-default-custom-op-dirs")
    assert off.returncode == 0, off.stderr
    assert "mm.py" not in off.stdout
    assert f"{mine} (user default, turned off)" in off.stdout


HELPER_USER = """
import torch
import castcore
from _helpers import SECONDS
import mylib

@castcore.register_op_estimator(torch.ops.aten.mm.default)
def mm(invoke, device):
    return SECONDS * mylib.FACTOR
"""


def test_a_file_imports_its_helpers_and_sibling_modules(tmp_path):
    ops = tmp_path / "ops"
    ops.mkdir()
    (ops / "_helpers.py").write_text("SECONDS = 4.0\n")
    (ops / "mylib.py").write_text("FACTOR = 2\n")
    (ops / "a_mm.py").write_text(HELPER_USER)
    path_before = list(sys.path)
    session = new_session(custom_op_dirs=[ops])
    assert session.warnings == []
    assert mm_answer(session) == (f"file:{ops / 'a_mm.py'} (estimator)", 8.0)
    assert sys.path == path_before  # the directory is on sys.path only while its files load
    assert "_helpers" not in sys.modules and "mylib" not in sys.modules


def test_two_directories_each_import_their_own_helper_of_one_name(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    for folder, seconds, op in ((first, 5.0, "mm"), (second, 6.0, "relu")):
        folder.mkdir()
        (folder / "_helpers.py").write_text(f"SECONDS = {seconds}\n")
        (folder / "ops.py").write_text(f"""
import torch
import castcore
from _helpers import SECONDS

@castcore.register_op_estimator(torch.ops.aten.{op}.default)
def answer(invoke, device):
    return SECONDS
""")
    session = new_session(custom_op_dirs=[first, second])
    report = session.estimate(
        lambda a, b: torch.mm(a, b).relu(),
        torch.empty(8, 4, device="meta"),
        torch.empty(4, 2, device="meta"),
        device="h100-sxm",
    )
    assert {r.invoke.name: r.estimate.time_s for r in report.records} == {"aten::mm": 5.0, "aten::relu": 6.0}


HELPER_WITH_CLAIM = """
import torch
import castcore

@castcore.register_op_estimator(torch.ops.aten.relu.default)
def relu(invoke, device):
    return 7.0
"""


def test_a_claim_made_in_a_helper_belongs_to_the_file_that_imports_it(tmp_path):
    ops = tmp_path / "ops"
    ops.mkdir()
    (ops / "_claims.py").write_text(HELPER_WITH_CLAIM)
    (ops / "uses.py").write_text("import _claims  # noqa: F401\n")
    session = new_session(custom_op_dirs=[ops])
    report = session.estimate(torch.relu, torch.empty(4, device="meta"), device="h100-sxm")
    assert str(report.records[0].estimate.source) == f"file:{ops / 'uses.py'} (estimator)"
    assert not [i for i in session.plugins.infos if i.kind == "script" and i.name == "_claims"]
    assert not [i for i in new_session().plugins.infos if i.name == "_claims"]  # nor a later session's


def _world_writable(path: Path) -> None:
    path.chmod(path.stat().st_mode | stat.S_IWOTH)
    if not path.stat().st_mode & stat.S_IWOTH:
        pytest.skip(f"chmod o+w has no effect on {path} here")


def test_a_world_writable_default_directory_is_refused_as_a_named_one_is(tmp_path, monkeypatch):
    root = project(tmp_path, mm=mm_file(2.0))
    _world_writable(root / "custom_op")
    monkeypatch.chdir(root)
    session = new_session()
    info = next(i for i in session.plugins.infos if i.origin == str(root / "custom_op" / "mm.py"))
    assert info.status == "failed" and "writable by every user" in info.error
    assert mm_answer(session)[0] == "core (properties)"


def test_a_world_writable_helper_keeps_the_directory_off_sys_path(tmp_path):
    ops = tmp_path / "ops"
    ops.mkdir()
    (ops / "_helpers.py").write_text("SECONDS = 4.0\nFACTOR = 1\n")
    (ops / "mylib.py").write_text("FACTOR = 2\n")
    (ops / "a_mm.py").write_text(HELPER_USER)
    _world_writable(ops / "_helpers.py")
    session = new_session(custom_op_dirs=[ops])
    infos = {Path(i.origin).name: i for i in session.plugins.infos if i.kind == "file"}
    assert infos["_helpers.py"].status == "failed" and "writable by every user" in infos["_helpers.py"].error
    assert infos["a_mm.py"].status == "failed" and "is not importable" in infos["a_mm.py"].error
    assert mm_answer(session)[0] == "core (properties)"
