"""bench/kernels/: gpu_measure.py lists its grid and refuses to run without CUDA; its whole run, with the CUDA calls
pointed at the CPU, writes complete rows; score.py's error for each row is castcore's own estimate / measured - 1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

ROOT = Path(__file__).parents[2]
KERNELS = ROOT / "bench" / "kernels"
sys.path.insert(0, str(KERNELS))  # benchmark code, not castcore's

import gpu_measure  # noqa: E402
import score  # noqa: E402

H100_FILE = str(ROOT / "tests" / "data" / "h100-sxm.toml")


def _script(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(KERNELS / "gpu_measure.py"), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": "", **(env or {})},
    )


def test_list_needs_no_gpu_and_names_every_family():
    done = _script("--list")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    *points, total = lines
    assert {line.split()[0] for line in points} == set(gpu_measure.FAMILIES)
    assert total.startswith(f"{len(points)} points: ") and len(points) == len(
        gpu_measure.grid(gpu_measure.FAMILIES)
    )
    # The brief's grid: 8 m x 9 (n, k) GEMMs each dtype, a quantize per (m, k), 11 prefill shapes per head layout.
    counts = {f: sum(line.split()[0] == f for line in points) for f in gpu_measure.FAMILIES}
    assert counts["gemm_bf16"] == counts["gemm_fp8"] == 72 and counts["fp8_quantize"] == 40
    assert counts["attention_prefill"] == 44 and counts["rms_norm"] == counts["layer_norm"] == 10
    assert counts["swiglu"] == 5
    assert "gemm_bf16          m=16384 n=128256 k=4096  (llama-3 lm_head)" in points
    # Decode points whose K and V pass 8 GiB are left out: batch 128 x 32768 with 8 or 16 KV heads.
    decode = [line for line in points if line.startswith("attention_decode")]
    assert len(decode) == 4 * 4 * 4 - 3
    assert not any("batch=128 seq=1 kv_len=32768" in line and "kv_heads=8 " in line for line in decode)
    # Prefill tokens span 512..32768 at every sequence length.
    prefill = gpu_measure.grid(["attention_prefill"])
    for seq in gpu_measure.PREFILL_SEQ:
        tokens = [p["tokens"] for p in prefill if p["seq"] == seq and p["q_heads"] == 32]
        assert max(tokens) == 32768 and min(tokens) == seq


def test_quick_and_families_choose_subsets():
    done = _script("--list", "--quick", "--families", "rms_norm,gemm_fp8")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "6 points: rms_norm 3, gemm_fp8 3"
    bad = _script("--list", "--families", "gemm")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "unknown family gemm" in bad.stderr


def test_without_cuda_it_says_so_in_one_line_and_exits_2(tmp_path):
    done = _script("--out", str(tmp_path / "k.jsonl"))
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "CUDA is not available" in done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    assert list(tmp_path.iterdir()) == []


class _Event:
    """torch.cuda.Event on the host clock: the calls run on the CPU, synchronously."""

    def __init__(self, enable_timing: bool = False):
        self.at = 0.0

    def record(self):
        self.at = time.perf_counter()

    def synchronize(self):
        pass

    def elapsed_time(self, end: _Event) -> float:
        return (end.at - self.at) * 1e3


@pytest.fixture
def cpu_as_gpu(monkeypatch):
    """gpu_measure's CUDA calls answered on the CPU, with small shapes; graph capture fails (no CUDA)."""
    for name, value in {
        "is_available": lambda: True,
        "synchronize": lambda *a: None,
        "empty_cache": lambda: None,
        "get_device_name": lambda *a: "NVIDIA H100 80GB HBM3",
        "Event": _Event,
        "get_device_properties": lambda *a: SimpleNamespace(multi_processor_count=132),
    }.items():
        monkeypatch.setattr(torch.cuda, name, value)
    small = {
        "DEVICE": "cpu",
        "GEMM_SHAPES": [("small", 64, 32)],
        "GEMM_M": [1, 16],
        "HEADS": [(4, 2), (2, 2)],
        "HEAD_DIM": 16,
        "PREFILL_SEQ": [8, 16],
        "MAX_TOKENS": 32,
        "DECODE_BATCH": [1, 2],
        "DECODE_KV": [8, 32],
        "NORM_TOKENS": [1, 8],
        "NORM_HIDDEN": [64],
        "SWIGLU_HALF": 32,
        "TARGET_S": 1e-4,
    }
    for name, value in small.items():
        monkeypatch.setattr(gpu_measure, name, value)


def test_a_whole_run_writes_every_field_on_every_row(cpu_as_gpu, tmp_path, capsys):
    out = tmp_path / "sub" / "k.jsonl"
    assert gpu_measure.main(["--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["family"] for r in rows] == [p["family"] for p in gpu_measure.grid(gpu_measure.FAMILIES)]
    for row in rows:
        assert row["time_s"] > 0 and gpu_measure.MIN_REPS <= row["reps"] <= gpu_measure.MAX_REPS
        assert row["graph_time_s"] is None and row["cold_graph_time_s"] is None  # no CUDA graphs on the CPU
        assert row["cold_time_s"] > 0 and 1 <= row["copies"] <= gpu_measure.MAX_REPS
        assert row["gpu"] == "NVIDIA H100 80GB HBM3" and row["sm_count"] == 132
        assert row["torch"] == torch.__version__ and row["tool"] == "castcore bench/kernels/gpu_measure.py"
        assert row["date"].endswith("+00:00") and row["op"] == gpu_measure.OPS[row["family"]]
    attention = [r for r in rows if r["family"].startswith("attention")]
    assert {r["gqa"] for r in attention} == {"enable_gqa", "none"}
    assert all(r["backend"] for r in attention) and {r["causal"] for r in attention} == {True, False}
    assert {"m", "n", "k", "layer"} <= rows[0].keys()
    assert sorted(p.name for p in out.parent.iterdir()) == ["k.jsonl"]  # the temp file renamed, none left
    log = capsys.readouterr().out
    assert f"wrote {len(rows)} of {len(rows)} points" in log and "graph capture failed" in log


def test_a_spent_budget_still_writes_what_was_measured(cpu_as_gpu, tmp_path, capsys, monkeypatch):
    clock = iter(range(0, 10**6, 5))  # every look at the clock: 5 s later
    monkeypatch.setattr(gpu_measure, "clock", lambda: next(clock))
    out = tmp_path / "k.jsonl"
    assert gpu_measure.main(["--out", str(out), "--families", "rms_norm,swiglu", "--budget-s", "12"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert 0 < len(rows) < len(gpu_measure.grid(["rms_norm", "swiglu"]))
    assert "budget of 12 s spent" in capsys.readouterr().out


def _row(family: str, time_s: float, **shape) -> dict:
    return {
        "family": family,
        "op": gpu_measure.OPS[family],
        "dtype": "bfloat16",
        **shape,
        "time_s": time_s,
        "graph_time_s": time_s * 0.9,
        "reps": 10,
        "gpu": "NVIDIA H100 80GB HBM3",
        "sm_count": 132,
        "torch": "2.11.0",
        "cuda": "12.8",
        "date": "2026-01-01T00:00:00+00:00",
        "tool": gpu_measure.TOOL,
    }


def test_score_reports_castcores_own_estimate_over_the_measured_time(tmp_path):
    import castcore

    rows = [
        _row("gemm_bf16", 30e-6, layer="made up", m=16, n=6144, k=4096),
        _row("rms_norm", 9e-6, tokens=4096, hidden=4096),
        _row(
            "attention_decode",
            40e-6,
            batch=8,
            seq=1,
            kv_len=2048,
            q_heads=32,
            kv_heads=8,
            head_dim=128,
            tokens=8,
            gqa="enable_gqa",
            causal=False,
            backend="flash_attention",
        ),
    ]
    measured = tmp_path / "k.jsonl"
    measured.write_text("".join(json.dumps(r) + "\n" for r in rows))
    done = subprocess.run(
        [
            sys.executable,
            str(KERNELS / "score.py"),
            str(measured),
            "--device-file",
            H100_FILE,
            "--device",
            "h100-sxm",
            "--fitted",
            "rms_norm",
            "--out",
            str(tmp_path / "score.md"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    scored = json.loads((tmp_path / "score.json").read_text())

    # The same calls, written here by hand, through castcore's public API.
    session = castcore.Session(device_files=[H100_FILE])
    meta = dict(dtype=torch.bfloat16, device="meta")
    gemm = session.estimate(
        torch.mm, torch.empty(16, 4096, **meta), torch.empty(4096, 6144, **meta), device="h100-sxm"
    ).time_s
    norm = session.estimate(
        lambda x, w: F.rms_norm(x, (4096,), w, eps=1e-6),
        torch.empty(4096, 4096, **meta),
        torch.empty(4096, **meta),
        device="h100-sxm",
    ).time_s
    decode = session.estimate(
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True),
        torch.empty(8, 32, 1, 128, **meta),
        torch.empty(8, 8, 2048, 128, **meta),
        torch.empty(8, 8, 2048, 128, **meta),
        device="h100-sxm",
    ).time_s
    expected = [gemm / 30e-6 - 1, norm / 9e-6 - 1, decode / 40e-6 - 1]
    assert [r["error"] for r in scored] == pytest.approx(expected, rel=1e-12)
    assert [r["estimated_s"] for r in scored] == pytest.approx([gemm, norm, decode], rel=1e-12)
    assert scored[0]["ops"] == ["aten::mm"] and scored[1]["ops"] == ["aten::rms_norm"]  # one kernel each

    text = (tmp_path / "score.md").read_text()
    assert text.strip() == done.stdout.strip()
    assert (
        f"| gemm_bf16 | held out | 1 | {abs(expected[0]):.1%} | {abs(expected[0]):.1%} | {expected[0]:+.1%} |"
        in text
    )
    assert f"| rms_norm | fitted | 1 | {abs(expected[1]):.1%} |" in text  # --fitted labels its families
    assert "Fitted, not held out: rms_norm" in text
    assert f"| m=16 n=6144 k=4096 (made up) | 30.00 us | {gemm * 1e6:.2f} us | {expected[0]:+.1%} |" in text


def test_score_summary_statistics():
    results = [
        {"gpu": "g", "profile": "p", "family": "f", "error": e, "measured_s": 1.0, "estimated_s": 1.0 + e}
        for e in (-0.5, -0.1, 0.0, 0.1, 0.3, 1.0)
    ]
    results.append({"gpu": "g", "profile": "p", "family": "f", "skipped": "why"})
    (line,) = score.summarise(results)
    assert line["points"] == 6 and line["skipped"] == 1
    assert line["median_abs_error"] == pytest.approx(0.2)  # |errors| 0, .1, .1, .3, .5, 1
    assert line["p90_abs_error"] == pytest.approx(0.75)
    assert line["bias"] == pytest.approx(0.05) and line["within_20"] == pytest.approx(3 / 6)
    assert [r["error"] for r in line["worst"]] == [1.0, -0.5, 0.3, -0.1, 0.1]


def test_score_maps_gpu_names_to_the_nvidia_packs_profiles():
    import castcore

    # The pack's profile files themselves (the core's tests run with no pack installed).
    profiles = sorted((ROOT / "packs" / "castpack-nvidia" / "castpack_nvidia" / "profiles").glob("*.toml"))
    session = castcore.Session(load_packs=[], device_files=profiles)
    assert set(score.GPU_PROFILES.values()) <= set(session.devices)
    rows = [
        _row("swiglu", 20e-6, tokens=256, hidden=14336) | {"gpu": gpu}
        for gpu in ("NVIDIA H200", "NVIDIA H100 80GB HBM3", "Some Other GPU")
    ]
    scored = score.score(rows, session)
    assert [r["profile"] for r in scored] == ["h200-sxm", "h100-sxm5-80gb", None]
    assert all(r["ops"] == ["aten::silu", "aten::mul.Tensor"] for r in scored[:2])
    assert "no castcore profile for GPU 'Some Other GPU'" in scored[2]["skipped"]
