"""A claim never silently unused: a whole-op claim that would hide an op a plugin asked earlier claims is
decomposed for it, and a claim the deployed kernels leave unreached is one warning line and an audit row."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import castcore

DATA = Path(__file__).parents[1] / "data"
LLAMA, H100 = str(DATA / "tiny-llama.json"), str(DATA / "h100-sxm.toml")

MM = """
import torch
import pytest

import castcore

@castcore.register_op_estimator(torch.ops.aten.mm.default)
def mm(invoke, device):
    return 1e-3
"""
LINEAR = """
import torch
import pytest

import castcore

@castcore.register_op_estimator(torch.ops.aten.linear.default)
def linear(invoke, device):
    return 2e-3
"""
SILU = """
import torch
import pytest

import castcore

@castcore.register_op_estimator(torch.ops.aten.silu.default)
def silu(invoke, device):
    return 1e-6
"""


def _folder(root: Path, name: str, text: str) -> Path:
    folder = root / name
    folder.mkdir()
    (folder / f"{name}.py").write_text(text)
    return folder


def _session(*folders: Path) -> castcore.Session:
    return castcore.Session(
        load_packs=[], device_files=[H100], custom_op_dirs=list(folders), default_custom_op_dirs=False
    )


def test_an_earlier_claim_on_an_op_a_whole_op_would_hide_takes_effect(tmp_path):
    """The seed RFC's user estimator for aten.mm, with a later plugin keeping aten.linear whole (as castpack-ascend
    does on its devices): the linear calls are captured op by op, and the user's mm answers."""
    mm, linear = _folder(tmp_path, "mine", MM), _folder(tmp_path, "later", LINEAR)
    session = _session(mm, linear)  # the first directory is asked first
    assert torch_op("mm") in session.outranking()[torch_op("linear")]
    report = session.estimate(castcore.build_workload(LLAMA, seq=8))
    names = {r.invoke.name for r in report.records}
    assert "aten::linear" not in names
    mms = [r for r in report.records if r.invoke.name == "aten::mm"]
    assert mms and all(str(r.estimate.source).startswith(f"file:{mm / 'mine.py'}") for r in mms)
    # The other way round, the earlier claim is the whole op's: linear stays whole and answers.
    report = _session(linear, mm).estimate(castcore.build_workload(LLAMA, seq=8))
    linears = [r for r in report.records if r.invoke.name == "aten::linear"]
    assert linears and all(r.estimate.time_s == 2e-3 for r in linears)
    assert "aten::mm" not in {r.invoke.name for r in report.records}


def torch_op(name: str):
    import torch

    return getattr(torch.ops.aten, name).default


def test_a_claim_the_deployed_kernels_replace_is_one_warning_and_an_audit_row(tmp_path):
    silu = _folder(tmp_path, "silu", SILU)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CASTCORE_")}
    base = [sys.executable, "-m", "castcore"]
    plugins = [
        "--model",
        LLAMA,
        "--seq",
        "8",
        "--no-packs",
        "--device-file",
        H100,
        "--custom-op-dir",
        str(silu),
        "--no-default-custom-op-dirs",
    ]
    deployed = subprocess.run([*base, "estimate", *plugins], capture_output=True, text=True, env=env)
    assert deployed.returncode == 0, deployed.stderr
    line = (
        f"castcore: warning: file:{silu / 'silu.py'}: its estimator for aten::silu (silu) is not reached in "
        "this workload: the deployed kernels run castcore::silu_and_mul instead (--eager prices the graph op "
        "by op)"
    )
    assert deployed.stderr.splitlines().count(line) == 1
    eager = subprocess.run([*base, "estimate", *plugins, "--eager"], capture_output=True, text=True, env=env)
    assert eager.returncode == 0 and "not reached" not in eager.stderr
    assert "aten::silu" in eager.stdout and f"file:{silu / 'silu.py'}" in eager.stdout
    audit = subprocess.run(
        [*base, "audit", *plugins, "--op", "aten::silu"], capture_output=True, text=True, env=env
    )
    assert audit.returncode == 0, audit.stderr
    row = next(line for line in audit.stdout.splitlines() if line.startswith("aten::silu"))
    assert "unreached in this workload" in row and "castcore::silu_and_mul runs instead" in row


@pytest.fixture(scope="module")
def ascend_env(tmp_path_factory) -> dict[str, str]:
    """castpack-ascend pip-installed (for real, with its entry points) into a fresh target folder, first on the path."""
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
            str(Path(__file__).parents[2] / "packs" / "castpack-ascend"),
        ],
        check=True,
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("CASTCORE_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(target), env.get("PYTHONPATH")]))
    return env


def _castcore(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "castcore", *args], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    return done


def test_a_pack_whose_own_rewrite_hides_its_estimators_gets_no_warning_but_an_audit_row(ascend_env, tmp_path):
    """castpack-ascend's fused kernels replace the eager ops its own estimators claim (aten::bmm, silu, ...): the
    default device's estimate says nothing of it, audit --model still shows the rows; a custom-op file's claim that
    castpack-ascend's rewrite hides is still one warning."""
    model = ["--model", LLAMA, "--seq", "8", "--no-default-custom-op-dirs"]
    estimate = _castcore(ascend_env, "estimate", *model)
    assert "ascend::prompt_flash_attention" in estimate.stdout and "on ascend-910b3" in estimate.stdout
    assert "warning" not in estimate.stderr and "not reached" not in estimate.stderr
    audit = _castcore(ascend_env, "audit", *model, "--op", "aten::bmm")
    row = next(line for line in audit.stdout.splitlines() if line.startswith("aten::bmm"))
    assert "unreached in this workload" in row and "ascend::prompt_flash_attention runs instead" in row
    assert "castpack-ascend" in row
    silu = _folder(tmp_path, "silu", SILU)
    hidden = _castcore(ascend_env, "estimate", *model, "--custom-op-dir", str(silu))
    warnings = [line for line in hidden.stderr.splitlines() if "not reached" in line]
    assert warnings == [
        f"castcore: warning: file:{silu / 'silu.py'}: its estimator for aten::silu (silu) is not "
        "reached in this workload: the deployed kernels run ascend::swiglu instead (--eager prices "
        "the graph op by op)"
    ]


def test_a_packs_rewrite_note_appears_only_on_the_devices_it_serves(ascend_env):
    serve = ["simulate", "--model", LLAMA, "--requests", "4", "--rate", "5", "--input", "32", "--output", "4"]
    ascend = _castcore(ascend_env, *serve)
    assert "the fused-kernel rewrites of castpack-ascend" in ascend.stderr
    h100 = _castcore(ascend_env, *serve, "--device-file", H100, "--device", "h100-sxm")
    assert "h100-sxm" in h100.stdout and "castpack-ascend" not in h100.stderr + h100.stdout
