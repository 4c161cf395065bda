"""The capture cache that estimate and serve share with sweeps: captures stored as data (never code), read back to
the same report, corrupt or foreign entries discarded with one warning, and a second run that never imports
transformers."""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

import castcore
from castcore.recording import stored
from castcore.sweeps.capture import CaptureCache
from castcore.deploy.pipeline import capture_workload

DATA = Path(__file__).parents[1] / "data"
LLAMA, H100 = str(DATA / "tiny-llama.json"), str(DATA / "h100-sxm.toml")


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    return tmp_path / "xdg" / "castcore" / "captures"


def cli(*argv: str, cache_home: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CASTCORE_")}
    return subprocess.run(
        [sys.executable, "-m", "castcore", *argv, "--no-packs", "--device-file", H100],
        capture_output=True,
        text=True,
        env={**env, "XDG_CACHE_HOME": str(cache_home)},
    )


@pytest.mark.parametrize(
    "options",
    [
        dict(seq=16),
        dict(phase="decode", batch=2, kv_len=24, kv_cache="fp8"),
        dict(seq=16, tp=2, weights="int8"),
    ],
)
def test_a_stored_capture_reads_back_to_the_same_report(session, options):
    workload = castcore.build_workload(LLAMA, **options)
    device = session.device()
    built, captured = capture_workload(session, workload, device)
    entry = {"format": 3, "notes": built.notes, "kv_cache_shape": built.kv_cache_shape, "capture": captured}
    back = stored.loads(stored.dumps(entry))
    assert back["notes"] == built.notes and back["kv_cache_shape"] == built.kv_cache_shape
    again = back["capture"]
    assert [(i.op, i.args, i.kwargs, i.out, i.module, i.index, i.attrs) for i in again.invokes] == [
        (i.op, i.args, i.kwargs, i.out, i.module, i.index, i.attrs) for i in captured.invokes
    ]
    # not part of equality: checked apart
    assert [t.storage for i in again.invokes for t in i.inputs()] == [
        t.storage for i in captured.invokes for t in i.inputs()
    ]
    for name in ("weight_storages", "input_storages", "output_storages", "state_storages"):
        assert getattr(again, name) == getattr(captured, name)
    first, second = (session.estimate_capture(c, device) for c in (captured, again))
    assert first.totals() == second.totals() and first.memory.to_dict() == second.memory.to_dict()


def test_loading_never_runs_code(tmp_path):
    ran = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (open, (str(ran), "w"))

    for data in (
        zlib.compress(pickle.dumps({"capture": Payload()})),  # the old format, or a planted pickle
        zlib.compress(json.dumps({"capture": {}, "x": ["d", "__builtins__"]}).encode()),
        zlib.compress(json.dumps({"x": ["O", "aten::no_such_op", "default"]}).encode()),
        zlib.compress(b"\xff\xfe not json"),
        b"not even compressed",
    ):
        with pytest.raises(stored.StoredError):
            stored.loads(data)
    assert not ran.exists()


def test_a_python_callable_op_has_no_stored_form():
    from castcore.recording.invoke import OpInvoke
    from castcore.recording.recorder import Capture

    captured = Capture(invokes=[OpInvoke(op=len)])
    with pytest.raises(stored.Unstorable):
        stored.dumps({"capture": captured})


FUSE_NOTHING = """
import castcore


@castcore.hookimpl
def fuse_model(model, device):
    return None
"""


def _estimate(cache_step: CaptureCache, ops: Path | None = None, **options) -> castcore.Report:
    session = castcore.Session(
        load_packs=[], device_files=[H100], custom_op_dirs=[ops] if ops else [], capture_step=cache_step
    )
    return session.estimate(castcore.build_workload(LLAMA, seq=16, **options))


def test_corrupt_entries_are_discarded_with_one_warning_and_rebuilt(cache, tmp_path):
    # a plugin with a fuse_model hook: its rewrite's fingerprint is cached too (.fused)
    ops = tmp_path / "ops"
    ops.mkdir()
    (ops / "fuse.py").write_text(FUSE_NOTHING)
    first = CaptureCache()
    report = _estimate(first, ops)
    assert first.stats.captured == 1 and first.warnings == []
    assert sorted(p.suffix for p in cache.iterdir()) == [".capture", ".fused"]
    for path in cache.iterdir():
        path.write_bytes(b"\xff\xfe\x00 cut short")  # neither a capture nor a digest, nor UTF-8
    second = CaptureCache()
    again = _estimate(second, ops)
    assert again.totals() == report.totals() and second.stats.captured == 1
    assert len(second.warnings) == 2  # the .capture and the .fused entry, each once
    assert all(w.startswith("discarded the unreadable cache entry") for w in second.warnings)
    third = CaptureCache()
    _estimate(third, ops)
    assert (third.stats.loaded, third.warnings) == (1, [])  # rebuilt entries read back


@pytest.mark.parametrize("entry", ["bomb", "deep"])
def test_an_entry_that_inflates_far_or_nests_deep_is_discarded_cheaply_with_one_warning(cache, entry):
    """A 1 MiB entry that would inflate to 1 GiB stops at about 100 MiB; one nested 200,000 deep is not read."""
    report = _estimate(CaptureCache())
    (path,) = cache.iterdir()
    if entry == "bomb":
        packer = zlib.compressobj(9)
        path.write_bytes(b"".join(packer.compress(b" " * 2**20) for _ in range(1024)) + packer.flush())
    else:
        path.write_bytes(zlib.compress(b"[" * 200_000))
    second = CaptureCache()
    assert _estimate(second).totals() == report.totals() and second.stats.captured == 1
    said = "it inflates past" if entry == "bomb" else "nested too deep"
    assert len(second.warnings) == 1 and said in second.warnings[0]
    assert second.warnings[0].startswith("discarded the unreadable cache entry")


def test_a_cache_folder_every_user_may_write_is_refused(cache):
    _estimate(CaptureCache())
    cache.chmod(0o1777)
    refused = CaptureCache()
    report = _estimate(refused)
    assert refused.stats.loaded == 0 and refused.stats.captured == 1
    assert len(refused.warnings) == 1 and "is writable by every user" in refused.warnings[0]
    assert report.time_s > 0


@pytest.mark.skipif(
    not hasattr(os, "getuid") or os.getuid() != 0, reason="changing a file's owner needs root"
)
def test_an_entry_another_user_owns_is_refused(cache):
    _estimate(CaptureCache())
    for path in cache.iterdir():
        os.chown(path, 4242, 4242)
    refused = CaptureCache()
    _estimate(refused)
    assert refused.stats.loaded == 0
    assert any("owned by uid 4242" in w for w in refused.warnings)


def test_a_cache_home_that_is_a_file_is_said_once(tmp_path, monkeypatch):
    home = tmp_path / "not-a-folder"
    home.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(home))
    step = CaptureCache()
    _estimate(step)
    _estimate(step, batch=2)
    assert len(step.warnings) == 1 and "cannot be written" in step.warnings[0]


def test_a_second_estimate_loads_the_capture_and_prints_the_same(tmp_path):
    argv = ("estimate", "--model", LLAMA, "--seq", "16", "--json")
    first, second = cli(*argv, cache_home=tmp_path), cli(*argv, cache_home=tmp_path)
    assert first.returncode == second.returncode == 0, first.stderr + second.stderr
    assert json.loads(first.stdout) == json.loads(second.stdout)
    assert "loaded the capture from castcore's cache" not in first.stderr
    assert "castcore: loaded the capture from castcore's cache (--no-cache captures anew)" in second.stderr
    assert "capturing" in first.stderr and "capturing" not in second.stderr  # nothing was captured
    fresh = cli(*argv, "--no-cache", cache_home=tmp_path / "other")
    assert json.loads(fresh.stdout) == json.loads(first.stdout) and not (tmp_path / "other").exists()


def test_a_second_serve_loads_every_step_and_gives_the_same_figures(tmp_path):
    argv = ("serve", "--model", LLAMA, "--input", "32", "--output", "16", "--batch", "2", "--json")
    first, second = cli(*argv, cache_home=tmp_path), cli(*argv, cache_home=tmp_path)
    assert first.returncode == second.returncode == 0, first.stderr + second.stderr
    assert json.loads(first.stdout) == json.loads(second.stdout)
    assert "loaded the capture from castcore's cache" in second.stderr
    assert "castcore: capturing" in first.stderr and "capturing" not in second.stderr
    # the prefill, 3 decode steps
    assert len(list((tmp_path / "castcore" / "captures").glob("*.capture"))) == 4


def test_a_loaded_capture_needs_no_transformers(tmp_path):
    """What makes a second run quick: the model is neither built nor imported."""
    code = (
        "import sys, castcore; from castcore.sweeps.capture import CaptureCache\n"
        "c = CaptureCache(); s = castcore.Session(load_packs=[], device_files=[sys.argv[1]], capture_step=c)\n"
        "r = s.estimate(castcore.build_workload(sys.argv[2], seq=16))\n"
        "print(c.stats.loaded, 'transformers' in sys.modules, r.time_s)"
    )
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    runs = [
        subprocess.run([sys.executable, "-c", code, H100, LLAMA], capture_output=True, text=True, env=env)
        for _ in range(2)
    ]
    assert [r.stdout.split()[:2] for r in runs] == [["0", "True"], ["1", "False"]], runs[1].stderr
    assert runs[0].stdout.split()[2] == runs[1].stdout.split()[2]


def test_a_priced_ladder_point_is_kept_unless_cut_or_priced_by_a_plugin_object(cache):
    step = CaptureCache()
    session = castcore.Session(load_packs=[], device_files=[H100], capture_step=step)
    workload, device = castcore.build_workload(LLAMA), session.device("h100-sxm")
    made: list[int] = []

    def price() -> dict:
        made.append(1)
        return {"made": len(made), "time": 0.1 + 0.2}  # a float read back exactly

    chunks = ((4, 0, True),)
    first = step.priced(session, workload, device, chunks, price)
    assert step.priced(session, workload, device, chunks, price) == first == {"made": 1, "time": 0.1 + 0.2}
    # another profile under the same name prices anew: every number of it prices
    other = dataclasses.replace(device, memory_efficiency=0.5)
    assert step.priced(session, workload, other, chunks, price)["made"] == 2
    (entry,) = [
        p for p in cache.glob("*.priced") if json.loads(zlib.decompress(p.read_bytes()))["value"] == first
    ]
    entry.write_bytes(b"cut")
    assert step.priced(session, workload, device, chunks, price)["made"] == 3

    class Mine:  # a caller's plugin object: no source file keys its estimates, so nothing is kept
        pass

    session.plugins.pm.register(Mine(), name="mine")
    before = len(list(cache.glob("*.priced")))
    assert step.priced(session, workload, device, chunks, price)["made"] == 4
    assert step.priced(session, workload, device, chunks, price)["made"] == 5
    assert len(list(cache.glob("*.priced"))) == before
