"""The sections of serve's page, one static batch: the deployment in words, the figures with their error band, the
token times, throughput and KV cache along the request, memory per device and the ops of its steps. The deployment
and the energy and cost facts are simulate's page's too."""

from __future__ import annotations

from typing import Any

from castcore.report.html.charts import figure, graph_objects, part
from castcore.report.html.document import (
    binary,
    decimal,
    fact,
    facts,
    notes,
    number,
    paragraph,
    seconds,
    section,
)
from castcore.report.html.estimate import band, banded, op_table

STEPS = 400  # points along a static batch's decode at most


def money_facts(results: dict[str, Any]) -> list[str]:
    """Energy and cost facts, those the results have (castcore.report.energy's figures)."""
    found = []
    if number(results.get("energy_j")) is not None:
        found.append(
            fact(
                "energy",
                f"{decimal(results['energy_j'])} J",
                f"{decimal(results['joules_per_output_token'], 3)} J per output token",
            )
        )
    if number(results.get("usd_per_million_output_tokens")) is not None:
        per_user = number(results.get("output_tokens_per_s_per_user"))
        found.append(
            fact(
                "cost per million output tokens"
                + (f" at {decimal(per_user)} tok/s/user" if per_user is not None else ""),
                f"${decimal(results['usd_per_million_output_tokens'])}",
                f"${results['usd_per_hour']:,.2f}/hour held",
            )
        )
    if number(results.get("idle_share")) is not None:
        found.append(
            fact(
                "idle, not in the cost per token",
                f"{results['idle_share']:.0%}",
                f"${results['usd_per_hour_idle']:,.2f}/hour",
            )
        )
    return found


def deployment_words(deployment: dict[str, Any]) -> str:
    """The layout and the dtypes as run: weights, activations and KV cache each (the model's dtype where not set)."""
    layout = [
        f"{k} {deployment[k]}" for k in ("tp", "ep", "pp", "dp") if (number(deployment.get(k)) or 1) > 1
    ]
    base = deployment.get("dtype") or "the model's dtype"
    kinds = [
        f"{name} {deployment.get(k) or base}"
        for k, name in (("weights", "weights"), ("activations", "activations"), ("kv_cache", "KV cache"))
    ]
    return ", ".join([*kinds, " x ".join(layout) or "1 device per replica"])


def serve_data(report: Any) -> dict[str, Any]:
    """A ServeReport's JSON, and the op rows of its prefill and its last decode step (their error bands too)."""
    last = report.kv_points[-1]
    steps = [("prefill", report.prefill), (f"decode step at KV length {last}", report.decode[last])]
    return {
        "kind": "serve",
        "results": report.to_dict(),
        "detail": {
            "steps": [{"name": name, "ops": [s.to_dict() for s in step.by_op()]} for name, step in steps]
        },
    }


def serve_sections(results: dict[str, Any], detail: dict[str, Any] | None) -> tuple[str, str, list[str]]:
    detail = detail or {}
    steps = detail.get("steps") or []
    shares = [band(step["ops"])[0] / (sum(r["time_s"] for r in step["ops"]) or 1) for step in steps] or [
        0.0,
        0.0,
    ]
    lede = (
        f"{results['model']} serving {results['batch']} requests of {results['input_tokens']} input + "
        f"{results['output_tokens']} output tokens at once on {results['device']} "
        f"({deployment_words(results)}; {results['devices']} device(s))"
    )
    items = [
        fact("TTFT", banded(results["ttft_s"], shares[0]), f"prefill of {results['batch']} requests"),
        fact("TPOT", banded(results["tpot_s"], shares[-1]), f"mean of {results['output_tokens']} steps"),
        fact("latency", seconds(results["latency_s"])),
        fact(
            "throughput",
            f"{decimal(results['output_tokens_per_s'])} tokens/s",
            f"{decimal(results['output_tokens_per_s_per_device'])} per device",
        ),
        fact(
            "peak memory",
            binary(results["peak_bytes"]),
            f"of {binary(results['device_memory_bytes'])}: {'fits' if results['fits'] else 'does NOT fit'}",
        ),
        *money_facts(results),
    ]
    parts = [
        section(
            "figures",
            "Figures",
            facts(items),
            paragraph(
                "± is each op's time times its kernel family's held-out median |error| on this device, added up."
                if any(shares)
                else "No error band: the device profile has none for these kernels."
                if steps
                else "No error band: a results file holds the figures, not the ops they are made of."
            ),
            notes(results.get("notes") or []),
        )
    ]
    parts.append(
        section("request", "Token times, throughput and KV cache over the request", *_static_charts(results))
    )
    parts.append(section("memory", "Memory per device at the longest context", _memory_bar(results)))
    for n, step in enumerate(steps):
        parts.append(
            section(
                f"ops-{n}", f"Operators of the {step['name']}", op_table(f"ops-table-{n}", step["ops"], None)
            )
        )
    if not steps:
        parts.append(
            paragraph(
                "The per-op tables of the prefill and decode steps are on a page made with --html on the run."
            )
        )
    return f"castcore serve: {results['model']} on {results['device']}", lede, parts


def _static_charts(results: dict[str, Any]) -> list[str]:
    """A static batch: every request has the same TTFT and the same token times, so its distributions are the
    decode step's time along the request (the fitted line through the captured steps), with throughput and KV
    cache growing as the context grows."""
    go = graph_objects()
    a, b = results["tpot_fit"]["a_s"], results["tpot_fit"]["b_s_per_token"]
    first, n = results["input_tokens"], results["output_tokens"]
    kept = sorted({int(i) for i in range(0, n, max(1, n // STEPS))} | {n - 1})
    step_ms = [(a + b * (first + k)) * 1e3 for k in kept]
    itl = figure(
        [
            go.Scatter(
                x=[k + 2 for k in kept],
                y=step_ms,
                mode="lines",
                name="inter-token latency (fit)",
                hovertemplate="token %{x}: %{y:.4g} ms<extra></extra>",
            ),
            go.Scatter(
                x=[p["kv_len"] - first + 2 for p in results["decode_points"]],
                y=[p["time_s"] * 1e3 for p in results["decode_points"]],
                mode="markers",
                name="captured steps",
                marker={"size": 10},
                hovertemplate="captured at KV %{customdata}: %{y:.4g} ms<extra></extra>",
                customdata=[p["kv_len"] for p in results["decode_points"]],
            ),
        ],
        f"inter-token latency along the request (TTFT {seconds(results['ttft_s'])} for every request)",
        "output token",
        "ms",
        height=360,
    )
    clock, times, rates, kv = results["ttft_s"], [], [], []
    replicas = number(results.get("dp")) or 1
    for k in kept:  # the clock after step k, summed in closed form: a saved file's output may be long
        step = a + b * (first + k)
        times.append(clock + (k + 1) * (a + b * first) + b * k * (k + 1) / 2)
        rates.append(replicas * results["batch"] / step)
        kv.append(results["kv_cache_bytes"] * (first + k + 1) / (first + n) / 2**20)
    over = figure(
        [
            go.Scatter(x=times, y=rates, name="output tokens/s", mode="lines"),
            go.Scatter(x=times, y=kv, name="KV cache per device (MiB)", mode="lines", yaxis="y2"),
        ],
        "throughput and KV cache over the request",
        "time (s)",
        "output tokens/s",
        height=360,
        yaxis2={"title": "KV cache (MiB)", "overlaying": "y", "side": "right"},
    )
    return [
        part(itl, "itl"),
        part(over, "throughput"),
        paragraph(
            "castcore serve prices one static batch: the requests start together, so TTFT, TPOT and ITL are one value "
            "each, and ITL follows the context length. castcore simulate gives distributions under traffic."
        ),
    ]


def _memory_bar(results: dict[str, Any]) -> str:
    go = graph_objects()
    held = {
        "weights": results["weight_bytes"],
        "KV cache": results["kv_cache_bytes"],
        "activations": results["activation_bytes"],
        "free": results["free_bytes"],
    }
    fig = figure(
        [
            go.Bar(
                x=[v / 2**30],
                y=["memory"],
                name=k,
                orientation="h",
                hovertemplate=f"{k}: %{{x:.4g}} GiB<extra></extra>",
            )
            for k, v in held.items()
            if v
        ],
        f"peak {binary(results['peak_bytes'])} of {binary(results['device_memory_bytes'])}",
        "GiB",
        "",
        height=240,
        barmode="stack",
    )
    return part(fig, "memory")
