"""Every published point (published.json) estimated the way its workload ran, on the profile of its device.

Each row gives the estimate in the source's own metric and unit (TFLOPS by the source's work count, GB/s, us, ms,
tokens/s) and the signed error (estimated - measured) / measured in that metric: for a time a positive error
means castcore is slower than measured, for a rate or throughput it means castcore is faster. A point castcore
cannot express as the source ran it is reported with the reason, never dropped.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from castcore.devices.profile import DeviceError
from castcore.workload.spec import ModelError

from fidelity.collectives import estimate_collective, plan_collective
from fidelity.ops import NotExpressible, OpPlan, plan_op
from fidelity.serving import estimate_serve, plan_serve
from fidelity.simulated import METRICS, estimate_simulate, plan_simulate
from fidelity.split import split_point

HERE = Path(__file__).parent
PUBLISHED = HERE / "published.json"
CATEGORIES = {
    "gemm": "GEMM",
    "attention": "attention",
    "memory": "memory-bound",
    "collective": "collectives",
    "serve": "end-to-end",
    "simulate": "continuous batching",
}
OP_LEVEL = ("gemm", "attention", "memory", "collective")
# the profiles of every point's device, and collectives' pricing
PACKS = ("nvidia", "amd", "ascend", "collectives")


def load_points(path: Path = PUBLISHED) -> list[dict[str, Any]]:
    return json.loads(path.read_text(encoding="utf-8"))["points"]


def make_session(packs: tuple[str, ...] = PACKS, device_files: Iterable[str | Path] = ()):
    """A session with only these packs (and device files), untouched by config files and CASTCORE_* variables."""
    from castcore.plugins.config import Config
    from castcore.session import Session

    from importlib.metadata import entry_points

    # Only the packs installed here: a point on a device no installed pack provides is reported, not fatal.
    installed = {ep.name for ep in entry_points(group="castcore")}
    return Session(
        Config(load_packs=tuple(p for p in packs if p in installed)),
        device_files=[str(p) for p in device_files] or None,
    )


def plan(point: dict[str, Any]):
    """What to run for a point: an OpPlan, a collective or serve plan (dicts), or NotExpressible."""
    category = point["category"]
    if point["workload"].get("not_expressible"):  # the reason the point's reader recorded with it
        return NotExpressible(point["workload"]["not_expressible"])
    if category in ("gemm", "attention", "memory"):
        return plan_op(point)
    if category == "collective":
        return plan_collective(point)
    if category == "serve":
        return plan_serve(point)
    if category == "simulate":
        return plan_simulate(point)
    return NotExpressible(f"unknown category {category!r}")


def percentage_error(estimated: float, measured: float) -> float:
    """Signed error of an estimate in percent of the measurement."""
    if not measured > 0:
        raise ValueError(f"a measured figure must be positive, not {measured!r}")
    return (estimated - measured) / measured * 100.0


def op_figure(seconds: float, measured: dict[str, Any], work: float) -> float:
    """An op's estimated seconds in the source's unit: a rate over the source's work count, or a time."""
    unit = measured["unit"]
    if unit == "TFLOPS":
        return work / seconds / 1e12
    if unit == "GB/s":
        return work / seconds / 1e9
    return seconds * {"s": 1.0, "ms": 1e3, "us": 1e6}[unit]


def estimate_op(session, profile, op: OpPlan) -> dict[str, Any]:
    import castcore

    captured = castcore.capture(op.fn, *op.inputs, whole_ops=session.whole_ops(profile))
    report = session.estimate_capture(captured, profile)
    slowest = max(report.records, key=lambda r: r.estimate.time_s)
    rates = {k: v for r in report.records for k, v in ((r.estimate.detail or {}).get("rates") or {}).items()}
    how = {"calls": [r.invoke.name for r in report.records], "bound": slowest.estimate.bound, "rates": rates}
    tiling = (slowest.estimate.detail or {}).get("tiling")
    if isinstance(tiling, dict):
        how["tiling"] = tiling
    # A dtype the profile lists no rate for is priced at another's: say which, it moves the estimate.
    fallbacks = [f"{unit} work priced at the {used} rate" for unit, used in rates.items() if "(no " in used]
    return {"estimated_s": report.time_s, "how": how, "notes": [*op.notes, *fallbacks]}


def estimate_point(point: dict[str, Any], session, profile) -> dict[str, Any]:
    """One row: the point, its split on ``profile``, and its estimate (or why there is none)."""
    measured = point["measured"]
    split, fitted_by = split_point(point, profile.sources)
    row: dict[str, Any] = {
        "id": point["id"],
        "category": point["category"],
        "device": profile.name,
        "split": split,
        "fitted_by": fitted_by,
        "measured": measured["value"],
        "unit": measured["unit"],
        "metric": _metric(point),
        "framework": point.get("framework"),
        "date": point.get("date"),
        "source_note": point.get("note", ""),
    }
    # the report groups these by metric family (fidelity.simulated.FAMILIES)
    if point["category"] == "simulate":
        row.update(
            family=METRICS.get(point["workload"].get("metric"), ("", ""))[1],
            engine=point["workload"].get("engine"),
            scheduling=point["workload"].get("scheduling"),
        )
    planned = plan(point)
    if isinstance(planned, NotExpressible):
        row["not_expressible"] = planned.reason
        return row
    try:
        result = _estimate(session, profile, point, planned)
    except ModelError as exc:  # castcore refuses the request as stated: its one-line reason
        row["not_expressible"] = f"castcore refuses it: {exc}"
        return row
    row.update(
        workload=result.pop("describe"),
        estimated=result["estimated"],
        error_pct=percentage_error(result["estimated"], measured["value"]),
        how=result["how"],
        notes=result["notes"],
        seconds_to_estimate=result["seconds"],
    )
    return row


def _estimate(session, profile, point: dict[str, Any], planned) -> dict[str, Any]:
    started = time.perf_counter()
    measured = point["measured"]
    if isinstance(planned, OpPlan):
        result = estimate_op(session, profile, planned)
        result["estimated"] = op_figure(result["estimated_s"], measured, planned.work)
        result["describe"] = planned.describe
    elif point["category"] == "collective":
        result = estimate_collective(session, profile, point, planned)
        result["describe"] = planned["describe"]
    elif point["category"] == "simulate":
        result = estimate_simulate(session, profile, point, planned)
        result["describe"] = planned["describe"]
    else:
        result = estimate_serve(session, profile, point, planned)
        result["describe"] = planned["describe"]
    result["seconds"] = time.perf_counter() - started
    return result


def run_published(
    points: list[dict[str, Any]] | None = None,
    session=None,
    profiles: dict[str, Any] | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """Every point's row. ``profiles`` maps a point's device name to the profile to use (default: the session's
    profile of that name); a device with no profile is reported as skipped."""
    points = load_points() if points is None else points
    session = session or make_session()
    rows = []
    for point in points:
        profile = (profiles or {}).get(point["device"])
        if profile is None:
            try:
                profile = session.device(point["device"])
            except DeviceError as exc:  # a pack not installed: say so, estimate the rest
                rows.append(
                    {
                        "id": point["id"],
                        "category": point["category"],
                        "device": point["device"],
                        "split": "unknown",
                        "measured": point["measured"]["value"],
                        "unit": point["measured"]["unit"],
                        "skipped": str(exc),
                    }
                )
                continue
        row = estimate_point(point, session, profile)
        rows.append(row)
        if progress:
            progress(_progress_line(row))
    return rows


def _metric(point: dict[str, Any]) -> str:
    """What the figure is, beyond its unit: busbw/algbw/time for a collective, the serve metric and per what."""
    measured, workload = point["measured"], point["workload"]
    if point["category"] == "collective":
        return measured.get("metric", "")
    if point["category"] in ("serve", "simulate"):
        per = {"device": ", per GPU", "system": ", whole system"}.get(measured.get("per", ""), "")
        return f"{workload.get('metric', '')}{per}"
    return ""


def _progress_line(row: dict[str, Any]) -> str:
    if "not_expressible" in row:
        return f"{row['id']:<48} not expressible: {row['not_expressible']}"
    return (
        f"{row['id']:<48} {row['split']:<8} measured {row['measured']:>10.4g} {row['unit']:<8} "
        f"estimated {row['estimated']:>10.4g}  {row['error_pct']:+7.1f}%"
    )
