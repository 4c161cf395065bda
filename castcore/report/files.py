"""Writing a report's files (--trace, --plot): checked before the work starts, written whole or not at all."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from castcore.errors import CastcoreError


class OutputError(CastcoreError, OSError):
    """An output file that cannot be written; the message names the option, the path and the fix."""


def check_output(path: str | Path, option: str) -> Path:
    """The path, if a file can be written there; else OutputError naming why, before any work is done."""
    target = Path(path)
    folder = target.parent
    if target.is_dir():
        raise OutputError(f"{option} {path} is a directory; give a file name inside it")
    if not folder.is_dir():
        raise OutputError(f"{option} {path}: the folder {folder} does not exist; create it first")
    if not os.access(folder, os.W_OK | os.X_OK) or (target.exists() and not os.access(target, os.W_OK)):
        raise OutputError(f"{option} {path}: not writable by you; choose another place")
    return target


def write_whole(path: Path, option: str, write: Callable[[Path], None]) -> None:
    """Call ``write`` on a temporary file beside ``path``, then move it into place: a failure (a full
    disk, say) leaves no partial file and an existing ``path`` as it was."""
    partial = path.with_name(f".{path.stem}.partial{path.suffix}")
    try:
        write(partial)
        os.replace(partial, path)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        raise OutputError(f"{option} {path}: {exc.strerror or exc}; nothing was written") from None
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
