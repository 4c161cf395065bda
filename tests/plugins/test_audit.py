"""castcore audit and castcore packs, on packs pip-installed for real: winners, conflicts, overrides, uncovered."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parents[1]
THROWAWAY, RIVAL = "castpack-throwaway 9.9.9", "castpack-rival 1.2.3"


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
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
            str(HERE / "packs" / "castpack-rival"),
        ],
        check=True,
    )
    return target


def cli(site: Path | None, *args: str, cwd: Path = HERE) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CASTCORE_")}
    if site:
        env["PYTHONPATH"] = str(site)
    return subprocess.run(
        [sys.executable, "-m", "castcore", *args, "--device-file", str(HERE / "data" / "h100-sxm.toml")],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
    )


def rows_by(done, key=("device", "op")) -> dict:
    assert done.returncode == 0, done.stderr
    return {tuple(row[k] for k in key): row for row in json.loads(done.stdout)}


def test_static_audit_names_winner_shadowed_and_conflict(site):
    rows = rows_by(cli(site, "audit", "--json"))
    mm = rows[("h100-sxm", "aten::mm")]
    # Packs register sorted by name and the last registered is asked first: throwaway beats rival.
    assert mm["winner"]["plugin"] == THROWAWAY
    assert [(c["plugin"], c["kind"]) for c in mm["shadowed"]] == [
        (RIVAL, "estimator"),
        ("core", "properties"),
    ]
    assert mm["status"] == "CONFLICT"


def test_declared_override_is_not_a_conflict(site):
    cumsum = rows_by(cli(site, "audit", "--json"))[("h100-sxm", "aten::cumsum")]
    assert cumsum["status"] == "override"
    assert {THROWAWAY, RIVAL} <= {c["plugin"] for c in [cumsum["winner"], *cumsum["shadowed"]]}


def test_claims_follow_device_globs(site):
    rows = rows_by(cli(site, "audit", "--json"))
    assert rows[("throwaway-npu", "aten::relu")]["winner"]["plugin"] == RIVAL
    assert ("h100-sxm", "aten::relu") not in rows  # rival's relu claim is for throwaway-* only
    assert rows[("h100-sxm", "aten::mm")]["winner"]["function"] == "_mm"


def test_device_and_op_narrow_the_audit(site):
    rows = rows_by(cli(site, "audit", "--json", "--device", "h100-sxm", "--op", "aten::mm"))
    assert list(rows) == [("h100-sxm", "aten::mm")]


def test_strict_fails_on_conflict(site):
    done = cli(site, "audit", "--strict", "--op", "aten::mm")
    assert done.returncode == 1
    assert "CONFLICT" in done.stdout
    assert "--strict" in done.stderr


def test_priority_config_changes_the_winner_and_audit_shows_it(site, tmp_path):
    (tmp_path / "castcore.toml").write_text('priority = ["rival"]\n')
    rows = rows_by(cli(site, "audit", "--json", "--op", "aten::mm", "--device", "h100-sxm", cwd=tmp_path))
    mm = rows[("h100-sxm", "aten::mm")]
    assert mm["winner"]["plugin"] == RIVAL
    assert mm["shadowed"][0]["plugin"] == THROWAWAY


def test_dynamic_audit_shows_who_answers_and_uncovered_ops(site, tmp_path):
    rows = rows_by(
        cli(
            site,
            "audit",
            "--json",
            "--model",
            str(HERE / "data" / "tiny-llama.json"),
            "--seq",
            "8",
            "--device",
            "h100-sxm",
        ),
        key=("op",),
    )
    assert rows[("aten::mm",)]["answered_by"] == [f"{THROWAWAY} (estimator)"]
    # 4 per layer (q/k/v and gate/up merged by the deployed kernels), the head
    assert rows[("aten::mm",)]["calls"] == 9
    assert rows[("aten::mm",)]["status"] == "CONFLICT"
    assert rows[("castcore::attention",)]["answered_by"] == ["core (properties)"]
    no_pack = rows_by(
        cli(None, "audit", "--json", "--model", "factories.tiny_mlp:with_custom_op"), key=("op",)
    )
    assert no_pack[("castcore_factories::mystery",)]["status"] == "UNCOVERED"
    assert no_pack[("castcore_factories::mystery",)]["answered_by"] == ["core (fallback)"]
    assert no_pack[("aten::addmm",)]["status"] == "ok"


def test_packs_json_lists_every_plugin_with_status(site, tmp_path):
    (tmp_path / "broken.py").write_text("def oops(:\n")
    (tmp_path / "fine.py").write_text("import castcore\n")
    done = cli(site, "packs", "--json", "--custom-op-dir", str(tmp_path))
    packs = {row["name"]: row for row in json.loads(done.stdout)}
    assert packs["throwaway"]["distribution"] == "castpack-throwaway"
    assert packs["throwaway"]["version"] == "9.9.9"
    assert packs["throwaway"]["status"] == "loaded"
    assert packs["throwaway"]["claims"] == 2
    assert packs["throwaway"]["hooks"] == ["device_profiles", "estimate_op", "op_properties"]
    assert packs["rival"]["claims"] == 3
    broken = packs[str(tmp_path / "broken.py")]
    assert broken["status"].startswith("failed: could not load (line 1): SyntaxError")
    assert packs[str(tmp_path / "fine.py")]["status"] == "loaded"
    assert "broken.py" in done.stderr  # the failure is also reported, by name, on stderr
