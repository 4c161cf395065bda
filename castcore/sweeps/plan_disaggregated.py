"""``castcore plan --disaggregated``: disaggregated prefill/decode layouts searched beside the aggregated ones, and
which of the two kinds wins the traffic, and why.

Each aggregated layout (a device, its tensor/pipeline/expert parallel sizes, a weight dtype) is also tried as X
prefill instances of itself and Y decode instances (castcore simulate --prefill-instances X --decode-instances Y),
for every X and Y from 1 to ``MOST_INSTANCES`` whose devices stay within ``--max-devices``. Without expert
parallelism the decode instances may run their own tensor parallel size (``--decode-deployment tp=N``), any of the
sizes the plan searched for that device, pipeline stages and dtypes: prefill and decode TP are searched
independently. The count stays bounded: at most ``MOST_POOLED`` disaggregated candidates a layout, those with the
fewest devices first; the rest are skipped and counted. The instance count is the disaggregated layout's own
scale, so no replicas are added to it; a ratio that misses the objectives is a try that missed. The best of both
kinds are ranked together, and ``verdict`` compares the best of each.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from castcore.options.catalog import say
from castcore.simulation.metrics import format_ms
from castcore.sweeps.plan_space import ENGINE_LIMITS, LAYOUT_NAMES, parallel

MOST_INSTANCES = 4  # prefill or decode instances tried at most: 16 ratios a layout within 8 devices
MOST_POOLED = 24  # disaggregated candidates a layout at most (its pools' TPs and ratios together)
POOLS = ("prefill_instances", "decode_instances", "decode_deployment")
# what tells one layout from another, the decode pool's own TP aside
LAYOUT = (*LAYOUT_NAMES, *ENGINE_LIMITS)


def pooled(row: dict[str, Any]) -> bool:
    """Whether a plan's row is a disaggregated layout."""
    return bool(row.get("prefill_instances"))


def decode_tp(row: dict[str, Any]) -> int:
    """A disaggregated row's decode instances' tensor parallel size: its own (``tp=N``), else the layout's."""
    own = row.get("decode_deployment")
    return int(own.removeprefix("tp=")) if own else row["tp"]


def candidates(
    chosen: list[dict[str, Any]], max_devices: int, skip: Callable[[str, str, int], None] | None = None
) -> list[dict[str, Any]]:
    """Every ratio of prefill to decode instances of every layout in ``chosen`` that fits ``max_devices``, the
    decode pool at each tensor parallel size of the layout's kin (see the module docstring); what the bound
    drops goes to ``skip(reason, example, count)``."""
    sizes: dict[tuple, set[int]] = {}
    for values in chosen:
        if values["ep"] == 1:
            sizes.setdefault(tuple(values.get(k) for k in LAYOUT if k != "tp"), set()).add(values["tp"])
    found = []
    for values in chosen:
        instance = max(values["tp"], values["ep"]) * values["pp"]
        kin = sizes.get(tuple(values.get(k) for k in LAYOUT if k != "tp")) if values["ep"] == 1 else None
        mine = sorted(
            (
                (x * instance + y * tp * values["pp"], x, y, tp)
                for tp in sorted(kin or {values["tp"]})
                for x in range(1, MOST_INSTANCES + 1)
                for y in range(1, MOST_INSTANCES + 1)
                if x * instance + y * max(tp, values["ep"]) * values["pp"] <= max_devices
            ),
            key=lambda c: (c[0], c[3] != values["tp"], c[1], c[2], c[3]),
        )
        found += [
            {
                **values,
                "prefill_instances": x,
                "decode_instances": y,
                "decode_deployment": None if tp == values["tp"] else f"tp={tp}",
            }
            for _, x, y, tp in mine[:MOST_POOLED]
        ]
        if len(mine) > MOST_POOLED and skip is not None:
            _, x, y, tp = mine[MOST_POOLED]
            row = {**values, "prefill_instances": x, "decode_instances": y, "decode_deployment": f"tp={tp}"}
            skip(
                f"beyond the {MOST_POOLED} disaggregated candidates a layout tries (the fewest devices first)",
                f"{values['device']} {describe(row)}",
                len(mine) - MOST_POOLED,
            )
    return found


def last_tries(missed: list[dict[str, Any]], met: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Of the disaggregated tries that missed, each layout's with the most devices, for the layouts none of whose
    ratios met the objectives."""

    def layout(row: dict[str, Any]) -> tuple:
        return tuple(row.get(k) for k in LAYOUT)

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
    """A layout in a few words: '2 prefill + 1 decode instances of tp 2', '2 prefill (tp 2) + 1 decode (tp 4)
    instances' where the pools' TPs differ, or 'tp 2 x 4 replicas'."""
    layout = parallel(row)
    if pooled(row):
        x, y = row["prefill_instances"], row["decode_instances"]
        if decode_tp(row) != row["tp"]:
            rest = parallel({**row, "tp": 1})
            more = "" if rest == "1 device" else f" of {rest}"
            return f"{x} prefill (tp {row['tp']}) + {y} decode (tp {decode_tp(row)}) instances{more}"
        return f"{x} prefill + {y} decode instances of {layout}"
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
