"""castcore.partition and `castcore partition`: legal splits, per-device shapes and estimates, the all_reduce."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch

import castcore
from castcore.cli.main import main
from castcore.operator_tools.partition import PartitionError

OPS = textwrap.dedent("""
    import torch
    import castcore

    @castcore.register_op("m k+, k+ n -> m n", name="part_test::matmul")
    def matmul(a, b):
        return a @ b

    @castcore.register_op("4 k+, k+ d -> 8 d", name="part_test::fixed")
    def fixed(a, b):
        return (a @ b).repeat(2, 1)

    @castcore.register_op("(h t) k^ -> h t k^", name="part_test::heads")
    def heads(x, h: int = 8):
        return x.reshape(h, x.shape[0] // h, x.shape[1])
""")

ALL_REDUCE_ESTIMATOR = textwrap.dedent("""
    import torch
    import castcore

    @castcore.register_op_estimator(torch.ops._c10d_functional.all_reduce.default)
    def all_reduce(invoke, device):
        return 1e-3 * invoke.attrs["group_size"]
""")


@pytest.fixture(scope="module")
def ops(tmp_path_factory):
    path = tmp_path_factory.mktemp("ops") / "part_ops.py"
    path.write_text(OPS, encoding="utf-8")
    from castcore.operator_tools.command_line_op import load_target

    return path, load_target(f"{path}:matmul"), load_target(f"{path}:heads")


def bf16(*shape):
    return torch.empty(shape, dtype=torch.bfloat16, device="meta")


def test_every_named_dim_is_listed_with_per_device_shapes(ops, session):
    _, matmul, _ = ops
    plan = castcore.partition(matmul, bf16(4096, 1024), bf16(1024, 2048), ways=4, session=session)
    by_dim = {s.dim: s for s in plan.splits}
    assert list(by_dim) == ["m", "k", "n"] and all(s.legal for s in plan.splits)
    assert by_dim["m"].kind == "spatial" and by_dim["k"].kind == "sum"
    assert by_dim["m"].input_shapes == [(1024, 1024), (1024, 2048)]
    assert by_dim["m"].output_shapes == [(1024, 2048)]
    assert by_dim["k"].input_shapes == [(4096, 256), (256, 2048)]
    assert by_dim["k"].output_shapes == [(4096, 2048)]  # each device holds a partial sum of the whole output
    assert by_dim["m"].collective is None
    assert all(s.estimate.time_s > 0 for s in plan.splits)
    assert by_dim["m"].estimate.time_s < plan.whole.time_s


def test_sum_split_all_reduce_is_unestimated_without_a_plugin(ops, session):
    _, matmul, _ = ops
    plan = castcore.partition(matmul, bf16(64, 64), bf16(64, 64), ways=2, session=session)
    k = next(s for s in plan.splits if s.dim == "k")
    assert k.collective.op == "_c10d_functional::all_reduce"
    assert k.collective.bytes == 64 * 64 * 2 and k.collective.group_size == 2
    assert k.collective.estimate is None and "unestimated" in k.collective.note
    assert k.time_s is None
    assert plan.best().dim in ("m", "n")
    assert "all_reduce unestimated" in plan.format_table()


def test_sum_split_all_reduce_is_timed_by_the_plugin_that_claims_it(ops, h100_file, tmp_path):
    (tmp_path / "ar.py").write_text(ALL_REDUCE_ESTIMATOR, encoding="utf-8")
    tmp_path.chmod(0o700)
    session = castcore.Session(load_packs=[], device_files=[h100_file], custom_op_dirs=[tmp_path])
    _, matmul, _ = ops
    plan = castcore.partition(matmul, bf16(64, 64), bf16(64, 64), ways=4, session=session)
    k = next(s for s in plan.splits if s.dim == "k")
    assert k.collective.time_s == pytest.approx(4e-3)
    assert "ar.py" in str(k.collective.estimate.source)
    assert k.time_s == pytest.approx(k.estimate.time_s + 4e-3)


def test_frozen_and_indivisible_dims_are_illegal_with_a_reason(ops, session):
    _, matmul, heads = ops
    plan = castcore.partition(heads, bf16(1024, 64), ways=4, session=session, h=8)
    by_dim = {s.dim: s for s in plan.splits}
    assert not by_dim["k"].legal and "must not be split" in by_dim["k"].reason
    # splitting the hidden dim h gives each device h=2 and a quarter of the rows
    assert by_dim["h"].legal and by_dim["h"].arguments == {"h": 2}
    assert by_dim["h"].input_shapes == [(256, 64)] and by_dim["h"].output_shapes == [(2, 128, 64)]
    plan = castcore.partition(matmul, bf16(6, 8), bf16(8, 4), ways=4, session=session)
    assert [s.dim for s in plan.legal] == ["k", "n"]
    assert "does not divide" in next(s for s in plan.splits if s.dim == "m").reason


def test_partition_rejects_unregistered_ops_and_bad_ways(session):
    with pytest.raises(PartitionError, match="not registered"):
        castcore.partition(torch.mm, bf16(2, 2), bf16(2, 2), ways=2, session=session)
    with pytest.raises(PartitionError, match="ways"):
        castcore.partition("part_test::matmul", bf16(2, 2), bf16(2, 2), ways=0, session=session)


def test_cli_partition_json(ops, h100_file, capsys, monkeypatch):
    monkeypatch.setenv("CASTCORE_LOAD_PACKS", "")
    path, _, _ = ops
    code = main(
        [
            "partition",
            f"{path}:matmul",
            "--ways",
            "2",
            "--input",
            "512x256",
            "--input",
            "256x128:fp32",
            "--device-file",
            str(h100_file),
        ]
    )
    assert code == 0
    assert "best: split" in capsys.readouterr().out
    code = main(
        [
            "partition",
            f"{path}:heads",
            "--ways",
            "2",
            "--input",
            "64x16",
            "--arg",
            "h=4",
            "--json",
            "--device-file",
            str(h100_file),
        ]
    )
    plan = json.loads(capsys.readouterr().out)
    assert code == 0 and plan["op"] == "part_test::heads"
    assert {s["dim"]: s["legal"] for s in plan["splits"]} == {"h": True, "t": True, "k": False}


def test_cli_partition_errors_are_one_line(ops, h100_file, capsys, monkeypatch):
    monkeypatch.setenv("CASTCORE_LOAD_PACKS", "")
    path, _, _ = ops
    assert main(["partition", f"{path}:nothing", "--ways", "2", "--device-file", str(h100_file)]) == 2
    assert "has no 'nothing'" in capsys.readouterr().err
    assert (
        main(
            [
                "partition",
                f"{path}:matmul",
                "--ways",
                "2",
                "--input",
                "4x8",
                "--input",
                "9x2",
                "--device-file",
                str(h100_file),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "'k' is 9 here but 8" in err and "^" in err


def test_numbers_in_an_annotation_are_lengths_in_every_split(ops, capsys, h100_file):
    path, _, _ = ops
    argv = [
        "partition",
        f"{path}:fixed",
        "--ways",
        "2",
        "--input",
        "4x64",
        "--input",
        "64x32",
        "--json",
        "--no-packs",
        "--device-file",
        str(h100_file),
    ]
    assert main(argv) == 0
    plan = json.loads(capsys.readouterr().out)
    splits = {s["dim"]: s for s in plan["splits"]}
    assert splits["d"]["legal"] and splits["k"]["legal"]
