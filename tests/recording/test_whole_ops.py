"""Whole ops: a CompositeImplicitAutograd op a plugin claims is captured as one call its claim answers, not
as its decomposition; unclaimed ones decompose as before, and the audit shows claims that cannot answer."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch

import castcore
from castcore.plugins import audit
from castcore.recording.recorder import CaptureError
from castcore.recording.whole import decomposes, kept_whole
from tests.plugin_files import ops_dir

DATA = Path(__file__).parents[1] / "data"
DEVICE = "h100-sxm"
aten = torch.ops.aten

# A torch.library op implemented only by its decomposition, as a user library would register one.
_LIB = torch.library.Library("castcore_whole_test", "DEF")
_LIB.define("double_mm(Tensor a, Tensor b) -> Tensor")
_LIB.impl("double_mm", lambda a, b: torch.mm(a, b) * 2, "CompositeImplicitAutograd")
DOUBLE_MM = torch.ops.castcore_whole_test.double_mm.default


def claims(*ops: str, seconds: float = 1e-3) -> str:
    """A custom-op file claiming each op (``torch.ops...`` expression) with a fixed time."""
    lines = ["import torch", "import castcore"]
    for i, op in enumerate(ops):
        lines += [
            f"@castcore.register_op_estimator({op})",
            f"def claim_{i}(invoke, device):",
            f"    return {seconds}",
            "",
        ]
    return "\n".join(lines)


@pytest.fixture(autouse=True)
def _env(monkeypatch):
    for var in (
        "CASTCORE_CUSTOM_OP_PATH",
        "CASTCORE_LOAD_PACKS",
        "CASTCORE_DISABLE_PACKS",
        "CASTCORE_STRICT",
    ):
        monkeypatch.delenv(var, raising=False)


def make_session(tmp_path: Path, *ops: str) -> castcore.Session:
    dirs = [ops_dir(tmp_path, whole=claims(*ops))] if ops else []
    return castcore.Session(custom_op_dirs=dirs, load_packs=[], device_files=[DATA / "h100-sxm.toml"])


def names(report) -> list[str]:
    return [r.invoke.name for r in report.records]


def meta(*shape: int) -> torch.Tensor:
    return torch.empty(*shape, device="meta")


def test_a_claimed_library_op_is_one_call_its_claim_answers(tmp_path):
    session = make_session(tmp_path, "torch.ops.castcore_whole_test.double_mm.default")
    report = session.estimate(
        lambda a, b: torch.ops.castcore_whole_test.double_mm(a, b), meta(8, 4), meta(4, 2), device=DEVICE
    )
    (record,) = report.records
    assert record.invoke.op is DOUBLE_MM
    assert [t.shape for t in record.invoke.inputs()] == [(8, 4), (4, 2)]
    assert record.invoke.outputs()[0].shape == (8, 2)
    assert str(record.estimate.source) == f"file:{tmp_path / 'ops' / 'whole.py'} (estimator)"
    assert record.estimate.time_s == 1e-3


def test_unclaimed_it_decomposes_as_before(tmp_path):
    session = make_session(tmp_path)
    report = session.estimate(
        lambda a, b: torch.ops.castcore_whole_test.double_mm(a, b), meta(8, 4), meta(4, 2), device=DEVICE
    )
    assert names(report) == ["aten::mm", "aten::mul.Tensor"]


def test_only_the_device_a_claim_covers_keeps_the_op_whole(tmp_path):
    folder = ops_dir(
        tmp_path,
        other="import torch\nimport castcore\n\n"
        "@castcore.register_op_estimator(torch.ops.aten.linear.default, device='other-*')\n"
        "def linear(invoke, device):\n    return 1.0\n",
    )
    session = castcore.Session(custom_op_dirs=[folder], load_packs=[], device_files=[DATA / "h100-sxm.toml"])
    assert aten.linear.default not in session.whole_ops(DEVICE)
    assert aten.linear.default in session.whole_ops()  # no device: the claims for any
    report = session.estimate(torch.nn.functional.linear, meta(3, 8), meta(4, 8), device=DEVICE)
    assert "aten::linear" not in names(report)


def test_claimed_linear_answers_for_nn_linear_and_matmul_for_the_operator(tmp_path):
    session = make_session(tmp_path, "torch.ops.aten.linear.default", "torch.ops.aten.matmul.default")
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8, bias=False))
    report = session.estimate(model.to("meta"), meta(2, 5, 16), device=DEVICE)
    # bias-free linear's matmul is inside
    assert names(report) == [
        "aten::linear",
        "aten::relu",
        "aten::linear",
    ]
    assert [r.invoke.module for r in report.records] == ["Sequential.0", "Sequential.1", "Sequential.2"]
    first = report.records[0].invoke
    assert [t.shape for t in first.inputs()] == [(2, 5, 16), (32, 16), (32,)]
    assert first.outputs()[0].shape == (2, 5, 32)
    assert {
        str(r.estimate.source).split(" (")[0] for r in report.records if r.invoke.name == "aten::linear"
    } == {f"file:{tmp_path / 'ops' / 'whole.py'}"}
    report = session.estimate(lambda a, b: a @ b, meta(3, 4, 8), meta(8, 2), device=DEVICE)
    assert names(report) == ["aten::matmul"]


def test_reuse_replays_whole_ops_exactly(tmp_path):
    session = make_session(tmp_path, "torch.ops.aten.linear.default")
    reports = [
        session.estimate(
            castcore.build_workload(str(DATA / "tiny-llama.json"), seq=16, reuse=reuse), device=DEVICE
        )
        for reuse in (False, True)
    ]
    full, reused = reports
    assert Counter(names(full))["aten::linear"] == 9  # 4 per layer (q/k/v and gate/up merged) and the head
    assert [(r.invoke.key, r.invoke.module) for r in reused.records] == [
        (r.invoke.key, r.invoke.module) for r in full.records
    ]
    assert reused.time_s == full.time_s
    assert reused.memory.to_dict() == full.memory.to_dict()


def test_a_training_step_keeps_the_forward_whole_and_backpropagates_through_the_decomposition(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8)).to("meta")
    claimed = make_session(tmp_path, "torch.ops.aten.linear.default").estimate(
        model, meta(4, 16), train=True, device=DEVICE
    )
    plain = make_session(tmp_path / "plain").estimate(model, meta(4, 16), train=True, device=DEVICE)
    # The forward's t + addmm per layer became one linear; the backward is the same calls either way.
    assert Counter(names(plain)) - Counter(names(claimed)) == {"aten::t": 2, "aten::addmm": 2}
    assert Counter(names(claimed)) - Counter(names(plain)) == {"aten::linear": 2}
    addmm = sum(r.estimate.time_s for r in plain.records if r.invoke.name == "aten::addmm")
    assert claimed.time_s == pytest.approx(plain.time_s - addmm + 2 * 1e-3)


def test_on_dtensors_a_claimed_op_decomposes(tmp_path):
    # DTensor runs only the ops it decomposes into, and the local shards of those are what a device runs. The
    # eager graph shards every projection as a DTensor (deployed, the merged qkv_proj is sharded by hand: plain
    # tensors, on which a claim holds).
    workload = castcore.build_workload(str(DATA / "tiny-llama.json"), seq=16, tp=2, fuse=False)
    claimed = make_session(tmp_path, "torch.ops.aten.linear.default").estimate(workload, device=DEVICE)
    plain = make_session(tmp_path / "plain").estimate(workload, device=DEVICE)
    assert names(claimed) == names(plain)


def test_the_kernel_is_gone_after_a_capture_even_a_failed_one():
    assert decomposes(aten.linear.default) and decomposes(DOUBLE_MM)
    assert not decomposes(aten.mm.default)  # has kernels of its own: a dispatch mode sees it anyway
    castcore.capture(torch.nn.functional.linear, meta(3, 8), meta(4, 8), whole_ops={aten.linear.default})

    def fails(x):
        raise CaptureError("boom")

    with pytest.raises(CaptureError):
        castcore.capture(fails, meta(3), whole_ops={aten.linear.default})
    assert decomposes(aten.linear.default)
    with kept_whole(None, [aten.linear.default]):
        assert not decomposes(aten.linear.default)  # while installed, AutogradCPU has a kernel of its own
        # Outside a capture (no recording mode on the stack) it runs the decomposition.
        assert torch.nn.functional.linear(torch.ones(2, 3), torch.ones(4, 3)).tolist() == [[3.0] * 4] * 2


def test_static_audit_lists_as_winners_only_claims_that_can_answer(tmp_path):
    session = make_session(tmp_path, "torch.ops.aten.linear.default", "torch.ops.prim.device.default")
    rows = {r.op: r for r in audit.static_audit(session, [DEVICE])}
    # kept whole: the file answers, the core's formula is behind it
    assert rows["aten::linear"].status == "ok"
    assert str(rows["aten::linear"].winner) == f"file:{tmp_path / 'ops' / 'whole.py'} (estimator)"
    assert [c.plugin for c in rows["aten::linear"].shadowed] == ["core"]
    # only the core claims it: its formula never answers
    assert rows["aten::matmul"].status == audit.DECOMPOSED
    assert rows["aten::matmul"].winner is None
    assert [c.plugin for c in rows["aten::matmul"].shadowed] == ["core"]
    assert rows["aten::matmul"].to_dict()["winner"] is None
    assert rows["prim::device"].status == audit.NOT_RECORDED and rows["prim::device"].winner is None
    text = audit.format_audit(list(rows.values()))
    assert next(line for line in text.splitlines() if line.startswith("aten::matmul ")).split()[1:3] == [
        "decomposed",
        "-",
    ]
    assert text.splitlines()[-1].endswith(f"1 not recorded among {len(rows)} rows")


def test_dynamic_audit_shows_the_claim_answering_the_whole_op(tmp_path):
    session = make_session(tmp_path, "torch.ops.aten.linear.default")
    workload = castcore.build_workload(str(DATA / "tiny-llama.json"), seq=8)
    from castcore.deploy.pipeline import capture_workload

    _, captured = capture_workload(session, workload, session.device(DEVICE))
    rows = {r.op: r for r in audit.dynamic_audit(session, captured, DEVICE)}
    assert rows["aten::linear"].calls == 9  # 4 per layer (q/k/v and gate/up merged) and the head
    assert rows["aten::linear"].answered_by == [f"file:{tmp_path / 'ops' / 'whole.py'} (estimator)"]
    assert "aten::addmm" not in rows and "aten::mm" not in rows
