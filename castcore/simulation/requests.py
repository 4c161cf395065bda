"""The requests a simulation serves: drawn from length distributions, or read from a JSONL trace.

A trace has one JSON object per line, the shape of a vLLM or ShareGPT-derived trace: the input and output token
counts as ``input_tokens``/``output_tokens`` (or ``prompt_len``/``output_len``, as vLLM's benchmark datasets name
them), and optionally when the request arrives, in seconds from the start of the run, as ``arrival_s`` (or
``timestamp``), and the shared prefix its prompt starts with, as ``prefix_id`` (any string or number naming it)
and ``prefix_tokens`` (its length). Blank lines are skipped.
"""

from __future__ import annotations

import json
import math
import os
import random
from dataclasses import dataclass
from typing import Any

from castcore.errors import ModelError
from castcore.options.catalog import say
from castcore.options.traffic import MOST_REQUESTS
from castcore.simulation.lengths import Lengths
from castcore.tomlfiles import DATA_BYTES, read_text

INPUT_KEYS = ("input_tokens", "prompt_len")
OUTPUT_KEYS = ("output_tokens", "output_len")
ARRIVAL_KEYS = ("arrival_s", "timestamp")
NEEDS = (
    'one JSON object per line such as {"input_tokens": 512, "output_tokens": 128, "arrival_s": 0.5} '
    "(or prompt_len/output_len, and timestamp), counts whole numbers of at least 1, arrival_s optional, and "
    "optionally prefix_id with prefix_tokens below input_tokens"
)


@dataclass
class Request:
    """One request: its position in the run, its token counts, and when it arrives (None: the arrivals decide)."""

    index: int
    input_tokens: int
    output_tokens: int
    arrival_s: float | None = None
    prefix_id: int | None = None  # the shared prompt prefix it starts with (a system prompt), if any
    prefix_tokens: int = 0  # that prefix's length, within input_tokens
    prefilled: bool = False  # its prompt's KV and first token come with it (a disaggregated decode instance)


def make_requests(count: int, input: Lengths, output: Lengths, seed: int | None) -> list[Request]:
    """``count`` requests whose input and output lengths are drawn from ``input`` and ``output``; the same seed
    gives the same requests."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ModelError(f"{say('requests', count)}: give a whole number of requests of at least 1.")
    rng = random.Random(seed)
    inputs = input.sample(rng, count)
    outputs = output.sample(rng, count)
    return [Request(i, n_in, n_out) for i, (n_in, n_out) in enumerate(zip(inputs, outputs))]


def _field(record: dict, keys: tuple[str, ...]) -> Any:
    """The value of the first of ``keys`` in ``record``, or None."""
    return next((record[key] for key in keys if key in record), None)


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def read_dataset(path: str | os.PathLike) -> list[Request]:
    """The requests of the JSONL trace at ``path``, in file order. Either every request has an arrival time or
    none has (then the arrivals decide when they come)."""
    where = say("dataset", os.fspath(path))
    try:
        lines = read_text(path, ModelError, "dataset", DATA_BYTES, "JSONL").splitlines()
    except ModelError as error:
        raise ModelError(
            f"{where}: {str(error).removeprefix(f'{os.fspath(path)}: ')}; give a JSONL file of requests."
        ) from None
    if len(lines) > MOST_REQUESTS:
        raise ModelError(
            f"{where}: {len(lines):,} lines, over {MOST_REQUESTS:,}, castcore's limit for "
            f"{say('requests')}; give at most that many requests."
        )
    requests: list[Request] = []
    prefixes: dict[Any, int] = {}  # the dataset's prefix names, numbered
    timed_line = untimed_line = None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{say('dataset', os.fspath(path))} line {number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ModelError(f"{where}: not JSON ({error.msg}); give {NEEDS}.") from None
        if not isinstance(record, dict):
            raise ModelError(f"{where}: not a JSON object; give {NEEDS}.")
        n_in, n_out, arrival = (
            _field(record, INPUT_KEYS),
            _field(record, OUTPUT_KEYS),
            _field(record, ARRIVAL_KEYS),
        )
        if not _count(n_in) or not _count(n_out):
            raise ModelError(f"{where}: input {n_in!r}, output {n_out!r}; give {NEEDS}.")
        if arrival is not None and (
            isinstance(arrival, bool)
            or not isinstance(arrival, (int, float))
            or not math.isfinite(arrival)
            or arrival < 0
        ):
            raise ModelError(
                f"{where}: arrival {arrival!r} is not a number of seconds of at least 0; give {NEEDS}."
            )
        if arrival is None:
            untimed_line = untimed_line or number
        else:
            timed_line = timed_line or number
        if timed_line and untimed_line:
            raise ModelError(
                f"{say('dataset', os.fspath(path))}: line {timed_line} has an arrival time and line "
                f"{untimed_line} has none; give every request an arrival time, or none."
            )
        prefix, prefix_tokens = record.get("prefix_id"), record.get("prefix_tokens")
        if (
            (prefix is None) != (prefix_tokens is None)
            or prefix_tokens is not None
            and (not _count(prefix_tokens) or prefix_tokens >= n_in or not isinstance(prefix, (str, int)))
        ):
            raise ModelError(
                f"{where}: prefix_id {prefix!r}, prefix_tokens {prefix_tokens!r}; give both or neither, "
                f"prefix_tokens below the {n_in} input tokens."
            )
        requests.append(
            Request(
                len(requests),
                n_in,
                n_out,
                None if arrival is None else float(arrival),
                None if prefix is None else prefixes.setdefault(prefix, len(prefixes)),
                prefix_tokens or 0,
            )
        )
    if not requests:
        raise ModelError(f"{say('dataset', os.fspath(path))} has no requests; give {NEEDS}.")
    return requests


def share_prefix(requests: list[Request], length: int, share: float | None, seed: int | None) -> None:
    """Give ``share`` of the requests (all by default; chosen with ``seed``) one shared prefix of ``length`` tokens;
    ModelError when a prompt that carries it is not longer than it."""
    share = 1.0 if share is None else share
    if share > 1:
        raise ModelError(f"{say('prefix_hit_rate', share)}: a share of the requests, at most 1")
    rng = random.Random(seed)
    for request in requests:
        if rng.random() < share:
            if request.input_tokens <= length:
                raise ModelError(
                    f"{say('prefix_len', length)}: request {request.index} has a {request.input_tokens}"
                    f"-token prompt, not longer than the prefix; give a shorter {say('prefix_len')}"
                )
            request.prefix_id, request.prefix_tokens = 0, length


def reject_overlong(
    requests: list[Request], context: int, limit: str
) -> tuple[list[Request], list[dict[str, Any]]]:
    """The requests an engine serves and those it refuses, each ``{"index", "why"}``: one whose prompt and output
    together exceed ``context`` (``limit`` says whose limit it is) is rejected on arrival, as vLLM's server
    refuses a prompt plus max_tokens beyond max_model_len; engines do not truncate it. Arrival times stay as
    given, so the rest arrive as they would have."""
    kept, rejected = [], []
    for request in requests:
        total = request.input_tokens + request.output_tokens
        if total <= context:
            kept.append(request)
        else:
            rejected.append(
                {
                    "index": request.index,
                    "why": f"{request.input_tokens} input + {request.output_tokens} output = {total} tokens, "
                    f"beyond {limit} of {context}",
                }
            )
    return kept, rejected
