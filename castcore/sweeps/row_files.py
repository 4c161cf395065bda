"""Rows to and from files: .parquet (pyarrow: pip install 'castcore[sweep]'), .csv and .jsonl, which pandas and
polars open directly. While a sweep runs, each finished row is appended to a hidden ``.NAME.rows.jsonl`` beside
the output, so an interrupted sweep loses nothing; the output file itself is written whole at the end."""

from __future__ import annotations

import csv
import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from castcore.options.catalog import say
from castcore.tomlfiles import DATA_BYTES, read_text
from castcore.errors import CastcoreError
from castcore.report.output_files import OutputError, check_output, row_file, write_whole

FORMATS = (".parquet", ".csv", ".jsonl")


def check_out(path: str | Path) -> Path:
    """The output path, if its format is known, its library installed and its folder writable."""
    target = Path(path)
    if target.suffix not in FORMATS:
        raise OutputError(
            f"{say('out', str(path))}: name a .parquet, .csv or .jsonl file (the format follows the suffix)"
        )
    if target.suffix == ".parquet":
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise OutputError(
                f"{say('out', str(path))}: Parquet needs pyarrow: pip install 'castcore[sweep]', or "
                "write .csv or .jsonl"
            ) from None
    return check_output(target, "out")


@contextmanager
def held(path: Path) -> Iterator[None]:
    """``path`` as this sweep's alone while it runs (a lock file beside it): a second sweep writing the same output
    at once is refused with one line instead of mixing its rows in."""
    lock = path.with_name(f".{path.name}.lock")
    try:
        handle = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError:  # a folder that takes no lock file (a device's): nothing to share it with
        yield
        return
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise OutputError(
                f"{say('out', str(path))} is being written by another castcore sweep; wait for it to "
                f"finish or choose another {say('out')}"
            ) from None
        try:
            yield
        finally:
            lock.unlink(missing_ok=True)  # while still held: a sweep that starts later makes its own
    finally:
        os.close(handle)


def journal(path: Path) -> Path:
    """Where rows go as they finish."""
    return path.with_name(f".{path.name}.rows.jsonl")


def append(path: Path, rows: list[dict[str, Any]]) -> None:
    with journal(path).open("a", encoding="utf-8") as out:
        for row in rows:
            out.write(json.dumps(row, default=_plain) + "\n")
        out.flush()


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of an earlier run of this output: the finished file, then its journal (a cut last line skipped)."""
    rows = _read(path) if path.exists() else []
    if journal(path).exists():
        for line in read_text(
            journal(path), OutputError, "journal of rows", DATA_BYTES, "JSONL"
        ).splitlines():
            try:
                rows.append(json.loads(line))
            except (json.JSONDecodeError, RecursionError):
                continue
    return rows


def _read(path: Path) -> list[dict[str, Any]]:
    try:
        return row_file(path)
    except CastcoreError as exc:  # over the bound, not UTF-8: said with the path already
        raise OutputError(f"{say('resume', True)}: {exc}; move it away to start afresh") from None
    except Exception as exc:  # pyarrow's, csv's and json's own errors alike
        raise OutputError(
            f"{say('resume', True)}: cannot read {path} ({type(exc).__name__}: {exc}); move it away to "
            "start afresh"
        ) from None


def _plain(value: Any) -> Any:
    return value.item() if hasattr(value, "item") else str(value)


def write_rows(path: Path, rows: list[dict[str, Any]], columns: list[str]) -> None:
    """The whole output file, atomically: nothing is left half-written."""
    full = [{c: row.get(c) for c in columns} for row in rows]
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pa.Table.from_pylist(full) if full else pa.table({c: [] for c in columns})
        write_whole(path, "out", lambda p: pq.write_table(table, p))
    elif path.suffix == ".csv":

        def write_csv(target: Path) -> None:
            with target.open("w", newline="", encoding="utf-8") as handle:
                writer = csv.DictWriter(handle, fieldnames=columns, lineterminator="\n")
                writer.writeheader()
                writer.writerows(full)

        write_whole(path, "out", write_csv)
    else:
        text = "".join(json.dumps(row, default=_plain) + "\n" for row in full)
        write_whole(path, "out", lambda p: p.write_text(text, encoding="utf-8"))
