"""Configuration: [tool.castcore] in pyproject.toml or a castcore.toml, CASTCORE_* environment variables,
and what they do to real, pip-installed packs (priority, load, disable, unknown names)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import castcore

HERE = Path(__file__).parents[1]
PACKS = HERE / "packs"
DEVICE_FILE = HERE / "data" / "h100-sxm.toml"


# --- files ---------------------------------------------------------------------------------------------


def test_tool_castcore_in_pyproject_is_found_from_a_subdirectory(tmp_path):
    project = tmp_path / "project"
    (project / "src" / "pkg").mkdir(parents=True)
    (project / "pyproject.toml").write_text(
        '[project]\nname = "demo"\n\n[tool.castcore]\n'
        'priority = ["b", "a"]\ndisable = ["c"]\nload_packs = ["a", "b"]\ncustom_op_dirs = ["my_ops"]\n'
        'device_files = ["devices/npu.toml"]\ndefault_device = "h100-sxm"\nstrict = true\non_error = "fallback"\n'
    )
    config = castcore.load_config(cwd=project / "src" / "pkg", environ={})
    assert config.origin == str(project / "pyproject.toml")
    assert config.priority == ("b", "a")
    assert config.disable == ("c",)
    assert config.load_packs == ("a", "b")
    # Relative paths are relative to the file that names them, not to the working directory.
    assert config.custom_op_dirs == (project / "my_ops",)
    assert config.device_files == (project / "devices" / "npu.toml",)
    assert config.default_device == "h100-sxm"
    assert config.strict is True
    assert config.on_error == "fallback"


def test_castcore_toml_is_found_and_a_pyproject_without_the_table_is_skipped(tmp_path):
    (tmp_path / "castcore.toml").write_text('priority = ["outer"]\ndefault_device = "h100-sxm"\n')
    inner = tmp_path / "inner"
    inner.mkdir()
    (inner / "pyproject.toml").write_text('[project]\nname = "inner"\n[tool.ruff]\nline-length = 120\n')
    config = castcore.load_config(cwd=inner, environ={})
    assert config.origin == str(tmp_path / "castcore.toml")
    assert config.priority == ("outer",)
    assert config.default_device == "h100-sxm"


def test_the_nearest_file_wins(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.castcore]\npriority = ["far"]\n')
    near = tmp_path / "near"
    near.mkdir()
    (near / "castcore.toml").write_text('priority = ["near"]\n')
    assert castcore.load_config(cwd=near, environ={}).priority == ("near",)
    assert castcore.load_config(cwd=tmp_path, environ={}).priority == ("far",)


def test_no_file_and_no_environment_gives_the_defaults(tmp_path):
    config = castcore.load_config(cwd=tmp_path, environ={})
    assert config.load_packs is None  # every installed pack
    assert (config.disable, config.priority, config.custom_op_dirs, config.strict) == ((), (), (), False)


@pytest.mark.parametrize("filename, prefix", [("pyproject.toml", "[tool.castcore]\n"), ("castcore.toml", "")])
def test_unknown_settings_are_an_error_naming_them(tmp_path, filename, prefix):
    (tmp_path / filename).write_text(prefix + 'prority = ["a"]\ncolour = "blue"\npriority = ["a"]\n')
    with pytest.raises(castcore.ConfigError) as caught:
        castcore.load_config(cwd=tmp_path, environ={})
    message = str(caught.value)
    assert "prority" in message and "colour" in message and str(tmp_path / filename) in message
    assert "priority" not in message.split("; known")[0]  # the valid one is not reported as unknown


def test_a_list_setting_of_the_wrong_type_is_an_error(tmp_path):
    (tmp_path / "castcore.toml").write_text('priority = "a"\n')
    with pytest.raises(castcore.ConfigError, match="priority"):
        castcore.load_config(cwd=tmp_path, environ={})


def test_strict_must_be_a_boolean(tmp_path):
    # strict = "false" must not silently turn strict mode on.
    (tmp_path / "castcore.toml").write_text('strict = "false"\n')
    with pytest.raises(castcore.ConfigError, match="strict"):
        castcore.load_config(cwd=tmp_path, environ={})


# --- environment -------------------------------------------------------------------------------------


@pytest.fixture
def project(tmp_path) -> Path:
    (tmp_path / "castcore.toml").write_text(
        'load_packs = ["from_file"]\ndisable = ["off_in_file"]\ncustom_op_dirs = ["file_ops"]\n'
    )
    return tmp_path


def test_empty_castcore_load_packs_loads_none(project):
    assert castcore.load_config(cwd=project, environ={"CASTCORE_LOAD_PACKS": ""}).load_packs == ()
    assert castcore.load_config(cwd=project, environ={}).load_packs == ("from_file",)
    assert castcore.load_config(cwd=project, environ={"CASTCORE_LOAD_PACKS": "a, b,"}).load_packs == (
        "a",
        "b",
    )


def test_castcore_disable_packs_overrides_the_file(project):
    assert castcore.load_config(cwd=project, environ={"CASTCORE_DISABLE_PACKS": "x,y"}).disable == ("x", "y")
    assert castcore.load_config(cwd=project, environ={}).disable == ("off_in_file",)


def test_castcore_custom_op_path_dirs_come_first_in_order(project, tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    config = castcore.load_config(cwd=project, environ={"CASTCORE_CUSTOM_OP_PATH": f"{one}{os.pathsep}{two}"})
    assert config.custom_op_dirs == (one, two, project / "file_ops")  # earlier wins


@pytest.mark.parametrize(
    "value, strict",
    [("1", True), ("true", True), ("YES", True), ("on", True), ("0", False), ("", False), ("false", False)],
)
def test_castcore_strict(tmp_path, value, strict):
    assert castcore.load_config(cwd=tmp_path, environ={"CASTCORE_STRICT": value}).strict is strict


def test_castcore_strict_0_overrides_strict_in_the_file(tmp_path):
    (tmp_path / "castcore.toml").write_text("strict = true\n")
    assert castcore.load_config(cwd=tmp_path, environ={"CASTCORE_STRICT": "0"}).strict is False


def test_explicit_overrides_beat_the_environment(project):
    config = castcore.load_config(cwd=project, environ={"CASTCORE_LOAD_PACKS": "a"}, load_packs=[])
    assert config.load_packs == ()


def test_castcore_strict_makes_a_broken_plugin_fail_the_command(tmp_path):
    (tmp_path / "broken.py").write_text("def oops(:\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CASTCORE_")}
    args = [sys.executable, "-m", "castcore", "devices", "--no-packs", "--device-file", str(DEVICE_FILE)]
    relaxed = subprocess.run(
        args,
        env=dict(env, CASTCORE_CUSTOM_OP_PATH=str(tmp_path)),
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    strict = subprocess.run(
        args,
        env=dict(env, CASTCORE_CUSTOM_OP_PATH=str(tmp_path), CASTCORE_STRICT="1"),
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert relaxed.returncode == 0, relaxed.stderr
    assert "broken.py" in relaxed.stderr
    assert strict.returncode == 1, strict.stderr
    assert "broken.py" in strict.stderr and "strict" in strict.stderr


# --- on installed packs ------------------------------------------------------------------------------

PROBE = r"""
import json, os, sys, torch, castcore
results = {}
base = {k: v for k, v in os.environ.items() if not k.startswith("CASTCORE_")}
for name, spec in json.loads(sys.argv[1]).items():
    os.environ.clear()
    os.environ.update(base, **spec["env"])
    os.chdir(spec["cwd"])
    try:
        session = castcore.Session(device_files=[spec["device_file"]])
    except castcore.ConfigError as exc:
        results[name] = {"config_error": str(exc)}
        continue
    report = session.estimate(torch.mm, torch.empty(64, 32, device="meta"), torch.empty(32, 16, device="meta"),
                              device="h100-sxm")
    (record,) = report.records
    results[name] = {"status": {i.name: i.status for i in session.plugins.infos},
                     "mm": [str(record.estimate.source), record.estimate.time_s]}
print(json.dumps(results))
"""

PRIO_A, PRIO_B = "castpack-prio-a 0.0.1 (estimator)", "castpack-prio-b 0.0.1 (estimator)"

SCENARIOS = {
    # name: (castcore.toml text or None, [tool.castcore] text or None, environment)
    "default": (None, None, {}),
    "priority_a": ('priority = ["prio_a"]\n', None, {}),
    "priority_a_b": (None, 'priority = ["prio_a", "prio_b"]\n', {}),
    "priority_b_a": (None, 'priority = ["prio_b", "prio_a"]\n', {}),
    "load_none": (None, None, {"CASTCORE_LOAD_PACKS": ""}),
    "load_a": (None, None, {"CASTCORE_LOAD_PACKS": "prio_a"}),
    "disable_b": (None, None, {"CASTCORE_DISABLE_PACKS": "prio_b"}),
    "env_beats_file": ('load_packs = ["prio_b"]\n', None, {"CASTCORE_LOAD_PACKS": "prio_a"}),
    "custom_op_path": (None, None, {"CASTCORE_CUSTOM_OP_PATH": "{ops}"}),
    "unknown_priority": ('priority = ["prio_c"]\n', None, {}),
    "unknown_load": (None, 'load_packs = ["prio_a", "nosuch"]\n', {}),
    "unknown_disable_env": (None, None, {"CASTCORE_DISABLE_PACKS": "nosuch"}),
}

USER_MM = """
import torch
import castcore

@castcore.register_op_estimator(torch.ops.aten.mm.default)
def mm(invoke, device):
    return 2.0
"""


@pytest.fixture(scope="module")
def packs(tmp_path_factory) -> dict[str, dict]:
    """castpack-prio-a and castpack-prio-b (both claim aten.mm) pip-installed in one call, then every
    scenario above run in one subprocess (one torch import), each from its own folder and environment."""
    root = tmp_path_factory.mktemp("config")
    copies = []
    for name in ("castpack-prio-a", "castpack-prio-b"):
        shutil.copytree(PACKS / name, root / name, ignore=shutil.ignore_patterns("build", "*.egg-info"))
        copies.append(str(root / name))
    site = root / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(site), *copies],
        check=True,
    )
    ops = root / "ops"
    ops.mkdir()
    (ops / "mm.py").write_text(USER_MM)
    specs = {}
    for name, (castcore_toml, tool_table, env) in SCENARIOS.items():
        cwd = root / "scenarios" / name
        cwd.mkdir(parents=True)
        if castcore_toml is not None:
            (cwd / "castcore.toml").write_text(castcore_toml)
        if tool_table is not None:
            (cwd / "pyproject.toml").write_text('[project]\nname = "x"\n[tool.castcore]\n' + tool_table)
        specs[name] = {
            "cwd": str(cwd),
            "device_file": str(DEVICE_FILE),
            "env": {k: v.format(ops=ops) for k, v in env.items()},
        }
    env = {k: v for k, v in os.environ.items() if not k.startswith("CASTCORE_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(specs)], env=env, cwd=root, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout)
    results["_ops"] = str(ops)
    return results


def test_without_priority_the_later_name_answers(packs):
    assert packs["default"]["mm"] == [PRIO_B, 0.25]


@pytest.mark.parametrize(
    "scenario, answer",
    [("priority_a", [PRIO_A, 0.125]), ("priority_a_b", [PRIO_A, 0.125]), ("priority_b_a", [PRIO_B, 0.25])],
)
def test_priority_reorders_packs_claiming_the_same_op_first_named_wins(packs, scenario, answer):
    assert packs[scenario]["mm"] == answer
    assert packs[scenario]["status"]["prio_a"] == packs[scenario]["status"]["prio_b"] == "loaded"


def test_empty_load_packs_loads_no_pack(packs):
    result = packs["load_none"]
    assert result["status"]["prio_a"] == result["status"]["prio_b"] == "disabled"
    assert result["mm"][0] == "core (properties)"


def test_load_packs_loads_only_the_named(packs):
    assert packs["load_a"]["status"]["prio_a"] == "loaded"
    assert packs["load_a"]["status"]["prio_b"] == "disabled"
    assert packs["load_a"]["mm"] == [PRIO_A, 0.125]


def test_disable_packs_turns_one_off(packs):
    assert packs["disable_b"]["status"]["prio_b"] == "disabled"
    assert packs["disable_b"]["mm"] == [PRIO_A, 0.125]


def test_the_environment_beats_the_file(packs):
    assert packs["env_beats_file"]["status"]["prio_b"] == "disabled"
    assert packs["env_beats_file"]["mm"] == [PRIO_A, 0.125]


def test_custom_op_path_file_beats_both_packs(packs):
    assert packs["custom_op_path"]["mm"] == [f"file:{Path(packs['_ops']) / 'mm.py'} (estimator)", 2.0]


@pytest.mark.parametrize(
    "scenario, setting, unknown",
    [
        ("unknown_priority", "priority", "prio_c"),
        ("unknown_load", "load_packs", "nosuch"),
        ("unknown_disable_env", "disable", "nosuch"),
    ],
)
def test_a_pack_name_matching_no_installed_pack_is_an_error_listing_the_installed(
    packs, scenario, setting, unknown
):
    message = packs[scenario]["config_error"]
    assert setting in message and unknown in message
    installed = message.split("installed packs:")[1]
    assert "prio_a" in installed and "prio_b" in installed


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("castcore.toml", b"\x89PNG\r\n\x1a\n", "not valid TOML"),
        ("pyproject.toml", b"[tool]\ncastcore = 5\n", "'tool.castcore' must be a table of settings"),
        ("pyproject.toml", b"tool = 5\n", "'tool' must be a table"),
    ],
)
def test_a_config_file_castcore_cannot_read_is_one_line(
    name, content, message, tmp_path, monkeypatch, capsys
):
    from castcore.cli.main import main

    (tmp_path / name).write_bytes(content)
    monkeypatch.chdir(tmp_path)
    assert main(["devices", "--no-packs"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"castcore: error: {tmp_path / name}: ") and message in line
