"""The seed RFC's estimator files run with only their import lines changed: its names are castcore's
(``register_op_estimator(op, None, True)``, ``PerformanceModel.Result``, ``OpInvokeInfo`` and its
one-parameter ``register_op_properties``), through the embedded API and the command line alike."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import castcore
import castcore.pack
from castcore.plugins.claims import claims_in

HERE = Path(__file__).parent
DEVICE_FILE = HERE / "data" / "h100-sxm.toml"

# As the RFC writes its two templates and its memory pattern (sections 4.2, 4.3 and 4.6), with castcore's
# import lines, real ops for torch.ops.your_op.Operator, and numbers for calculated_ops.
RFC_FILE = '''\
from castcore import register_op_estimator
from castcore import PerformanceModel
from castcore import OpInvokeInfo
import torch


@register_op_estimator(torch.ops.aten.mm, None, True)
def _estimate_your_op(op_invoke_info, device_profile) -> object:
    """Direct time estimation for any operator type"""
    input_tensors = op_invoke_info.args
    total_elements = sum(tensor.numel() for tensor in input_tensors)
    base_time = 0.001
    compute_time = total_elements * 1e-9
    return PerformanceModel.Result(base_time + compute_time)


@OpInvokeInfo.register_op_properties(torch.ops.aten.cumsum)
def _(op_invoke_info: OpInvokeInfo) -> OpInvokeInfo.PerformanceProperties:
    """Provide detailed analysis properties for operators"""
    properties = op_invoke_info.get_memory_access_properties()
    calculated_ops = op_invoke_info.args[0].numel()
    # Add computation by data type
    compute_ops = properties.compute_ops.setdefault(
        op_invoke_info.args[0].dtype, OpInvokeInfo.ComputeOps())
    compute_ops.mma_ops = calculated_ops
    return properties


@OpInvokeInfo.register_op_properties(torch.ops.aten.relu)
def _(op_invoke_info: OpInvokeInfo) -> OpInvokeInfo.PerformanceProperties:
    input_tensor, output_tensor = op_invoke_info.args[0], op_invoke_info.out
    # Base memory properties
    properties = op_invoke_info.get_memory_access_properties()
    # Update memory read/write
    properties.memory_read_bytes += input_tensor.numel() * input_tensor.element_size()
    properties.memory_write_bytes += output_tensor.numel() * output_tensor.element_size()
    # Add computation by data type
    compute_ops = properties.compute_ops.setdefault(input_tensor.dtype, OpInvokeInfo.ComputeOps())
    compute_ops.gp_ops = input_tensor.numel()
    return properties
'''

MODEL_FILE = """\
import torch

class Model(torch.nn.Module):
    def forward(self, a, b):
        return torch.mm(a.relu(), b).cumsum(0)

def make():
    return Model(), (torch.empty(64, 32, device="meta"), torch.empty(32, 16, device="meta"))
"""

MM_SECONDS = 0.001 + (64 * 32 + 32 * 16) * 1e-9


def _fn(a, b):
    return torch.mm(a.relu(), b).cumsum(0)


def _inputs():
    return torch.empty(64, 32, device="meta"), torch.empty(32, 16, device="meta")


@pytest.fixture(autouse=True)
def _no_castcore_env(monkeypatch):
    for var in (
        "CASTCORE_CUSTOM_OP_PATH",
        "CASTCORE_LOAD_PACKS",
        "CASTCORE_DISABLE_PACKS",
        "CASTCORE_STRICT",
    ):
        monkeypatch.delenv(var, raising=False)


def _project(tmp_path: Path) -> Path:
    """A project whose custom_op/ holds the RFC file; castcore.toml names no pack and the H100 profile."""
    project = tmp_path / "project"
    (project / "custom_op").mkdir(parents=True)
    (project / "castcore.toml").write_text(f'load_packs = []\ndevice_files = ["{DEVICE_FILE}"]\n')
    (project / "custom_op" / "rfc_ops.py").write_text(RFC_FILE)
    (project / "rfc_model.py").write_text(MODEL_FILE)
    return project


def test_the_rfc_names_are_castcores_own_in_both_faces():
    for name in ("register_op_estimator", "OpInvokeInfo", "PerformanceModel"):
        assert getattr(castcore, name) is getattr(castcore.pack, name), name
        assert name in castcore.__all__ and name in castcore.pack.__all__, name
    result = castcore.PerformanceModel.Result(0.25)
    assert isinstance(result, castcore.Estimate) and result.time_s == 0.25
    assert castcore.OpInvokeInfo.PerformanceProperties is castcore.PerformanceProperties
    assert castcore.OpInvokeInfo.ComputeOps is castcore.ComputeOps
    invoke = castcore.OpInvoke(torch.ops.aten.relu.default)
    assert isinstance(invoke, castcore.OpInvokeInfo)  # what an estimator receives is what the RFC calls it


def test_the_rfc_file_answers_through_the_embedded_api(tmp_path):
    project = _project(tmp_path)
    path = project / "custom_op" / "rfc_ops.py"
    session = castcore.Session(
        castcore.Config(), load_packs=[], device_files=[DEVICE_FILE], custom_op_dirs=[project / "custom_op"]
    )
    assert session.warnings == []
    records = {r.invoke.name: r for r in session.estimate(_fn, *_inputs(), device="h100-sxm").records}
    assert str(records["aten::mm"].estimate.source) == f"file:{path} (estimator)"
    assert records["aten::mm"].estimate.time_s == pytest.approx(MM_SECONDS)
    assert str(records["aten::cumsum"].estimate.source) == f"file:{path} (properties)"
    assert records["aten::cumsum"].properties.compute_ops[torch.float32].mma_ops == 64 * 16
    relu = records["aten::relu"].properties
    assert str(records["aten::relu"].estimate.source) == f"file:{path} (properties)"
    assert (relu.memory_read_bytes, relu.memory_write_bytes) == (2 * 64 * 32 * 4, 2 * 64 * 32 * 4)
    assert relu.compute_ops[torch.float32].gp_ops == 64 * 32


def _cli(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CASTCORE_")}
    return subprocess.run(
        [sys.executable, "-m", "castcore", *args], capture_output=True, text=True, cwd=cwd, env=env
    )


def test_the_rfc_file_in_the_projects_custom_op_answers_the_cli_and_passes_a_strict_audit(tmp_path):
    project = _project(tmp_path)
    path = project / "custom_op" / "rfc_ops.py"
    done = _cli(project, "estimate", "--model", "rfc_model:make", "--json", "--strict")
    assert done.returncode == 0, done.stderr
    ops = {row["op"]: row for row in json.loads(done.stdout)["ops"]}
    assert ops["aten::mm"]["source"] == f"file:{path} (estimator)"
    assert ops["aten::mm"]["time_s"] == pytest.approx(MM_SECONDS)
    assert ops["aten::cumsum"]["source"] == ops["aten::relu"]["source"] == f"file:{path} (properties)"

    audit = _cli(project, "audit", "--strict", "--json")
    assert audit.returncode == 0, audit.stdout + audit.stderr
    rows = {row["op"]: row for row in json.loads(audit.stdout)}
    # Every overload of the packets it names; over the core's own formulas for mm and cumsum.
    assert {"aten::mm", "aten::mm.out", "aten::cumsum", "aten::cumsum.out", "aten::relu"} <= set(rows)
    for op in ("aten::mm", "aten::cumsum", "aten::relu"):
        assert rows[op]["winner"]["plugin"] == f"file:{path}", op
        assert rows[op]["status"] == "ok", op
    assert [c["plugin"] for c in rows["aten::mm"]["shadowed"]] == ["core"]
    assert [c["plugin"] for c in rows["aten::cumsum"]["shadowed"]] == ["core"]


CUSTOM_OP = "castcore_rfc_test::scale"


@torch.library.custom_op(CUSTOM_OP, mutates_args=())
def _scale(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@_scale.register_fake
def _(x):
    return torch.empty_like(x)


PACKET_FILE = """\
import torch
from castcore import register_op_estimator, PerformanceModel

@register_op_estimator(torch.ops.castcore_rfc_test.scale, None, True)
def _estimate_scale(op_invoke_info, device_profile):
    return PerformanceModel.Result(0.125)
"""


def test_an_op_overload_packet_claims_the_custom_op_as_torch_ops_ns_op(tmp_path):
    (tmp_path / "scale.py").write_text(PACKET_FILE)
    session = castcore.Session(
        castcore.Config(), load_packs=[], device_files=[DEVICE_FILE], custom_op_dirs=[tmp_path]
    )
    report = session.estimate(
        lambda x: torch.ops.castcore_rfc_test.scale(x), torch.empty(8, device="meta"), device="h100-sxm"
    )
    (record,) = report.records
    assert record.invoke.name == CUSTOM_OP and record.estimate.time_s == 0.125
    claims = next(i for i in session.plugins.infos if i.origin == str(tmp_path / "scale.py")).claims
    assert [c.op for c in claims] == [torch.ops.castcore_rfc_test.scale.default]


@torch.library.custom_op("castcore_rfc_test::never_run", mutates_args=())
def _never_run(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


def test_register_op_properties_takes_one_or_two_parameters_and_refuses_none():
    # Declared here, these claims join every later session in this process: an op nothing runs keeps them inert.
    op = torch.ops.castcore_rfc_test.never_run.default

    def one(invoke):
        return invoke

    def two(invoke, device):
        return device

    castcore.OpInvokeInfo.register_op_properties(op)(one)
    castcore.register_op_properties(op)(two)
    by_fn = {c.fn: c for c in claims_in({__name__})}
    assert by_fn[one].answer("invoke", "device") == "invoke"
    assert by_fn[two].answer("invoke", "device") == "device"
    with pytest.raises(TypeError, match="must take"):
        castcore.register_op_properties(op)(lambda: None)


DEVICE_BOUND = """\
import torch
import castcore

h100 = castcore.load_device_file({device_file!r})

@castcore.register_op_estimator(torch.ops.aten.relu.default, h100, True)
def relu_on_h100(op_invoke_info, device_profile):
    return castcore.PerformanceModel.Result(0.5)
"""


def test_a_device_profile_object_as_the_device_binds_the_claim_to_that_device(tmp_path, simple_profile):
    (tmp_path / "bound.py").write_text(DEVICE_BOUND.format(device_file=str(DEVICE_FILE)))
    session = castcore.Session(
        castcore.Config(), load_packs=[], device_files=[DEVICE_FILE], custom_op_dirs=[tmp_path]
    )
    (claim,) = next(i for i in session.plugins.infos if i.origin == str(tmp_path / "bound.py")).claims
    assert claim.device == "h100-sxm"
    relu = torch.empty(4, device="meta")
    assert session.estimate(torch.relu, relu, device="h100-sxm").records[0].estimate.time_s == 0.5
    assert session.estimate(torch.relu, relu, device=simple_profile).records[0].estimate.time_s != 0.5


def test_a_device_that_is_neither_a_name_nor_a_profile_is_refused():
    with pytest.raises(TypeError, match="DeviceProfile"):
        castcore.register_op_estimator(torch.ops.aten.relu.default, 42)
