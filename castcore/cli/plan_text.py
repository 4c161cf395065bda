"""plan's result as text: the best deployments as a table, the fewest devices, and the layouts refused or missing
the objectives, for a static plan and for one under traffic."""

from __future__ import annotations

from typing import Any


def _seconds(value: float) -> str:
    from castcore.report.records import format_seconds

    return format_seconds(value)


def format_layout(row: dict[str, Any], dtype: str) -> str:
    """A row's layout in words: its parallel sizes (or its disaggregated pools) and weights."""
    from castcore.sweeps.plan_disaggregated import describe
    from castcore.sweeps.plan_space import parallel

    layout = describe(row) if row.get("prefill_instances") else parallel(row, replicas=True)
    return f"{layout}, {_precision(row, dtype)}"


def _precision(row: dict[str, Any], dtype: str) -> str:
    """The weights' dtype, and the activations', the KV cache's and the engine's limits where the plan searched
    them."""
    given = (
        (row.get("activations"), "activations"),
        (row.get("kv_cache"), "KV cache"),
        (row.get("max_batched_tokens"), "batched tokens"),
        (row.get("max_running_requests"), "running requests"),
    )
    return ", ".join([f"{row['weights'] or dtype} weights", *(f"{d} {what}" for d, what in given if d)])


def _table(
    header: tuple[str, ...], cells: list[tuple[str, ...]], left: tuple[int, ...] = (1, 3)
) -> list[str]:
    widths = [max(len(row[i]) for row in [header, *cells]) for i in range(len(header))]
    return [
        "  ".join(
            c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))
        ).rstrip()
        for row in [header, *cells]
    ]


# The column an --objective other than throughput adds: its header, the row's figure and how it is written.
OBJECTIVE_COLUMNS = {
    "cost": ("$/M out tok", "usd_per_million_output_tokens", "{:,.4g}"),
    "energy": ("out tok/J", "output_tokens_per_joule", "{:,.3g}"),
}
OBJECTIVE_WORDS = {
    "cost": "the fewest $ per million output tokens",
    "energy": "the most output tokens per joule",
}


def _objective_column(
    request: Any, rows: list[dict[str, Any]]
) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    """The header and each row's cell of the objective's column; none for throughput."""
    if request.objective not in OBJECTIVE_COLUMNS:
        return (), [() for _ in rows]
    header, key, form = OBJECTIVE_COLUMNS[request.objective]
    cells = [("-" if r.get(key) is None else form.format(r[key]),) for r in rows]
    if (
        request.objective == "cost" and getattr(request, "rate", None) is not None
    ):  # ranked by the hour's bill
        return ("$/hour", header), [(f"{r.get('usd_per_hour') or 0:,.2f}", *c) for r, c in zip(rows, cells)]
    return (header,), cells


def _rate(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def _traffic(request: Any) -> str:
    if request.max_rate:
        return "the highest request rate each deployment sustains"
    if request.rate is not None:
        burstiness = request.shared.get("burstiness", 1.0)
        gaps = "Poisson" if burstiness == 1.0 else f"gamma gaps of burstiness {burstiness:g}"
        return f"{request.rate:g} requests/s ({gaps})"
    return f"{request.concurrency} requests in flight (closed loop)"


def _requests(request: Any) -> str:
    """The requests planned for: their lengths or dataset, and the shared prefix and speculation simulated."""
    shared = request.shared
    said = (
        f"requests of {shared['dataset']}"
        if shared.get("dataset")
        else f"requests of {request.input_tokens} input + {request.output_tokens} output tokens"
    )
    if shared.get("prefix_len"):
        hit = shared.get("prefix_hit_rate")
        said += f", a shared {shared['prefix_len']}-token prefix" + (f" on {hit:.0%} of them" if hit else "")
    if shared.get("spec_tokens"):
        said += f", {shared['spec_tokens']} draft tokens a step from {shared['draft_model']}"
    return said


def _objectives(request: Any) -> list[str]:
    return [
        f"{name} {objective.statistic} <= {_seconds(objective.seconds)}"
        for name, objective in (("TTFT", request.ttft), ("TPOT", request.tpot))
        if objective is not None
    ]


def format_traffic_plan(result: Any) -> str:
    """A plan under traffic (castcore.sweeps.capacity): the simulated deployments that meet the objectives."""
    request = result.request
    slos = _objectives(request)
    if request.shared.get("dataset"):
        runs = f"{len(result.rows)} simulations of the dataset's requests"
    else:  # the search's runs, then the longer confirming ones
        counts: dict[Any, int] = {}
        for row in result.rows:
            counts[row.get("requests")] = counts.get(row.get("requests"), 0) + 1
        runs = " and ".join(
            f"{n} simulation{'s' if n > 1 else ''} of {size:,} requests"
            for size, n in counts.items()
            if isinstance(size, int)
        )
    lines = [
        f"{request.model}: {_requests(request)}, {_traffic(request)}, "
        f"{' and '.join(slos) or 'no latency objective'}",
        f"searched {result.layouts} layouts on {', '.join(request.devices)} ({runs}, {request.engine} engine) in "
        f"{result.seconds:.1f} s",
        "",
    ]
    shown = {
        "ttft": request.ttft.statistic if request.ttft else "p99",
        "tpot": request.tpot.statistic if request.tpot else "p99",
    }
    if result.best:
        extra, more = _objective_column(request, result.best)
        header = (
            "#",
            "device",
            "devices",
            "layout",
            *(f"{m.upper()} {shown[m]}" for m in ("ttft", "tpot")),
            "tok/s/device",
            *(("max req/s", "req/s/device") if request.max_rate else ()),
            *extra,
        )
        cells = [
            (
                str(n),
                r["device"],
                str(r["devices"]),
                format_layout(r, request.dtype),
                *(_latency(r, shown[m], m) for m in ("ttft", "tpot")),
                f"{r['output_tokens_per_s_per_device']:,.1f}",
                *((_rate(r["max_rate"]), _rate(r["max_rate"] / r["devices"])) if request.max_rate else ()),
                *cell,
            )
            for n, (r, cell) in enumerate(zip(result.best, more), 1)
        ]
        lines.append(
            f"best {len(result.best)} by "
            + (
                "the fewest $ an hour held (each serves the same rate; idle devices count)"
                if request.objective == "cost" and request.rate is not None
                else OBJECTIVE_WORDS.get(
                    request.objective,
                    "the highest request rate per device"
                    if request.max_rate
                    else "output tokens/s per device",
                )
            )
            + " within the objectives"
        )
        lines += _table(header, cells)
        lines += _confirmed(request, result.best)
    else:
        lines.append(
            "no layout meets the objectives under this traffic: relax --ttft/--tpot, lower the rate, raise "
            "--max-devices, or add --weights int4"
        )
    if result.missed:
        lines += ["", "missed the objectives (layout at its last try: why)"]
        lines += [f"  {r['device']} {format_layout(r, request.dtype)}: {r['missed']}" for r in result.missed]
    _refused(lines, result)
    if result.verdict:
        winner = result.verdict["winner"]
        lines += ["", f"{winner} wins: {result.verdict['why']}" if winner else result.verdict["why"]]
    _by_device(lines, result)
    lines.append("")
    if result.fewest:
        lines.append("fewest devices that meet the objectives")
        lines += [_fewest(r, request.dtype) for r in result.fewest]
    return "\n".join(lines)


def _latency(row: dict[str, Any], statistic: str, metric: str) -> str:
    """A row's statistic, and after validation its steady value with the 95% interval in ms: '773 ms (741-802)'."""
    steady = f"steady_{statistic}_{metric}_ms"
    if row.get("margins") is None or row.get(steady) is None:
        return _seconds(row[f"{statistic}_{metric}_ms"] / 1e3)
    from castcore.simulation.metrics import format_ms

    low, high = (format_ms(row[steady + end]).removesuffix(" ms") for end in ("_low", "_high"))
    return f"{_seconds(row[steady] / 1e3)} ({low}-{high})"


def _confirmed(request: Any, best: list[dict[str, Any]]) -> list[str]:
    """How the best were confirmed: the validation's request count and each row's margins to the objectives."""
    if not request.validate or not any(r.get("margins") for r in best):
        return []
    from castcore.sweeps.plan_validation import describe

    lines = [
        f"confirmed with {request.validate_requests:,} requests: steady state (warm-up and drain excluded), "
        "not saturated, every objective met by the upper end of its 95% interval (in brackets, ms)"
    ]
    lines += [f"  {n}: {describe(r['margins'])}" for n, r in enumerate(best, 1) if r.get("margins")]
    if not all(r.get("margins") for r in best):
        lines.append(
            f"  rows without an interval met the search's {request.requests:,}-request simulations and were not "
            f"confirmed (raise --validate to confirm more)"
        )
    return lines


def _fewest(row: dict[str, Any], dtype: str, more: str = "") -> str:
    return f"  {row['device']}: {row['devices']} device{'s' if row['devices'] > 1 else ''} ({format_layout(row, dtype)}){more}"


def _skipped(lines: list[str], result: Any) -> None:
    """The candidates not run, a line a reason."""
    if result.skipped:
        lines.append("")
        lines += [
            f"skipped {s['count']} candidate{'s' if s['count'] > 1 else ''}: {s['reason']} (such as {s['example']})"
            for s in result.skipped
        ]


def _by_device(lines: list[str], result: Any) -> None:
    """With more than one device type searched: each one's best under the objective, against the winner's."""
    from castcore.sweeps import plan_objective

    request = result.request
    if len(request.devices) < 2 or not result.by_device:
        return
    words = OBJECTIVE_WORDS.get(request.objective, "").removeprefix("the fewest ").removeprefix(
        "the most "
    ) or ("requests/s per device" if request.max_rate else "output tokens/s per device")
    lines += ["", f"best on each device ({words})"]
    winner = result.by_device[0]
    width = max(len(e["device"]) for e in result.by_device)
    for entry in result.by_device:
        row = entry["row"]
        if row is None:
            fits = request.traffic or any(r["device"] == entry["device"] for r in result.fewest)
            lines.append(
                f"  {entry['device']:<{width}}  "
                + (
                    "no layout meets the objectives"
                    if fits
                    else f"no layout of at most {request.max_devices} device{'s' if request.max_devices > 1 else ''} "
                    "holds even batch 1 (raise --max-devices)"
                )
            )
            continue
        if entry is winner:
            compared = "the best"
        elif plan_objective.more_is_better(request):
            compared = f"{entry['ratio']:.2f}x the best ({1 - entry['ratio']:.0%} less)"
        else:
            compared = f"{entry['ratio']:.2f}x the best's ({entry['ratio'] - 1:.0%} more)"
        lines.append(
            f"  {entry['device']:<{width}}  {entry['figure']:,.4g}  {compared}: {format_layout(row, request.dtype)}"
        )


def _refused(lines: list[str], result: Any) -> None:
    _skipped(lines, result)
    if result.refused:
        lines += ["", "refused or not fitting at batch 1 (layouts: reason)"]
        reasons: dict[str, list[str]] = {}
        for row in result.refused:
            reasons.setdefault(row["error"], []).append(
                f"{row['device']} {format_layout(row, result.request.dtype)}"
            )
        lines += [f"  {'; '.join(where)}: {why}" for why, where in reasons.items()]


def format_plan(result: Any) -> str:
    from castcore.report.memory import format_bytes

    request = result.request
    if request.traffic:
        return format_traffic_plan(result)
    slos = [f"TTFT <= {_seconds(request.ttft_s)}"] if request.ttft_s else []
    slos += [f"TPOT <= {_seconds(request.tpot_s)}"] if request.tpot_s else []
    lines = [
        f"{request.model}: requests of {request.input_tokens} input + {request.output_tokens} output tokens"
        + (f", {' and '.join(slos)}" if slos else ", no latency objective"),
        f"searched {result.layouts} layouts on {', '.join(request.devices)} ({len(result.rows)} serve points, "
        f"{len(result.refused)} layouts refused or not fitting at batch 1) in {result.seconds:.1f} s",
        "",
    ]
    if result.best:
        extra, more = _objective_column(request, result.best)
        header = (
            "#",
            "device",
            "devices",
            "layout",
            "batch",
            "TTFT",
            "TPOT",
            "tok/s/device",
            *extra,
            "peak/device",
        )
        cells = [
            (
                str(n),
                r["device"],
                str(r["devices"]),
                format_layout(r, request.dtype),
                str(r["served_batch"]),
                _seconds(r["ttft_s"]),
                _seconds(r["tpot_s"]),
                f"{r['output_tokens_per_s_per_device']:,.1f}",
                *cell,
                format_bytes(r["peak_bytes"]),
            )
            for n, (r, cell) in enumerate(zip(result.best, more), 1)
        ]
        lines.append(
            f"best {len(result.best)} by "
            + OBJECTIVE_WORDS.get(request.objective, "output tokens/s per device")
            + " (fit in memory"
            + (", meet the objectives)" if slos else ")")
        )
        lines += _table(header, cells)
    else:
        lines.append(
            "no layout fits and meets the objectives: relax --ttft/--tpot, raise --max-devices, or add "
            "--weights int4"
        )
    _refused(lines, result)
    _by_device(lines, result)
    lines.append("")
    if result.fewest:
        lines.append("fewest devices that fit at all")
        lines += [_fewest(r, request.dtype, f", up to batch {r['served_batch']}") for r in result.fewest]
    else:
        lines.append(
            f"no layout of at most {request.max_devices} devices holds even batch 1: raise --max-devices"
        )
    return "\n".join(lines)


def format_frontier(result: Any) -> str:
    """--frontier's curves (castcore.sweeps.plan_frontier): per best row, a small table of its points."""
    request = result.request
    lines = [
        "",
        "throughput per device against tokens/s per user: one replica, a closed loop of rising concurrency",
    ]
    for n, (row, points) in enumerate(zip(result.best, result.frontier), 1):
        lines.append(f"#{n} {row['device']}, {format_layout(row, request.dtype)}")
        if not points:
            lines.append("  no curve: a closed loop over disaggregated pools is not simulated")
            continue
        priced = any(p.get("usd_per_million_output_tokens") is not None for p in points)
        header = (
            "in flight",
            "tok/s/user",
            "tok/s/device",
            "TPOT p99",
            *(("$/M out tok",) if priced else ()),
        )
        cells = [
            (
                str(p["concurrency"]),
                f"{p['output_tokens_per_s_per_user']:,.1f}",
                f"{p['output_tokens_per_s_per_device']:,.1f}",
                _seconds(p["p99_tpot_ms"] / 1e3),
                *((f"{p['usd_per_million_output_tokens']:,.4g}",) if priced else ()),
            )
            for p in points
        ]
        lines += ["  " + line for line in _table(header, cells, left=())]
    return "\n".join(lines)
