"""``castcore plan --disaggregated``: disaggregated prefill/decode layouts searched beside the aggregated ones, and
which of the two kinds wins the traffic, and why.

Each aggregated layout (a device, its tensor/pipeline/expert parallel sizes, a weight dtype) is also tried as X
prefill and Y decode instances of itself (castcore simulate --prefill-instances X --decode-instances Y), for every
X and Y from 1 to ``MOST_INSTANCES`` whose devices stay within ``--max-devices``. The instance count is the
disaggregated layout's own scale, so no replicas are added to it; a ratio that misses the objectives is a try that
missed. The best of both kinds are ranked together, and ``verdict`` compares the best of each.
"""

from __future__ import annotations

from typing import Any

from castcore.options.catalog import say
from castcore.simulation.metrics import format_ms

MOST_INSTANCES = 4  # prefill or decode instances tried at most: 16 ratios a layout within 8 devices
POOLS = ("prefill_instances", "decode_instances")


def pooled(row: dict[str, Any]) -> bool:
    """Whether a plan's row is a disaggregated layout."""
    return bool(row.get("prefill_instances"))


def candidates(chosen: list[dict[str, Any]], max_devices: int) -> list[dict[str, Any]]:
    """Every ratio of prefill to decode instances of every layout in ``chosen`` that fits ``max_devices``."""
    found = []
    for values in chosen:
        instance = max(values["tp"], values["ep"]) * values["pp"]
        found += [
            {**values, "prefill_instances": x, "decode_instances": y}
            for x in range(1, MOST_INSTANCES + 1)
            for y in range(1, MOST_INSTANCES + 1)
            if (x + y) * instance <= max_devices
        ]
    return found


def last_tries(missed: list[dict[str, Any]], met: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Of the disaggregated tries that missed, each layout's with the most devices, for the layouts none of whose
    ratios met the objectives."""

    def layout(row: dict[str, Any]) -> tuple:
        return tuple(row.get(k) for k in ("device", "tp", "pp", "ep", "weights", "activations", "kv_cache"))

    served = {layout(row) for row in met if pooled(row)}
    largest: dict[tuple, dict[str, Any]] = {}
    for row in missed:
        key = layout(row)
        if key not in served and (key not in largest or row["devices"] > largest[key]["devices"]):
            largest[key] = row
    return list(largest.values())


def check(request: Any) -> None:
    from castcore.errors import ModelError

    if request.disaggregated and request.rate is None and not request.max_rate:
        raise ModelError(
            f"{say('disaggregated', True)} simulates two pools under traffic: give {say('rate')} or "
            f"{say('max_rate', True)} (a closed loop across two pools is not simulated, and a static "
            "batch has no pools)"
        )


def describe(row: dict[str, Any]) -> str:
    """A layout in a few words: '2 prefill + 1 decode instances of tp 2' or 'tp 2 x 4 replicas'."""
    parts = [f"{k} {row[k]}" for k in ("tp", "pp", "ep") if (row.get(k) or 1) > 1] or ["1 device"]
    layout = " x ".join(parts)
    if pooled(row):
        return f"{row['prefill_instances']} prefill + {row['decode_instances']} decode instances of {layout}"
    replicas = row.get("dp") or 1
    return layout + (f" x {replicas} replicas" if replicas > 1 else "")


def verdict(request: Any, best: list[dict[str, Any]], figure: str, words: str) -> dict[str, Any] | None:
    """Which kind wins: the best of each kind among ``best`` (ranked, both kinds together), compared on ``figure``
    (the row's field the ranking reads, described by ``words``), and why, from their latencies; None when the plan
    searched no disaggregated layout."""
    if not request.disaggregated:
        return None
    mine = {
        kind: next((r for r in best if pooled(r) == (kind == "disaggregated")), None)
        for kind in ("aggregated", "disaggregated")
    }
    if not any(mine.values()):
        return {"winner": None, "why": "no layout of either kind meets the objectives", **mine}
    winner = "aggregated" if best and not pooled(best[0]) else "disaggregated"
    loser = "disaggregated" if winner == "aggregated" else "aggregated"
    won, lost = mine[winner], mine[loser]
    if lost is None:
        return {"winner": winner, "why": f"only {winner} layouts meet the objectives at this traffic", **mine}
    latencies = ", ".join(
        f"{statistic} {metric.upper()} {_ms(won, statistic, metric)} against {_ms(lost, statistic, metric)}"
        for metric in ("tpot", "ttft")
        for statistic in [_statistic(request, metric)]
    )
    why = (
        f"{_counted(won)} gives {_value(won, figure)} {words} against {_value(lost, figure)} for the best "
        f"{loser} layout, {_counted(lost)}; {latencies}. "
    )
    moved = format_ms(mine["disaggregated"]["mean_kv_transfer_ms"])
    if winner == "disaggregated":
        why += (
            "Its decode iterations carry no prompt chunks, so tokens come at the decode pool's own pace and "
            f"each pool is sized to its phase, which outweighs moving each prompt's KV ({moved} on average)."
        )
    else:
        why += (
            "Every device serves both phases, while a disaggregated layout holds its devices in whole instances "
            f"per phase, one pool waiting on the other, and moves each prompt's KV ({moved} on average)."
        )
    return {"winner": winner, "why": why, **mine}


def _counted(row: dict[str, Any]) -> str:
    """A layout and, where its words do not say it, its devices."""
    words, devices = describe(row), row["devices"]
    return words if words == "1 device" else f"{words} ({devices} device{'s' if devices > 1 else ''})"


def _statistic(request: Any, metric: str) -> str:
    objective = getattr(request, metric)
    return objective.statistic if objective else "p99"


def _ms(row: dict[str, Any], statistic: str, metric: str) -> str:
    return format_ms(row[f"{statistic}_{metric}_ms"])


def _value(row: dict[str, Any], field: str) -> str:
    value = row[field] / row["devices"] if field == "max_rate" else row[field]
    return f"{value:,.4g}"
