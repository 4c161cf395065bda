"""A bad plugin is reported by name with a one-line reason; it never takes the run down and never
changes the estimate of an op it does not claim.

Packs are pip-installed for real (one ``pip install --target`` for all of them) and probed in
subprocesses, so their entry points are found as a user's would be; custom-op files are loaded
in-process (each load gets a fresh module name, so nothing leaks between sessions).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import castcore
from tests.plugin_files import info_of, ops_dir

HERE = Path(__file__).parents[1]
PACKS = HERE / "packs"
DEVICE_FILE = HERE / "data" / "h100-sxm.toml"
THROWAWAY = "castpack-throwaway 9.9.9"

PROBE = r"""
import json, sys, torch, castcore
spec = json.loads(sys.argv[1])
session = castcore.Session(device_files=[spec["device_file"]], **spec.get("overrides", {}))
def fn(a, b):
    return torch.mm(a.relu(), b).cumsum(0)
report = session.estimate(fn, torch.empty(64, 32, device="meta"), torch.empty(32, 16, device="meta"),
                          device="h100-sxm")
print(json.dumps({
    "packs": {i.name: {"kind": i.kind, "label": i.label, "status": i.status, "error": i.error}
              for i in session.plugins.infos},
    "warnings": session.warnings,
    "devices": {n: {"vendor": d.vendor, "origin": d.origin, "memory_bandwidth": d.memory_bandwidth}
                for n, d in session.devices.items()},
    "ops": {r.invoke.name: {"source": str(r.estimate.source), "time_s": r.estimate.time_s,
                            "compute_s": r.estimate.compute_s, "memory_s": r.estimate.memory_s,
                            "overhead_s": r.estimate.overhead_s, "bound": r.estimate.bound}
            for r in report.records},
    "errors": session.resolver.errors,
    "modules": sorted(m for m in sys.modules if m.startswith("castpack_")),
}))
"""


def pip_install(pack_dirs: list[str], target: Path, scratch: Path) -> None:
    """pip-install the named test packs into ``target`` in one call, building from copies so the
    source folders under tests/packs stay free of build/ and egg-info litter."""
    copies = []
    for name in pack_dirs:
        copy = scratch / name
        shutil.copytree(
            PACKS / name, copy, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__")
        )
        copies.append(str(copy))
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target), *copies],
        check=True,
    )


def run_probes(specs: dict[str, dict], cwd: Path) -> dict[str, dict]:
    """Run one probe subprocess per spec, all at once; each spec names its site (PYTHONPATH)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("CASTCORE_")}
    procs = {}
    for name, spec in specs.items():
        env = dict(
            base, PYTHONPATH=os.pathsep.join(filter(None, [str(spec["site"]), base.get("PYTHONPATH")]))
        )
        payload = json.dumps({"device_file": str(DEVICE_FILE), "overrides": spec.get("overrides", {})})
        procs[name] = subprocess.Popen(
            [sys.executable, "-c", PROBE, payload],
            env=env,
            cwd=cwd,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
    results = {}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"probe {name} failed:\n{err}"
        results[name] = json.loads(out)
    return results


@pytest.fixture(scope="module")
def probes(tmp_path_factory) -> dict[str, dict]:
    """Every bad pack installed next to a good one (castpack-throwaway), probed three ways."""
    root = tmp_path_factory.mktemp("isolation")
    site = root / "site"
    pip_install(
        [
            "castpack-throwaway",
            "castpack-broken-import",
            "castpack-twin-a",
            "castpack-twin-b",
            "castpack-dupdev-a",
            "castpack-dupdev-b",
            "castpack-badspec",
        ],
        site,
        root,
    )
    without_broken = root / "site-without-broken"
    shutil.copytree(site, without_broken, ignore=shutil.ignore_patterns("castpack_broken_import*"))
    (root / "cwd").mkdir()
    return run_probes(
        {
            "all": {"site": site},
            "dupdev_a_first": {"site": site, "overrides": {"priority": ["dupdev_a"]}},
            "without_broken": {"site": without_broken},
        },
        cwd=root / "cwd",
    )


# --- packs -----------------------------------------------------------------------------------------


def test_pack_that_fails_to_import_is_reported_and_the_others_load(probes):
    result = probes["all"]
    broken = result["packs"]["broken"]
    assert broken["status"] == "failed"
    assert broken["label"] == "castpack-broken-import 0.0.1"
    assert "ModuleNotFoundError" in broken["error"]
    assert "castpack_broken_import_missing_dependency" in broken["error"]
    assert "\n" not in broken["error"]
    assert any("castpack-broken-import" in w and "ModuleNotFoundError" in w for w in result["warnings"])
    assert result["packs"]["throwaway"]["status"] == "loaded"
    assert "throwaway-npu" in result["devices"]
    assert result["ops"]["aten::mm"]["source"] == f"{THROWAWAY} (estimator)"
    assert result["ops"]["aten::mm"]["time_s"] == 1.0
    # The claim it declared before its import failed is never used.
    assert result["ops"]["aten::relu"]["source"] == "core (properties)"
    assert result["ops"]["aten::relu"]["time_s"] != 99.0


def test_ops_are_estimated_identically_with_and_without_the_broken_pack(probes):
    assert "broken" not in probes["without_broken"]["packs"]
    assert probes["all"]["ops"] == probes["without_broken"]["ops"]
    assert probes["all"]["devices"] == probes["without_broken"]["devices"]


def test_two_distributions_with_one_entry_point_name_are_both_refused(probes):
    result = probes["all"]
    twin = result["packs"]["twin"]
    assert twin["status"] == "failed"
    assert "castpack-twin-a" in twin["error"] and "castpack-twin-b" in twin["error"]
    assert any("castpack-twin-a" in w and "castpack-twin-b" in w for w in result["warnings"])
    # Neither was imported: no device, no claim, no module.
    assert not {"twin-a-npu", "twin-b-npu"} & set(result["devices"])
    assert not {"castpack_twin_a", "castpack_twin_b"} & set(result["modules"])
    assert result["ops"]["aten::mm"]["time_s"] not in (7.0, 8.0)


def test_same_device_from_two_packs_warns_naming_both_and_keeps_the_first(probes):
    for probe, first in (("all", "dupdev-b"), ("dupdev_a_first", "dupdev-a")):
        result = probes[probe]
        # The pack asked first for ops (the later name, unless priority says otherwise) also wins the device.
        assert result["devices"]["dup-npu"]["vendor"] == first, probe
        warnings = [w for w in result["warnings"] if "dup-npu" in w]
        assert len(warnings) == 1, (probe, result["warnings"])
        assert "castpack-dupdev-a" in warnings[0] and "castpack-dupdev-b" in warnings[0], warnings[0]
        assert result["packs"]["dupdev_a"]["status"] == result["packs"]["dupdev_b"]["status"] == "loaded"


def test_pack_whose_hook_does_not_match_the_spec_is_refused(probes):
    result = probes["all"]
    badspec = result["packs"]["badspec"]
    assert badspec["status"] == "failed"
    assert "spec" in badspec["error"] and "estimate_op" in badspec["error"]
    assert any("castpack-badspec" in w for w in result["warnings"])
    assert "badspec-npu" not in result["devices"]  # the whole pack is refused, not half of it
    assert result["ops"]["aten::mm"]["time_s"] == 1.0


# --- custom-op files, in-process -------------------------------------------------------------------

FUNC_INPUTS = ((64, 32), (32, 16))


def _fn(a, b):
    return torch.mm(a.relu(), b).cumsum(0)


def _inputs():
    return tuple(torch.empty(*shape, device="meta") for shape in FUNC_INPUTS)


@pytest.fixture(autouse=True)
def _no_castcore_env(monkeypatch):
    for var in (
        "CASTCORE_CUSTOM_OP_PATH",
        "CASTCORE_LOAD_PACKS",
        "CASTCORE_DISABLE_PACKS",
        "CASTCORE_STRICT",
    ):
        monkeypatch.delenv(var, raising=False)


def make_session(*dirs: Path, **overrides) -> castcore.Session:
    """No installed pack, the H100 test profile, and the given custom-op directories."""
    return castcore.Session(
        castcore.Config(),
        load_packs=[],
        device_files=[DEVICE_FILE],
        custom_op_dirs=[str(d) for d in dirs],
        **overrides,
    )


def run(session: castcore.Session) -> dict[str, tuple]:
    report = session.estimate(_fn, *_inputs(), device="h100-sxm")
    return {
        r.invoke.name: (
            str(r.estimate.source),
            r.estimate.time_s,
            r.estimate.compute_s,
            r.estimate.memory_s,
            r.estimate.comm_s,
            r.estimate.overhead_s,
            r.estimate.bound,
        )
        for r in report.records
    }


@pytest.fixture(scope="module")
def clean() -> dict[str, tuple]:
    """The estimates with no plugin but the core."""
    return run(make_session())


RELU_3S = """
import torch
import castcore

@castcore.register_op_estimator(torch.ops.aten.relu.default)
def relu(invoke, device):
    return 3.0
"""


def test_custom_op_file_with_a_syntax_error_is_reported_with_its_line(tmp_path, clean):
    folder = ops_dir(tmp_path, broken="import torch\n\n\ndef estimate(:\n    return 1.0\n", good=RELU_3S)
    session = make_session(folder)
    info = info_of(session, folder / "broken.py")
    assert info.status == "failed"
    assert "SyntaxError" in info.error and "line 4" in info.error
    assert any(str(folder / "broken.py") in w and "line 4" in w for w in session.warnings)
    assert info_of(session, folder / "good.py").status == "loaded"
    ops = run(session)
    assert ops["aten::relu"][:2] == (f"file:{folder / 'good.py'} (estimator)", 3.0)
    assert {k: v for k, v in ops.items() if k != "aten::relu"} == {
        k: v for k, v in clean.items() if k != "aten::relu"
    }


WRONG_ARGS = """
import torch
import castcore

@castcore.hookimpl
def estimate_op(invoke, device, tuning_knob):
    return 1.0

@castcore.register_op_properties(torch.ops.aten.relu.default)
def relu(invoke, device):
    return castcore.PerformanceProperties(memory_read_bytes=1e12)
"""


def test_hook_with_an_argument_the_spec_lacks_fails_its_plugin(tmp_path, clean):
    folder = ops_dir(tmp_path, mismatch=WRONG_ARGS)
    session = make_session(folder)
    info = info_of(session, folder / "mismatch.py")
    assert info.status == "failed"
    assert "spec" in info.error and "estimate_op" in info.error
    assert any(str(folder / "mismatch.py") in w for w in session.warnings)
    assert run(session) == clean  # neither its estimate_op nor its relu claim is used


def test_spec_mismatch_message_names_the_offending_argument(tmp_path):
    folder = ops_dir(tmp_path, mismatch=WRONG_ARGS)
    error = info_of(make_session(folder), folder / "mismatch.py").error
    # pluggy says which argument is wrong on its third line; the one-line reason must keep that part.
    assert "tuning_knob" in error, error


MISSPELLED_HOOK = """
import castcore

@castcore.hookimpl
def estimate_ops(invoke, device):
    return 1.0
"""


def test_hook_whose_name_is_not_in_the_spec_fails_its_plugin(tmp_path):
    folder = ops_dir(tmp_path, typo=MISSPELLED_HOOK)
    info = info_of(make_session(folder), folder / "typo.py")
    # A misspelled hook is never called; loading it as if all were well hides the mistake.
    assert info.status == "failed", info
    assert "estimate_ops" in info.error


ESTIMATOR = """
import math
import torch
import castcore

@castcore.register_op_estimator(torch.ops.aten.mm.default)
def bad_mm_estimator(invoke, device):
    {body}
"""

PROPERTIES = """
import math
import torch
import castcore

@castcore.register_op_properties(torch.ops.aten.mm.default)
def bad_mm_properties(invoke, device):
    {body}
"""

BAD_ANSWERS = {
    "raises": (ESTIMATOR, "raise ZeroDivisionError('no rate for this shape')", "ZeroDivisionError"),
    "negative": (ESTIMATOR, "return -1e-3", "negative"),
    "nan": (ESTIMATOR, "return math.nan", "NaN"),
    "infinite": (ESTIMATOR, "return math.inf", "infinite"),
    "not-a-number": (ESTIMATOR, "return 'fast'", "returned str"),
    "negative-part": (ESTIMATOR, "return castcore.Estimate(time_s=1e-3, memory_s=-1.0)", "negative"),
    "properties-raise": (PROPERTIES, "raise KeyError('k')", "KeyError"),
    "negative-bytes": (
        PROPERTIES,
        "return castcore.PerformanceProperties(memory_read_bytes=-4096)",
        "memory_read_bytes = -4096",
    ),
    "nan-bytes": (
        PROPERTIES,
        "return castcore.PerformanceProperties(memory_write_bytes=math.nan)",
        "memory_write_bytes",
    ),
    "properties-not-properties": (PROPERTIES, "return 2.0e6", "not PerformanceProperties"),
    "compute-ops-not-ComputeOps": (
        PROPERTIES,
        "return castcore.PerformanceProperties(compute_ops={torch.float32: 2.0e6})",
        "compute_ops",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_ANSWERS))
def test_bad_answer_stops_the_run_naming_plugin_op_and_shapes(case, tmp_path):
    template, body, reason = BAD_ANSWERS[case]
    folder = ops_dir(tmp_path, bad=template.format(body=body))
    session = make_session(folder)
    with pytest.raises(castcore.EstimatorError) as caught:
        run(session)
    message = str(caught.value)
    assert message.startswith(f"file:{folder / 'bad.py'}:"), message
    assert "aten::mm" in message and "float32[64x32]" in message and "float32[32x16]" in message, message
    assert reason in message, message


@pytest.mark.parametrize("case", sorted(BAD_ANSWERS))
def test_with_fallback_a_bad_answer_is_recorded_and_the_core_answers(case, tmp_path, clean):
    template, body, reason = BAD_ANSWERS[case]
    folder = ops_dir(tmp_path, bad=template.format(body=body))
    session = make_session(folder, on_error="fallback")
    ops = run(session)
    assert len(session.resolver.errors) == 1, session.resolver.errors
    error = session.resolver.errors[0]
    assert error.startswith(f"file:{folder / 'bad.py'}:") and "aten::mm" in error and reason in error, error
    assert ops["aten::mm"][0] == "core (properties)"
    assert ops == clean  # every op, the bad plugin's one included, as if it were not there


def test_estimator_error_names_the_function_that_answered(tmp_path):
    """docs/packs.md: the message names the plugin, the function, the op and its input shapes."""
    template, body, _ = BAD_ANSWERS["negative"]
    folder = ops_dir(tmp_path, bad=template.format(body=body))
    with pytest.raises(castcore.EstimatorError) as caught:
        run(make_session(folder))
    assert "bad_mm_estimator" in str(caught.value), str(caught.value)


MUTATES_DEVICE = """
import torch
import castcore

@castcore.register_op_estimator(torch.ops.aten.relu.default)
def relu(invoke, device):
    # A derate applied in place: a plausible pack bug that would slow every later op down.
    for table in (device.mma_flops, device.gp_flops):
        for dtype in table:
            table[dtype] = table[dtype] / 1000
    return 1e-6
"""


def test_plugin_cannot_change_other_ops_by_mutating_the_device(tmp_path, clean):
    folder = ops_dir(tmp_path, derate=MUTATES_DEVICE)
    session = make_session(folder, on_error="fallback")
    before = (dict(session.device("h100-sxm").mma_flops), dict(session.device("h100-sxm").gp_flops))
    ops = run(session)
    after = (dict(session.device("h100-sxm").mma_flops), dict(session.device("h100-sxm").gp_flops))
    assert after == before
    assert ops["aten::mm"] == clean["aten::mm"]
    assert ops["aten::cumsum"] == clean["aten::cumsum"]


# --- unsafe custom-op locations ---------------------------------------------------------------------

MM_2S = """
import torch
import castcore

@castcore.register_op_estimator(torch.ops.aten.mm.default)
def mm(invoke, device):
    return 2.0
"""


def _make_world_writable(path: Path) -> None:
    path.chmod(path.stat().st_mode | stat.S_IWOTH)
    if not path.stat().st_mode & stat.S_IWOTH:  # e.g. a filesystem that ignores chmod; root is not exempt
        pytest.skip(f"chmod o+w has no effect on {path} here")


def test_world_writable_custom_op_directory_is_refused(tmp_path, clean):
    folder = ops_dir(tmp_path, mm=MM_2S)
    _make_world_writable(folder)
    session = make_session(folder)
    info = info_of(session, folder / "mm.py")
    assert info.status == "failed"
    assert "refused" in info.error and "writable by every user" in info.error and str(folder) in info.error
    assert any("writable by every user" in w for w in session.warnings)
    assert run(session) == clean


def test_world_writable_custom_op_file_is_refused_and_its_neighbours_load(tmp_path, clean):
    folder = ops_dir(tmp_path, mm=MM_2S, relu=RELU_3S)
    _make_world_writable(folder / "mm.py")
    session = make_session(folder)
    info = info_of(session, folder / "mm.py")
    assert info.status == "failed"
    assert "writable by every user" in info.error and str(folder / "mm.py") in info.error
    assert info_of(session, folder / "relu.py").status == "loaded"
    ops = run(session)
    assert ops["aten::mm"] == clean["aten::mm"]
    assert ops["aten::relu"][:2] == (f"file:{folder / 'relu.py'} (estimator)", 3.0)


def test_clean_estimates_are_finite_and_from_the_core(clean):
    # Guards the comparisons above: they compare against real, core-made numbers.
    assert set(clean) == {"aten::relu", "aten::mm", "aten::cumsum"}
    assert all(v[0].startswith("core ") and math.isfinite(v[1]) and v[1] > 0 for v in clean.values())
