"""A simulation as a Chrome trace Perfetto opens: the engine's iterations on one track (each with its prefill and
decode tokens and running requests), the KV cache's use as a counter, and each request from arrival to its last
token, its first token marked."""

from __future__ import annotations

from typing import Any

from castcore.simulation.engine import Trace
from castcore.simulation.metrics import Finished

MAX_REQUESTS = 2000  # tracks beyond this make the trace slow to open and say no more


def chrome_trace(iterations: Trace, finished: list[Finished], title: str) -> dict[str, Any]:
    """The trace events of one engine's run (times in microseconds, as the format has them)."""
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": 0, "args": {"name": f"castcore simulate: {title}"}},
        {"name": "thread_name", "ph": "M", "pid": 0, "tid": 0, "args": {"name": "engine iterations"}},
        {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "requests"}},
    ]
    for i in range(len(iterations.time)):
        start, duration = iterations.time[i] * 1e6, iterations.duration[i] * 1e6
        events.append(
            {
                "name": "iteration",
                "ph": "X",
                "pid": 0,
                "tid": 0,
                "ts": start,
                "dur": duration,
                "args": {
                    "prefill_tokens": iterations.prefill_tokens[i],
                    "decode_tokens": iterations.decode_tokens[i],
                    "running": iterations.running[i],
                },
            }
        )
        events.append(
            {
                "name": "KV blocks in use",
                "ph": "C",
                "pid": 0,
                "ts": start + duration,
                "args": {"share": iterations.kv_used[i]},
            }
        )
    for request in sorted(finished, key=lambda f: f.index)[:MAX_REQUESTS]:
        arrival = request.arrival_s * 1e6
        events.append(
            {
                "name": f"request {request.index}",
                "ph": "X",
                "pid": 1,
                "tid": request.index,
                "ts": arrival,
                "dur": request.finish_s * 1e6 - arrival,
                "args": {
                    "input_tokens": request.input_tokens,
                    "output_tokens": request.output_tokens,
                    "preemptions": request.preemptions,
                },
            }
        )
        events.append(
            {
                "name": "first token",
                "ph": "i",
                "s": "t",
                "pid": 1,
                "tid": request.index,
                "ts": request.first_token_s * 1e6,
            }
        )
    return {"traceEvents": events, "displayTimeUnit": "ms"}
