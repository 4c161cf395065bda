"""Packs found through real entry points of a pip-installed distribution, and the priority order:
a user's custom-op file beats a pack, a pack beats the core."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parents[1]

PROBE = """
import json, torch, castcore
session = castcore.Session(device_files=[{device!r}])
def fn(a, b):
    return torch.cumsum(torch.mm(a, b), 0).relu()
a = torch.empty(64, 32, device="meta")
b = torch.empty(32, 16, device="meta")
report = session.estimate(fn, a, b, device={device_name!r})
print(json.dumps({{
    "packs": {{i.name: [i.kind, i.label, i.status] for i in session.plugins.infos}},
    "devices": sorted(session.devices),
    "ops": {{r.invoke.name: [r.estimate.source.plugin, r.estimate.source.step, r.estimate.time_s]
             for r in report.records}},
}}))
"""

USER_FILE = """
import torch
import castcore

@castcore.register_op_estimator(torch.ops.aten.mm.default)
def mm(invoke, device):
    return 2.0

@castcore.register_op_properties(torch.ops.aten.relu.default)
def relu(invoke, device):
    return invoke.memory_access_properties().add(invoke.args[0].dtype, gp=3 * invoke.args[0].numel())
"""


@pytest.fixture(scope="module")
def pack_site(tmp_path_factory) -> Path:
    """castpack-throwaway pip-installed (for real, with its entry point) into a fresh target folder."""
    target = tmp_path_factory.mktemp("site")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--target",
            str(target),
            str(HERE / "packs" / "castpack-throwaway"),
        ],
        check=True,
    )
    return target


def probe(pack_site: Path | None, custom_dir: Path | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CASTCORE_")}
    if pack_site:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(pack_site), env.get("PYTHONPATH")]))
    if custom_dir:
        env["CASTCORE_CUSTOM_OP_PATH"] = str(custom_dir)
    code = PROBE.format(device=str(HERE / "data" / "h100-sxm.toml"), device_name="h100-sxm")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=HERE)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_installed_pack_is_found_through_its_entry_point(pack_site):
    result = probe(pack_site)
    assert result["packs"]["throwaway"] == ["pack", "castpack-throwaway 9.9.9", "loaded"]
    assert "throwaway-npu" in result["devices"]


def test_pack_estimator_beats_the_core(pack_site):
    ops = probe(pack_site)["ops"]
    assert ops["aten::mm"] == ["castpack-throwaway 9.9.9", "estimator", 1.0]
    assert ops["aten::cumsum"][:2] == ["castpack-throwaway 9.9.9", "properties"]
    assert ops["aten::relu"][:2] == ["core", "properties"]


def test_without_the_pack_the_core_answers():
    ops = probe(None)["ops"]
    assert ops["aten::mm"][:2] == ["core", "properties"]
    assert ops["aten::cumsum"][:2] == ["core", "properties"]  # the pack's cumsum properties beat these


def test_user_file_beats_the_pack_and_its_properties_are_used(pack_site, tmp_path):
    (tmp_path / "my_ops.py").write_text(USER_FILE)
    (tmp_path / "_private.py").write_text("raise RuntimeError('files starting with _ are not loaded')")
    ops = probe(pack_site, tmp_path)["ops"]
    user = f"file:{tmp_path / 'my_ops.py'}"
    assert ops["aten::mm"] == [user, "estimator", 2.0]
    assert ops["aten::relu"][:2] == [user, "properties"]
    assert ops["aten::cumsum"][:2] == ["castpack-throwaway 9.9.9", "properties"]


CONCURRENT = """
import sys, threading
from pathlib import Path
import castcore

folders = [Path(sys.argv[1]) / f"ops{i}" for i in range(4)]
for folder in folders:
    folder.mkdir()
    (folder / "_helper.py").write_text("VALUE = 1\\n")
    (folder / "mine.py").write_text("import _helper\\n")
failures = []

def make(folder):
    try:
        castcore.Session(load_packs=["throwaway"], custom_op_dirs=[folder], default_custom_op_dirs=False)
    except Exception as exc:
        failures.append(repr(exc))

for _ in range(10):
    threads = [threading.Thread(target=make, args=(f,)) for f in folders]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
print(len(failures), failures[:1])
"""


def test_sessions_made_at_once_in_threads_all_find_the_pack(pack_site, tmp_path):
    """Loading a custom-op directory edits sys.path, which another thread's entry-point scan reads."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CASTCORE_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(pack_site), env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-c", CONCURRENT, str(tmp_path)], env=env, capture_output=True, text=True, cwd=HERE
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("0 []"), done.stdout


def test_without_a_profile_marked_default_the_device_chosen_is_said(pack_site):
    """castpack-ascend marks the default device; with only castpack-throwaway's profile, that one is used and a
    note says why and how to get the usual default, before the capture; a --device given needs no note."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CASTCORE_")}
    env.update(
        PYTHONPATH=os.pathsep.join(filter(None, [str(pack_site), env.get("PYTHONPATH")])),
        CASTCORE_LOAD_PACKS="throwaway",
    )
    model = ["--model", str(HERE / "data" / "tiny-llama.json"), "--seq", "8", "--no-default-custom-op-dirs"]
    done = subprocess.run(
        [sys.executable, "-m", "castcore", "estimate", *model],
        env=env,
        capture_output=True,
        text=True,
        cwd=HERE,
    )
    assert done.returncode == 0, done.stderr
    assert "on throwaway-npu" in done.stdout
    assert done.stderr.splitlines()[0] == (
        "castcore: note: no installed profile is marked default (castpack-ascend marks ascend-910b3: pip install "
        "castpack-ascend); using throwaway-npu, the first installed by name (--device chooses another)"
    )
    chosen = subprocess.run(
        [sys.executable, "-m", "castcore", "estimate", *model, "--device", "throwaway-npu"],
        env=env,
        capture_output=True,
        text=True,
        cwd=HERE,
    )
    assert chosen.returncode == 0 and "marked default" not in chosen.stderr
