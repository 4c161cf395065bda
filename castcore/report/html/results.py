"""A saved results file read back for ``castcore report``: which command wrote it, told by its fields, and whether
this castcore's pages can read it. Anything else (another program's file, another castcore's, an empty sweep) is
one line saying what the file is not and how to write one that is."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from castcore.options.option import COUNT_LIMIT
from castcore.errors import CastcoreError
from castcore.report.output_files import row_file
from castcore.report.html.charts import PageError
from castcore.report.html.sweep import sweep_data
from castcore.tomlfiles import DATA_BYTES, read_json

SWEEP_FORMATS = (".jsonl", ".csv", ".parquet")
# A command's --json object: the fields that say which command wrote it, then every field its page reads.
SIGNS = {
    "estimate": (("ops", "modules", "coverage"), ("description", "device", "totals", "notes")),
    "serve": (
        ("ttft_s", "tpot_fit", "decode_points"),
        (
            "model",
            "device",
            "batch",
            "input_tokens",
            "output_tokens",
            "latency_s",
            "output_tokens_per_s",
            "devices",
            "peak_bytes",
            "weight_bytes",
            "kv_cache_bytes",
            "activation_bytes",
            "free_bytes",
            "device_memory_bytes",
            "fits",
        ),
    ),
    "simulate": (
        ("engine", "kv_usage", "completed"),
        (
            "model",
            "device",
            "duration",
            "request_throughput",
            "output_throughput",
            "median_ttft_ms",
            "p99_ttft_ms",
            "median_tpot_ms",
            "iterations",
            "mean_running_batch",
            "kv_blocks",
            "preemptions",
        ),
    ),
    "plan": (("best", "fewest", "layouts"), ("model", "input_tokens", "output_tokens", "devices")),
}
# What each scalar field a page reads must hold: a whole count (within castcore's bound on counts), a finite number
# of at least zero, a name; a file saying otherwise was not written by castcore, or was altered.
COUNTS = ("batch", "input_tokens", "output_tokens", "iterations", "kv_blocks", "preemptions", "completed")
NUMBERS = (
    "ttft_s",
    "latency_s",
    "output_tokens_per_s",
    "peak_bytes",
    "weight_bytes",
    "kv_cache_bytes",
    "activation_bytes",
    "device_memory_bytes",
    "duration",
    "request_throughput",
    "output_throughput",
    "median_ttft_ms",
    "p99_ttft_ms",
    "median_tpot_ms",
    "mean_running_batch",
)
NAMES = ("model", "device")
WRITERS = (
    "castcore estimate/serve/simulate/plan --json > FILE.json, or castcore sweep --out FILE "
    "(.jsonl, .csv, .parquet)"
)


def _fail(path: Path, why: str) -> PageError:
    return PageError(f"{path}: {why}")


def read_results(path: str | Path) -> dict[str, Any]:
    """The page data of a results file: {"kind", "results", "source"}."""
    path = Path(path)
    if not path.is_file():
        raise _fail(path, "no such file" if not path.exists() else "not a file")
    if path.suffix in SWEEP_FORMATS:
        rows = _rows(path)
        if not rows:
            raise _fail(path, "an empty sweep: the file has no rows")
        if not all(isinstance(row, dict) for row in rows):
            raise _fail(
                path, f"not rows of castcore sweep: each line must be an object (write one with {WRITERS})"
            )
        columns = list(dict.fromkeys(k for row in rows for k in row))
        try:
            data = sweep_data(rows, columns)
        except PageError as exc:
            raise _fail(path, f"not rows of castcore sweep: {exc}") from None
        return {**data, "source": f"the results file {path.name}"}
    if path.suffix != ".json":
        raise _fail(path, f"castcore report reads .json, .jsonl, .csv and .parquet files ({WRITERS})")
    found = read_json(path, PageError, "results file", DATA_BYTES)
    kind = _kind(path, found)
    return {
        "kind": kind,
        "results": found,
        "source": f"the results file {path.name} (castcore {kind} --json)",
    }


def _kind(path: Path, found: Any) -> str:
    """The command that wrote ``found``; another program's file, or one another castcore wrote, is refused."""
    if not isinstance(found, dict):
        raise _fail(
            path,
            f"not a castcore results file: a JSON {type(found).__name__}, not an object (write one with "
            f"{WRITERS})",
        )
    for kind, (signs, needed) in SIGNS.items():
        if all(key in found for key in signs):
            missing = [key for key in needed if key not in found]
            if missing:
                raise _fail(
                    path,
                    f"castcore {kind} --json of another version: it lacks {', '.join(missing)}; write "
                    "it again with this castcore",
                )
            _check_fields(path, found)
            return kind
        if sum(key in found for key in signs) >= 2:
            lacking = [key for key in signs if key not in found]
            raise _fail(
                path,
                f"castcore {kind} --json of another version: it lacks {', '.join(lacking)}; write it "
                "again with this castcore",
            )
    raise _fail(
        path,
        f"not a castcore results file: it has none of the fields of estimate, serve, simulate or plan "
        f"--json (write one with {WRITERS})",
    )


def _check_fields(path: Path, found: dict[str, Any]) -> None:
    for key, value in found.items():
        if key in COUNTS:
            fits = type(value) is int and 0 <= value <= COUNT_LIMIT
            wanted = f"a whole number from 0 to {COUNT_LIMIT:,}"
        elif key in NUMBERS:
            fits = type(value) in (int, float) and 0 <= value < math.inf
            wanted = "a finite number of at least 0"
        elif key in NAMES:
            fits, wanted = isinstance(value, str), "a name"
        else:
            continue
        if not fits:
            raise _fail(
                path,
                f"its {key} is {_shown(value)}, not {wanted}: not as castcore writes it (write it "
                "again with this castcore)",
            )


def _shown(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _rows(path: Path) -> list[Any]:
    try:
        return row_file(path)
    except ImportError:
        raise _fail(path, "reading Parquet needs pyarrow: pip install 'castcore[sweep]'") from None
    except CastcoreError as exc:  # over the bound, not UTF-8: said with the path already
        raise PageError(str(exc)) from None
    except Exception as exc:  # pyarrow's, csv's and json's own errors alike
        raise _fail(
            path,
            f"cannot read its rows ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})",
        ) from None
