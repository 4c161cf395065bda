"""bench/scale.py end to end on a tiny config: it runs, writes its JSON, and its figures hang together."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent


def test_scale_bench_writes_consistent_figures(tmp_path):
    out = tmp_path / "scale.json"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "scale.py"),
            "--models",
            "tests/data/tiny-llama.json",
            "--seq",
            "32",
            "--warmup-seq",
            "8",
            "--decode-batch",
            "2",
            "--kv-len",
            "40",
            "--tp",
            "2",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    (result,) = json.loads(out.read_text())["results"]
    rows = result["rows"]
    assert list(rows) == [
        "castcore estimate",
        "castcore estimate --no-reuse",
        "bare capture (no reuse)",
        "FlopCounterMode",
        "castcore estimate --phase decode",
        "castcore estimate --phase decode --no-reuse",
        "castcore estimate --tp 2",
        "castcore estimate --tp 2 --no-reuse",
    ]
    assert result["totals_identical_with_reuse"] is True
    assert result["variants_identical_with_reuse"] == {"--phase decode": True, "--tp 2": True}
    for label in ("--phase decode", "--tp 2"):
        reused, full = rows[f"castcore estimate {label}"], rows[f"castcore estimate {label} --no-reuse"]
        assert reused["op_calls"] == full["op_calls"] and reused["flops"] == full["flops"]
        assert reused["over_reused_prefill"] == reused["seconds"] / rows["castcore estimate"]["seconds"]
        assert f"{label} over reused prefill" in done.stdout
    assert all(row["seconds"] > 0 and row["peak_rss_mib"] > 0 for row in rows.values())
    no_reuse = rows["castcore estimate --no-reuse"]
    assert no_reuse["capture_seconds"] + no_reuse["estimation_seconds"] <= no_reuse["seconds"]
    assert (
        result["estimate_over_bare_capture"] == no_reuse["estimation_seconds"] / no_reuse["capture_seconds"]
    )
    # FlopCounterMode counts matmul and attention FLOPs only; castcore counts those and every other op.
    assert 0 < rows["FlopCounterMode"]["flops"] <= rows["castcore estimate"]["flops"]
    assert "FlopCounterMode / castcore estimate" in done.stdout
    assert "| castcore estimate |" in out.with_suffix(".md").read_text()


def test_scale_bench_names_a_model_it_cannot_build(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "scale.py"),
            "--models",
            "no-such-model",
            "--out",
            str(tmp_path / "scale.json"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode != 0
    assert "measuring no-such-model failed" in done.stderr
