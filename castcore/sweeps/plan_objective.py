"""What a plan ranks by (``--objective``), and, across device types, the best layout each type searched offers
under it and how far each falls behind the winner, so a buyer comparing NVIDIA, AMD and Ascend reads one answer."""

from __future__ import annotations

from typing import Any

# What --objective ranks by: a row's figure, and whether more of it is better; and the figure in words.
OBJECTIVES = {
    "cost": ("usd_per_million_output_tokens", False, "$ per million output tokens"),
    "energy": ("output_tokens_per_joule", True, "output tokens per joule"),
}


def objective_key(request: Any, row: dict[str, Any], throughput: float) -> float:
    """A row's place under the request's objective, lowest first: ``throughput`` negated (the most first), the
    fewest dollars per million output tokens (at a fixed ``--rate``, the fewest dollars an hour held), or the most
    output tokens per joule."""
    if request.objective == "throughput":
        return -throughput
    if request.objective == "cost" and request.rate is not None:
        # every layout serves the same requests at a fixed rate: the cheaper is the one that holds less, idle
        # devices included (its $ per million output tokens charges only the working time)
        held = row.get("usd_per_hour")
        return float("inf") if held is None else held
    name, more_is_better, _ = OBJECTIVES[request.objective]
    value = row.get(name)
    if value is None:
        return float("inf")
    return -value if more_is_better else value


def figure(request: Any, row: dict[str, Any]) -> float:
    """The row's figure under the objective, as plan ranks it: output tokens/s per device (with --max-rate,
    requests/s per device), $ per million output tokens (at a fixed --rate, $ an hour held), output tokens per
    joule."""
    throughput = (
        row["max_rate"] / row["devices"] if request.max_rate else row["output_tokens_per_s_per_device"]
    )
    key = objective_key(request, row, throughput)
    return key if not more_is_better(request) else -key


def more_is_better(request: Any) -> bool:
    return OBJECTIVES.get(request.objective, (None, True))[1]


def by_device(request: Any, ranked: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per device searched, the first of ``ranked`` (the rows that meet, best first) on it, winner first:
    {"device", "row", "figure", "ratio" (to the winner's figure)}; a device with none comes last, its row None."""
    best: dict[str, dict[str, Any]] = {}
    for row in ranked:
        best.setdefault(row["device"], row)
    found = [best[name] for name in dict.fromkeys(r["device"] for r in ranked) if name in best]
    top = figure(request, found[0]) if found else None
    entries = [
        {
            "device": row["device"],
            "row": row,
            "figure": figure(request, row),
            "ratio": figure(request, row) / top if top else None,
        }
        for row in found
    ]
    return entries + [
        {"device": name, "row": None, "figure": None, "ratio": None}
        for name in request.devices
        if name not in best
    ]
