"""The fidelity report's Ascend part (bench/fidelity/): which Ascend points are fitted on castpack-ascend's
profiles, and the section that scores them apart from the rest."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]
PACK_PROFILES = ROOT / "packs" / "castpack-ascend" / "castpack_ascend" / "profiles"
sys.path.insert(0, str(ROOT / "bench"))  # the fidelity code is benchmark code, not castcore's
from fidelity import report  # noqa: E402
from fidelity.published import load_points, make_session  # noqa: E402
from fidelity.split import split_point  # noqa: E402


def _row(i, category, split, error, device, family=None):
    return {
        "id": i,
        "category": category,
        "device": device,
        "split": split,
        "error_pct": error,
        "family": family,
        "measured": 100.0,
        "estimated": 100.0 + error,
        "unit": "tokens/s",
    }


def test_the_ascend_section_scores_castpack_ascends_points_apart_and_judges_their_throughput():
    throughput = "output throughput"
    rows = [
        _row("a-gemm", "gemm", "fitted", 5.0, "ascend-910b2"),
        _row("a-tput1", "simulate", "held-out", 30.0, "ascend-910b3", throughput),
        _row("a-tput2", "simulate", "held-out", 10.0, "ascend-910b3", throughput),
        _row("a-ttft", "simulate", "held-out", -40.0, "ascend-910b3", "TTFT"),
        _row("n-gemm", "gemm", "held-out", 90.0, "h100-sxm5-80gb"),  # not on an Ascend profile
    ]
    summary = report.summarize(rows)
    ascend = summary["ascend"]
    assert ascend["devices"] == ["ascend-910b2", "ascend-910b3"]
    assert (
        ascend["by_split"]["fitted"]["GEMM"]["points"] == 1
        and ascend["by_split"]["held-out"]["GEMM"]["points"] == 0
    )
    assert ascend["by_split"]["held-out"]["serving TTFT"]["worst_id"] == "a-ttft"
    assert (ascend["throughput_median_pct"], ascend["target_met"]) == (20.0, True)
    assert summary["by_split"]["held-out"]["GEMM"]["worst_id"] == "n-gemm"  # the other targets' points only
    assert summary["continuous_batching"]["counts"]["points"] == 0 and summary["counts"]["points"] == 5
    text = "\n".join(report.ascend_lines({"summary": summary, "rows": rows}))
    assert "| serving output throughput | held-out | 2 | 20.0% | 30.0% | a-tput1 |" in text
    assert "n-gemm" not in text and "target <= 20%): met" in text
    assert "| a-tput1 | ascend-910b3 | held-out | 100 tokens/s | 130 | +30.0% |" in text  # each serving point
    assert "| a-gemm | ascend-910b2 |" not in text  # a kernel is listed with every point


def test_ascend_points_are_fitted_only_where_castpack_ascend_cites_their_document():
    session = make_session(
        packs=(), device_files=sorted(PACK_PROFILES.glob("*.toml"))
    )  # the tests session has no pack
    profiles = {name: session.device(name).sources for name in ("ascend-910b2", "ascend-910b3")}
    ascend = [p for p in load_points() if p["device"].startswith("ascend-")]
    split = {p["id"]: split_point(p, profiles[p["device"]])[0] for p in ascend}
    fitted = {i for i, s in split.items() if s == "fitted"}
    # The 910B2 matmuls and the two head_dim-128 fused-attention calls set the constants; the rest is held out.
    assert fitted == {i for i in split if i.startswith("910b2-gemm-") or i.endswith("-hd128")}
    assert len(fitted) == 12 and split["910b2-fia-q2048-kv8192-hd32"] == "held-out"
    assert sum(i.startswith("cb-910b-") for i in split) == 12
