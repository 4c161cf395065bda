"""Measured-table estimators: exact hits, log-space interpolation, fallback to the roofline, refused tables, audit."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import castcore
from castcore.plugins.audit import static_audit
from castcore.ops.tables import SCHEME_GRID, MeasuredTableError, load_measured_table
from castcore.operator_tools.measured_tables import measure_table

HERE = Path(__file__).parents[1]
SOURCE = "# source: measurement, test bench (made up for the test), 2026-01-01\n"
# mm(a[m,k], b[k,n]): the default key is m,k,k,n; k and n are fixed here, m is measured at 128 and 512.
MM_TABLE = SOURCE + "m,k,k2,n,dtype,time_s\n128,64,64,32,float32,1e-05\n512,64,64,32,float32,1.6e-04\n"
DECLARE = (
    "import torch, castcore\n"
    "castcore.register_measured_table(torch.ops.aten.mm.default, 'tables/mm.csv', device='h100-sxm')\n"
)


def op_dir(tmp_path: Path, table: str = MM_TABLE, declare: str = DECLARE) -> Path:
    """A custom-op directory holding one .py that declares tables/mm.csv (both private, as castcore requires)."""
    ops = tmp_path / "ops"
    (ops / "tables").mkdir(parents=True)
    (ops / "tables" / "mm.csv").write_text(table)
    (ops / "mm_table.py").write_text(declare)
    ops.chmod(0o700)
    return ops


@pytest.fixture
def table_session(tmp_path, h100_file, monkeypatch) -> castcore.Session:
    for var in (
        "CASTCORE_CUSTOM_OP_PATH",
        "CASTCORE_LOAD_PACKS",
        "CASTCORE_DISABLE_PACKS",
        "CASTCORE_STRICT",
    ):
        monkeypatch.delenv(var, raising=False)
    return castcore.Session(load_packs=[], device_files=[h100_file], custom_op_dirs=[op_dir(tmp_path)])


def mm_estimate(session: castcore.Session, m: int, dtype=torch.float32) -> castcore.Estimate:
    a = torch.empty(m, 64, dtype=dtype, device="meta")
    b = torch.empty(64, 32, dtype=dtype, device="meta")
    (record,) = session.estimate(torch.mm, a, b, device="h100-sxm").records
    return record.estimate


def test_exact_hit_returns_the_measured_time(table_session, tmp_path):
    est = mm_estimate(table_session, 512)
    assert est.time_s == 1.6e-04
    assert str(est.source) == f"file:{tmp_path / 'ops' / 'mm_table.py'} (estimator)"
    assert est.detail["lookup"] == "exact"
    assert est.detail["points"] == [{"sizes": [512, 64, 64, 32], "time_s": 1.6e-04, "line": 4, "weight": 1.0}]
    assert "test bench" in est.detail["table_source"]


def test_interpolates_between_two_grid_points_in_log_space(table_session):
    # m = 256 is halfway between 128 and 512 in log2 (7, 8, 9): log t = (log 1e-5 + log 1.6e-4) / 2,
    # so t = sqrt(1e-5 * 1.6e-4) = 4e-5. (Linear interpolation would say 1e-5 + 1.5e-4 / 3 = 6e-5.)
    est = mm_estimate(table_session, 256)
    assert est.time_s == pytest.approx(4e-05, rel=1e-12)
    assert est.detail["lookup"] == "interpolated"
    assert est.detail["scheme"] == SCHEME_GRID
    assert [(p["sizes"], p["weight"]) for p in est.detail["points"]] == [
        ([128, 64, 64, 32], 0.5),
        ([512, 64, 64, 32], 0.5),
    ]


def test_bilinear_interpolation_uses_the_four_corners(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text(
        SOURCE + "m,n,dtype,time_s\n"
        "100,10,bf16,1e-5\n100,1000,bf16,2e-5\n10000,10,bf16,4e-5\n10000,1000,bf16,8e-5\n"
    )
    table = load_measured_table(path)
    # (1000, 100) is the log-midpoint of both axes: the geometric mean of the corners, (1*2*4*8)^(1/4) = 2*sqrt(2).
    est = table.lookup_sizes((1000, 100), torch.bfloat16)
    assert est.time_s == pytest.approx(2 * math.sqrt(2) * 1e-5, rel=1e-12)
    assert len(est.detail["points"]) == 4
    # On an edge only the two points of that edge count: (100, 100) is halfway between 1e-5 and 2e-5.
    edge = table.lookup_sizes((100, 100), "bfloat16")
    assert edge.time_s == pytest.approx(math.sqrt(2) * 1e-5, rel=1e-12)
    assert [p["sizes"] for p in edge.detail["points"]] == [[100, 10], [100, 1000]]


def test_scattered_points_use_nearest_neighbours_and_say_so(tmp_path):
    path = tmp_path / "t.csv"
    # (10000, 10) is missing: not a full grid
    path.write_text(
        SOURCE + "m,n,dtype,time_s\n100,10,float32,1e-5\n10000,1000,float32,4e-5\n100,1000,float32,2e-5\n"
    )
    est = load_measured_table(path).lookup_sizes((1000, 100), torch.float32)
    assert est.detail["lookup"] == "nearest"
    assert "[10000, 10] is not measured" in est.detail["note"]
    assert 1e-5 < est.time_s < 4e-5
    assert sum(p["weight"] for p in est.detail["points"]) == pytest.approx(1.0, abs=1e-5)


def test_outside_the_range_or_dtype_falls_back_to_the_core_roofline(table_session, session):
    for m, dtype in ((1024, torch.float32), (64, torch.float32), (256, torch.bfloat16)):
        est = mm_estimate(table_session, m, dtype)
        core = mm_estimate(session, m, dtype)  # the same call with no table at all
        assert str(est.source) == "core (properties)"
        assert est.time_s == core.time_s
        assert "lookup" not in est.detail


def test_a_table_without_source_is_refused_naming_the_file(tmp_path):
    ops = op_dir(tmp_path, table=MM_TABLE.replace(SOURCE, "# measured last week\n"))
    with pytest.raises(MeasuredTableError, match=r"tables/mm\.csv: no source"):
        load_measured_table(ops / "tables" / "mm.csv")
    # Declared from a custom-op file, the bad table fails that plugin, by name, and the core answers alone.
    session = castcore.Session(load_packs=[], custom_op_dirs=[ops])
    (info,) = [i for i in session.plugins.infos if i.kind == "file"]
    assert info.status == "failed"
    assert "MeasuredTableError" in info.error and "mm.csv: no source" in info.error
    assert info.claims == []


@pytest.mark.parametrize(
    "bad_row, message",
    [
        ("256,64,64,32,float32", r"line 5: 5 fields, but the header has 6"),
        ("256,64,sixty-four,32,float32,1e-5", r"line 5: k2 is 'sixty-four', not a number"),
        ("256,64,64,32,float32,-1e-5", r"line 5: time_s is '-1e-5'; it must be a positive"),
        ("256,64,64,32,floaty,1e-5", r"line 5: dtype 'floaty' is not a torch dtype"),
        ("128,64,64,32,float32,2e-5", r"line 5: repeats the point of line 3"),
    ],
)
def test_a_malformed_row_is_refused_naming_the_line(tmp_path, bad_row, message):
    path = tmp_path / "mm.csv"
    path.write_text(MM_TABLE + bad_row + "\n")
    with pytest.raises(MeasuredTableError, match=rf"mm\.csv, {message}"):
        load_measured_table(path)


def test_key_function_and_path_relative_to_the_declaring_file(tmp_path, h100_file):
    declare = (
        "import torch, castcore\n"
        "def mnk(invoke):\n"
        "    a, b = invoke.args\n"
        "    return a.shape[0], b.shape[1], a.shape[1]\n"
        "castcore.register_measured_table(torch.ops.aten.mm.default, 'tables/mm.csv', device='h100-*', key=mnk)\n"
    )
    ops = op_dir(tmp_path, table=SOURCE + "m,n,k,dtype,time_s\n128,32,64,float32,3e-6\n", declare=declare)
    session = castcore.Session(load_packs=[], device_files=[h100_file], custom_op_dirs=[ops])
    est = mm_estimate(session, 128)
    assert est.time_s == 3e-6 and est.detail["key"] == {"m": 128, "n": 32, "k": 64}
    audit = static_audit(session, ["h100-sxm"], op="aten::mm")
    assert str(audit[0].winner) == f"file:{ops / 'mm_table.py'} (estimator)"
    assert audit[0].winner.function == "measured_table[mm.csv]"


def test_measure_table_writes_a_sourced_table_that_reads_back(tmp_path):
    cases = [
        (torch.empty(8, 4, device="meta"), torch.empty(4, 2, device="meta")),
        (torch.empty(16, 4, device="meta"), torch.empty(4, 2, device="meta")),
    ]
    table = measure_table(
        torch.ops.aten.mm.default,
        cases,
        tmp_path / "mm.csv",
        columns=("m", "k", "k2", "n"),
        warmup=1,
        repeat=3,
    )
    lines = (tmp_path / "mm.csv").read_text().splitlines()
    assert lines[0].startswith("# source: measurement, castcore measure_table of aten::mm")
    assert lines[1] == "m,k,k2,n,dtype,time_s"
    measured = table.points["float32"][(16.0, 4.0, 4.0, 2.0)][0]
    assert measured > 0
    assert table.lookup_sizes((16, 4, 4, 2), torch.float32).time_s == measured


FACTORY = """
import torch

class TwoMatmuls(torch.nn.Module):
    def forward(self, x, w_small, y, w_large):
        return torch.mm(x, w_small).sum() + torch.mm(y, w_large).sum()

def make():
    f = torch.float32
    # (256 x 64) @ (64 x 32) lies inside the table; (4096 x 64) @ (64 x 32) beyond its largest m, 512.
    return TwoMatmuls(), (torch.empty(256, 64, dtype=f), torch.empty(64, 32, dtype=f),
                          torch.empty(4096, 64, dtype=f), torch.empty(64, 32, dtype=f))
"""


def test_dynamic_audit_shows_the_table_and_the_roofline_answering_one_op(tmp_path):
    ops = op_dir(tmp_path)
    factories = tmp_path / "factories"
    factories.mkdir(mode=0o700)
    (factories / "two_matmuls.py").write_text(FACTORY)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CASTCORE_")}
    env["PYTHONPATH"] = str(factories)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "castcore",
            "audit",
            "--json",
            "--model",
            "two_matmuls:make",
            "--custom-op-dir",
            str(ops),
            "--no-packs",
            "--device-file",
            str(HERE / "data" / "h100-sxm.toml"),
            "--device",
            "h100-sxm",
            "--op",
            "aten::mm",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    (mm,) = json.loads(done.stdout)
    assert mm["op"] == "aten::mm" and mm["calls"] == 2
    assert mm["answered_by"] == [f"file:{ops / 'mm_table.py'} (estimator)", "core (properties)"]
    assert mm["status"] == "ok"
