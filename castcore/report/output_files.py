"""Writing a report's files (--trace, --plot): checked before the work starts, written whole or not at all."""

from __future__ import annotations

import csv
import io
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from castcore.errors import CastcoreError
from castcore.options.catalog import say
from castcore.tomlfiles import DATA_BYTES, read_text


class OutputError(CastcoreError, OSError):
    """An output file that cannot be written; the message names the option, the path and the fix."""


def _named(option: str, path: str | Path) -> str:
    """``option`` (its Python name: "out", "trace", "plot", "html") given ``path``, in the caller's terms:
    ``out='x.csv'``, ``--out x.csv`` or ``out = "x.csv"``."""
    return say(option, str(path))


def csv_value(text: str | None) -> Any:
    """A CSV cell as the value castcore wrote it from (a sweep's rows: --resume and castcore report read them)."""
    if text is None or text == "":
        return None
    if text in ("True", "False"):
        return text == "True"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def row_file(path: Path) -> list[Any]:
    """The rows of a .parquet, .csv or .jsonl file a sweep wrote (--resume and castcore report read them), read
    whole up to castcore's bound on a data file; the reader's own error (OSError, ValueError, pyarrow's, ImportError
    without pyarrow) for the caller to say in one line."""
    if path.suffix == ".parquet":
        if path.stat().st_size > DATA_BYTES:
            raise ValueError(f"over {DATA_BYTES // 2**20} MiB, castcore's limit for a file of rows")
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    text = read_text(
        path, CastcoreError, "file of rows", DATA_BYTES, "CSV" if path.suffix == ".csv" else "JSONL"
    )
    if path.suffix == ".csv":
        return [
            {k: csv_value(v) for k, v in row.items()} for row in csv.DictReader(io.StringIO(text, newline=""))
        ]
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def pareto(points: list[tuple[float, float]]) -> list[int]:
    """Indexes of the points no other point beats on both throughput (the first, higher) and latency (the second,
    lower), by throughput: the front sweep --plot and the HTML page mark."""
    order = sorted(range(len(points)), key=lambda i: (-points[i][0], points[i][1]))
    front, best = [], float("inf")
    for i in order:
        if points[i][1] < best:
            front.append(i)
            best = points[i][1]
    return front


def check_output(path: str | Path, option: str) -> Path:
    """The path, if a file can be written there; else OutputError naming ``option`` (its Python name, e.g.
    "trace") and why, before any work is done."""
    target = Path(path)
    folder = target.parent
    if target.is_dir():
        raise OutputError(f"{_named(option, path)} is a directory; give a file name inside it")
    if not folder.is_dir():
        raise OutputError(f"{_named(option, path)}: the folder {folder} does not exist; create it first")
    if not os.access(folder, os.W_OK | os.X_OK) or (target.exists() and not os.access(target, os.W_OK)):
        raise OutputError(f"{_named(option, path)}: not writable by you; choose another place")
    return target


def write_whole(path: Path, option: str, write: Callable[[Path], None]) -> None:
    """Call ``write`` on a uniquely named temporary file beside ``path``, then move it into place: a failure (a
    full disk, say) leaves no partial file and an existing ``path`` as it was, and two writers at once never
    share a temporary. A ``path`` that is not a regular file (a device such as /dev/null, a FIFO, a terminal) is
    written in place and never replaced. Any failure is an OutputError naming ``option`` (its Python name, e.g.
    "out") and ``path``."""
    if path.exists() and not path.is_file():
        try:
            write(path)
        except OSError as exc:
            raise OutputError(f"{_named(option, path)}: {exc.strerror or exc}") from None
        return
    try:
        handle, name = tempfile.mkstemp(
            dir=path.parent, prefix=f".{path.stem}.", suffix=f".partial{path.suffix}"
        )
    except OSError as exc:
        raise OutputError(f"{_named(option, path)}: {exc.strerror or exc}; nothing was written") from None
    os.close(handle)
    partial = Path(name)
    try:
        write(partial)
        os.chmod(partial, path.stat().st_mode & 0o777 if path.exists() else 0o666 & ~_umask())
        os.replace(partial, path)
    except OSError as exc:
        raise OutputError(f"{_named(option, path)}: {exc.strerror or exc}; nothing was written") from None
    finally:
        partial.unlink(missing_ok=True)


def _umask() -> int:
    """This process's umask (mkstemp makes files only the owner may read; a written file gets the usual mode)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022
