"""What a careless or hostile plugin did to castcore, and what castcore does now: a user's file overrides packs
without a CONFLICT; sys.exit() at import, symlinks into world-writable folders, packs for another castcore or
plugin API, slow imports, a plugin claiming one op twice, device globs matching nothing, and claims declared
after the default session was made.

Packs are installed as pip leaves them (a package and its ``.dist-info`` with METADATA and entry_points.txt)
into a folder on PYTHONPATH, and probed through ``python -m castcore``; custom-op files load in-process.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import castcore
from tests.plugin_files import info_of, mm_answer, ops_dir

HERE = Path(__file__).parents[1]
DEVICE_FILE = HERE / "data" / "h100-sxm.toml"


@pytest.fixture(autouse=True)
def _no_castcore_env(monkeypatch):
    for var in (
        "CASTCORE_CUSTOM_OP_PATH",
        "CASTCORE_LOAD_PACKS",
        "CASTCORE_DISABLE_PACKS",
        "CASTCORE_STRICT",
    ):
        monkeypatch.delenv(var, raising=False)


def install_pack(site: Path, dist: str, source: str, requires: tuple[str, ...] = ()) -> str:
    """Install a one-module pack into ``site`` as pip would; returns its entry-point name."""
    module = dist.replace("-", "_")
    (site / module).mkdir(parents=True)
    (site / module / "__init__.py").write_text(source)
    meta = site / f"{module}-1.0.0.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0.0\n"
        + "".join(f"Requires-Dist: {r}\n" for r in requires)
    )
    entry = dist.removeprefix("castpack-")
    (meta / "entry_points.txt").write_text(f"[castcore]\n{entry} = {module}\n")
    return entry


# A clock only the packs move, so that an import's measured time is what the pack says and not the machine's speed:
# a pack's ``import stopped_clock; stopped_clock.now += 2.5`` is an import of exactly 2.5 s, every other one of 0 s.
STOPPED_CLOCK = "now = 0.0\n\n\ndef clock():\n    return now\n"
WITH_STOPPED_CLOCK = (
    "import sys, runpy, stopped_clock, castcore.plugins.registration as r\n"
    "r.clock = stopped_clock.clock\n"
    "sys.argv[0] = 'castcore'\n"
    "runpy.run_module('castcore', run_name='__main__', alter_sys=True)\n"
)


def cli(
    site: Path | None, packs: list[str], *args: str, cwd: Path = HERE, stopped_clock: bool = False
) -> subprocess.CompletedProcess:
    """``python -m castcore ARGS`` with only ``packs`` loaded; with ``stopped_clock``, imports are timed by
    STOPPED_CLOCK (written into ``site``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CASTCORE_")}
    env["CASTCORE_LOAD_PACKS"] = ",".join(packs)
    if site:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
    launch = ["-m", "castcore"]
    if stopped_clock:
        assert site, "the stopped clock lives in the site folder"
        (site / "stopped_clock.py").write_text(STOPPED_CLOCK)
        launch = ["-c", WITH_STOPPED_CLOCK]
    return subprocess.run(
        [sys.executable, *launch, *args, "--device-file", str(DEVICE_FILE)],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
    )


def session_with(folder: Path, **overrides) -> castcore.Session:
    return castcore.Session(
        castcore.Config(), load_packs=[], device_files=[DEVICE_FILE], custom_op_dirs=[folder], **overrides
    )


MM = """
import torch
import castcore

@castcore.register_op_estimator(torch.ops.aten.mm.default)
def mm(invoke, device):
    return {seconds}
"""


# --- override: a user's file wins without a CONFLICT ---------------------------------------------------------


def test_a_users_file_over_a_pack_is_override_user_and_strict_passes(tmp_path):
    site = tmp_path / "site"
    first = install_pack(site, "castpack-mm-one", MM.format(seconds=1.0), requires=("castcore>=0.1",))
    second = install_pack(site, "castpack-mm-two", MM.format(seconds=2.0))
    ops = ops_dir(tmp_path, mm=MM.format(seconds=3.0))
    done = cli(site, [first], "audit", "--strict", "--json", "--op", "aten::mm", "--custom-op-dir", str(ops))
    assert done.returncode == 0, done.stderr
    (row,) = json.loads(done.stdout)
    assert row["status"] == "override (user)"
    assert row["winner"]["plugin"] == f"file:{ops / 'mm.py'}" and not row["winner"]["override"]
    assert [c["plugin"] for c in row["shadowed"]] == ["castpack-mm-one 1.0.0", "core"]
    # Two packs claiming one op without override: still a CONFLICT, unless the user's file settles it.
    both = cli(site, [first, second], "audit", "--strict", "--op", "aten::mm")
    assert both.returncode == 1 and "CONFLICT" in both.stdout
    settled = cli(site, [first, second], "audit", "--strict", "--op", "aten::mm", "--custom-op-dir", str(ops))
    assert settled.returncode == 0 and "override (user)" in settled.stdout, settled.stdout + settled.stderr


TWICE = """
import torch
import castcore

@castcore.register_op_estimator(torch.ops.aten.mm.default)
def first_mm(invoke, device):
    return 1.0

@castcore.register_op_estimator(torch.ops.aten.mm.default, device="h100-*")
def second_mm(invoke, device):
    return 2.0

@castcore.register_op_estimator(torch.ops.aten.relu.default, device="a100-*")
def relu_a100(invoke, device):
    return 1.0

@castcore.register_op_estimator(torch.ops.aten.relu.default, device="h100-*")
def relu_h100(invoke, device):
    return 2.0
"""


def test_a_plugin_claiming_one_op_twice_is_warned_about_naming_both_functions(tmp_path):
    ops = ops_dir(tmp_path, twice=TWICE)
    session = session_with(ops)
    (warning,) = session.warnings  # relu's two claims cover different devices: no warning for them
    assert warning.startswith(f"file:{ops / 'twice.py'}: ")
    assert "aten::mm" in warning and "first_mm" in warning and "second_mm" in warning
    assert info_of(session, ops / "twice.py").status == "loaded"
    assert mm_answer(session)[1] == 1.0  # the first declared still answers


# --- sys.exit() ----------------------------------------------------------------------------------------------


def test_a_custom_op_file_calling_sys_exit_fails_alone(tmp_path):
    ops = ops_dir(tmp_path, bye="import sys\nsys.exit(3)\n", mm=MM.format(seconds=2.0))
    session = session_with(ops)
    info = info_of(session, ops / "bye.py")
    assert info.status == "failed" and info.error == "called sys.exit(3) while loading"
    assert any(str(ops / "bye.py") in w and "sys.exit(3)" in w for w in session.warnings)
    assert mm_answer(session)[1] == 2.0


def test_an_estimator_calling_sys_exit_is_an_estimator_error(tmp_path):
    ops = ops_dir(tmp_path, bye=MM.format(seconds="__import__('sys').exit(4)"))
    with pytest.raises(castcore.EstimatorError, match="SystemExit"):
        mm_answer(session_with(ops))


DEVICES_EXIT = """
import sys
import castcore

@castcore.hookimpl
def device_profiles():
    sys.exit(5)
"""


def test_a_device_profiles_hook_calling_sys_exit_is_reported(tmp_path):
    ops = ops_dir(tmp_path, devices=DEVICES_EXIT)
    session = session_with(ops)
    assert f"file:{ops / 'devices.py'}: device_profiles raised SystemExit: 5" in session.warnings
    assert "h100-sxm" in session.devices


# --- unsafe and wrong paths ----------------------------------------------------------------------------------


def _world_writable(path: Path) -> None:
    path.chmod(path.stat().st_mode | stat.S_IWOTH)
    if not path.stat().st_mode & stat.S_IWOTH:
        pytest.skip(f"chmod o+w has no effect on {path} here")


def test_a_symlink_into_a_world_writable_folder_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "mm.py").write_text(MM.format(seconds=2.0))
    _world_writable(shared)
    ops = ops_dir(tmp_path)
    (ops / "mm.py").symlink_to(shared / "mm.py")
    session = session_with(ops)
    info = info_of(session, ops / "mm.py")
    assert info.status == "failed"
    assert f"links to {shared / 'mm.py'}" in info.error and "writable by every user" in info.error
    assert mm_answer(session)[0] == "core (properties)"


def test_a_symlink_to_a_safe_file_loads(tmp_path):
    private = tmp_path / "private"
    private.mkdir()
    (private / "mm.py").write_text(MM.format(seconds=2.0))
    ops = ops_dir(tmp_path)
    (ops / "mm.py").symlink_to(private / "mm.py")
    assert mm_answer(session_with(ops))[1] == 2.0


def test_a_custom_op_path_that_is_a_file_says_so(tmp_path):
    ops = ops_dir(tmp_path, mm=MM.format(seconds=2.0))
    with pytest.raises(castcore.ConfigError, match="is a file, not a directory"):
        session_with(ops / "mm.py")
    done = cli(None, [], "packs", "--custom-op-dir", str(ops / "mm.py"))
    assert done.returncode == 2 and "is a file, not a directory" in done.stderr


# --- packs for another castcore, slow packs, sys.exit in a pack ------------------------------------------------

MARKS_IMPORT = """
import os
open(os.path.join(os.path.dirname(__file__), "imported"), "w").close()
"""


@pytest.fixture(scope="module")
def bad_packs(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    site = tmp_path_factory.mktemp("site")
    names = [
        install_pack(site, "castpack-exits", "import sys\nsys.exit(3)\n"),
        install_pack(site, "castpack-future", MARKS_IMPORT, requires=("castcore>=99", "torch")),
        install_pack(site, "castpack-api-two", "CASTCORE_API = 2\n"),
        install_pack(site, "castpack-slow", "import stopped_clock\nstopped_clock.now += 2.5\n"),
        install_pack(site, "castpack-fine", MM.format(seconds=1.0), requires=("castcore>=0.1,<99",)),
    ]
    return site, cli(site, names, "packs", "--json", stopped_clock=True)


def _row(done: subprocess.CompletedProcess, name: str) -> dict:
    assert done.returncode == 0, done.stderr
    return next(row for row in json.loads(done.stdout) if row["name"] == name)


def test_a_pack_calling_sys_exit_at_import_fails_alone(bad_packs):
    _, done = bad_packs
    assert _row(done, "exits")["status"] == "failed: called sys.exit(3) while loading"
    assert "castpack-exits 1.0.0: called sys.exit(3) while loading" in done.stderr
    assert _row(done, "fine")["status"] == "loaded"


def test_a_pack_requiring_a_newer_castcore_is_refused_by_name_before_it_runs(bad_packs):
    site, done = bad_packs
    status = _row(done, "future")["status"]
    assert status.startswith("failed: refused: it requires castcore>=99, but castcore ")
    assert "castpack-future 1.0.0: refused" in done.stderr
    assert not (site / "castpack_future" / "imported").exists()


def test_a_pack_needing_a_newer_plugin_api_is_refused_by_name(bad_packs):
    _, done = bad_packs
    status = _row(done, "api-two")["status"]
    assert status.startswith(
        "failed: refused: it declares CASTCORE_API = 2, and this castcore supports plugin API 1"
    )


def test_a_slow_pack_gets_a_note_with_its_import_time(bad_packs):
    _, done = bad_packs
    slow = _row(done, "slow")
    assert slow["status"] == "loaded"
    (note,) = slow["notes"]
    assert note.startswith("took 2.5 s to import (more than 2 s)")
    assert "castcore: warning: castpack-slow 1.0.0: took 2.5 s to import" in done.stderr
    assert not _row(done, "fine")["notes"]


def test_a_slow_import_is_no_fault_under_strict(bad_packs):
    site, _ = bad_packs
    done = cli(site, ["slow"], "packs", "--strict", stopped_clock=True)
    assert done.returncode == 0, done.stderr
    assert "castpack-slow 1.0.0: took 2.5 s to import" in done.stderr


# --- the audit's device globs ----------------------------------------------------------------------------------

TYPO_GLOB = """
import torch
import castcore

@castcore.register_op_estimator(torch.ops.aten.mm.default, device="h10-*")
def mm(invoke, device):
    return 1.0
"""


@pytest.mark.parametrize(
    "command",
    [
        ["audit"],
        ["estimate", "--model", str(HERE / "data" / "tiny-llama.json"), "--seq", "8"],
        ["serve", "--model", str(HERE / "data" / "tiny-llama.json"), "--input", "8", "--output", "2"],
    ],
)
def test_a_device_glob_matching_no_device_is_warned_about_in_every_command(tmp_path, command):
    ops = ops_dir(tmp_path, typo=TYPO_GLOB)
    done = cli(None, [], *command, "--strict", "--custom-op-dir", str(ops))
    assert done.returncode == 0, done.stderr  # a likely typo, but no fault: --strict passes
    line = (
        f"castcore: warning: file:{ops / 'typo.py'}: mm claims aten::mm on devices 'h10-*', which matches no "
        "installed device (h100-sxm)"
    )
    assert done.stderr.splitlines().count(line) == 1


def test_a_device_glob_matching_no_device_is_a_session_note(tmp_path):
    ops = ops_dir(tmp_path, typo=TYPO_GLOB)
    session = castcore.Session(load_packs=[], device_files=[DEVICE_FILE], custom_op_dirs=[ops])
    assert any(
        "claims aten::mm on devices 'h10-*', which matches no installed device" in n for n in session.notes
    )


# --- the default session and claims declared after it ---------------------------------------------------------

LATE_CLAIM = """
import json
import torch
import castcore

x = torch.empty(4, device="meta")
before = castcore.estimate(torch.relu, x).records[0].estimate

@castcore.register_op_estimator(torch.ops.aten.relu.default)
def relu(invoke, device):
    return 9.0

after = castcore.estimate(torch.relu, x).records[0].estimate
print(json.dumps([str(before.source), str(after.source), after.time_s]))
"""


def test_the_default_session_answers_with_claims_declared_after_it_was_made(tmp_path):
    (tmp_path / "castcore.toml").write_text(f'load_packs = []\ndevice_files = ["{DEVICE_FILE}"]\n')
    (tmp_path / "late.py").write_text(LATE_CLAIM)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CASTCORE_")}
    done = subprocess.run([sys.executable, "late.py"], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == ["core (properties)", "__main__ (estimator)", 9.0]
