"""Reading a TOML file a user names: every way it can fail is one error naming the file and the fault."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from castcore.errors import CastcoreError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

__all__ = ["read_toml", "tomllib"]


def read_toml(path: str | Path, error: type[CastcoreError], what: str) -> dict[str, Any]:
    """The file's tables as a dict; ``error`` when it is missing, a folder, unreadable or not TOML. ``what`` names
    the file in messages ("device file", "sweep spec")."""
    path = Path(path)
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise error(f"{path}: no such {what}") from None
    except IsADirectoryError:
        raise error(f"{path}: is a directory; name the {what} itself (a .toml file)") from None
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise error(f"{path}: not valid TOML: {exc}") from None
    except OSError as exc:
        raise error(f"{path}: cannot read it: {exc.strerror or exc}") from None
