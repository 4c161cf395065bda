"""Reading a file a user names (TOML, JSON, text): every way it can fail is one error naming the file and the
fault, and no file is read past a bound, so a huge or endless one is refused before it costs memory."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from castcore.errors import CastcoreError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

__all__ = ["CONFIG_BYTES", "DATA_BYTES", "parse_json", "read_json", "read_text", "read_toml", "tomllib"]

# a config.json, a quantization config, a spec or a device file: kilobytes in practice
CONFIG_BYTES = 4 * 2**20
DATA_BYTES = 256 * 2**20  # results, sweep rows and datasets: what castcore wrote, or a million requests


def read_text(
    path: str | os.PathLike,
    error: type[CastcoreError],
    what: str,
    limit: int = CONFIG_BYTES,
    form: str = "UTF-8 text",
) -> str:
    """The file's UTF-8 text; ``error`` when it is missing, a folder, unreadable (a symlink loop), not UTF-8 or
    over ``limit`` bytes. ``what`` names the file in messages ("device file", "sweep spec"), ``form`` what it
    should hold ("TOML")."""
    path = Path(path)
    try:
        with path.open("rb") as handle:  # a file's size says it at once; a pipe or device, once read past it
            data = None if os.fstat(handle.fileno()).st_size > limit else handle.read(limit + 1)
    except FileNotFoundError:
        raise error(f"{path}: no such {what}") from None
    except IsADirectoryError:
        raise error(f"{path}: is a directory; name the {what} itself") from None
    except OSError as exc:
        raise error(f"{path}: cannot read it: {exc.strerror or exc}") from None
    if data is None or len(data) > limit:
        raise error(f"{path}: over {limit // 2**20} MiB, castcore's limit for a {what}; give one within it")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(
            f"{path}: not valid {form}: byte {exc.start} is {data[exc.start]:#04x}, not UTF-8 text"
        ) from None


def parse_json(text: str | bytes, error: type[CastcoreError], where: str) -> Any:
    """``text`` as JSON; ``error`` naming ``where`` when it is not JSON or is nested too deep to read."""
    try:
        return json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise error(f"{where}: not valid JSON: {exc}") from None
    except RecursionError:
        raise error(f"{where}: nested too deep to read as JSON") from None


def read_json(path: str | Path, error: type[CastcoreError], what: str, limit: int = CONFIG_BYTES) -> Any:
    """The JSON value of the file, read as ``read_text`` reads it."""
    return parse_json(read_text(path, error, what, limit, "JSON"), error, str(path))


def read_toml(path: str | Path, error: type[CastcoreError], what: str) -> dict[str, Any]:
    """The file's tables as a dict; ``error`` as ``read_text`` says, or when it is not TOML."""
    text = read_text(path, error, what, form="TOML")
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{path}: not valid TOML: {exc}") from None
    except RecursionError:
        raise error(f"{path}: nested too deep to read as TOML") from None
