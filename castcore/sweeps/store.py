"""The capture cache on disk: ``$XDG_CACHE_HOME/castcore/captures/``, one file per key, written whole or not at
all (so workers of one sweep, or two sweeps at once, may write the same key). Torch-free: ``castcore cache``
reads it without loading a model."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from castcore.plugins.custom_op_dirs import unsafe_reason
from castcore.plugins.packs import cache_dir, write_cache_file

# a capture; a device's pack rewrite of a model; a step-time ladder point as priced on a device (see
# castcore.sweeps.capture)
SUFFIXES = (
    ".capture",
    ".fused",
    ".priced",
)


@dataclass
class Stats:
    """How a worker's captures were had: made, reused in memory (this sweep), loaded from disk."""

    captured: int = 0
    reused: int = 0
    loaded: int = 0
    unstored: int = 0  # made but not storable (a value with no stored form, a read-only cache folder)
    warnings: list[str] = field(default_factory=list)  # what the cache said (an entry discarded), each once

    def add(self, other: Stats) -> None:
        for f in fields(self):
            if f.name != "warnings":
                setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))
        self.warnings += [w for w in other.warnings if w not in self.warnings]

    def since(self, before: dict[str, Any]) -> dict[str, Any]:
        """What was added after ``before`` (an earlier to_dict()): a task's own counts and warnings."""
        counts = {
            f.name: getattr(self, f.name) - before.get(f.name, 0)
            for f in fields(self)
            if f.name != "warnings"
        }
        return {**counts, "warnings": self.warnings[len(before.get("warnings", ())) :]}

    def to_dict(self) -> dict[str, Any]:
        return {**{f.name: getattr(self, f.name) for f in fields(self)}, "warnings": list(self.warnings)}

    @property
    def hit_ratio(self) -> float:
        hits = self.reused + self.loaded
        return hits / (hits + self.captured) if hits + self.captured else 0.0


class Refused(OSError):
    """A cache folder or entry castcore will not read: another user owns it, or every user may write it."""


def captures_dir() -> Path:
    return cache_dir() / "captures"


def read(key: str, suffix: str) -> bytes | None:
    """The entry's bytes; None when there is none. Refused (the message says why and what to do) when the folder or
    the entry could have been written by another user: its estimates would be theirs."""
    folder = captures_dir()
    path = folder / f"{key}{suffix}"
    try:
        for checked in (folder, path):
            reason = unsafe_reason(checked)
            if reason:
                raise Refused(
                    f"the capture cache is not used: {reason}; castcore captures anew (castcore cache "
                    "clear, or set XDG_CACHE_HOME to a folder of your own)"
                )
        return path.read_bytes()
    except Refused:
        raise
    except OSError:
        return None


def problem() -> str | None:
    """Why the cache folder cannot keep captures (it cannot be made or written, or is not safe to read), or None:
    what a sweep says once before its workers start, since each of them would only capture anew."""
    folder = captures_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return (
            f"the capture cache folder {folder} cannot be made ({exc.strerror or exc}), so nothing is cached for "
            "the next run (set XDG_CACHE_HOME to a folder you can write)"
        )
    reason = unsafe_reason(folder)
    if reason:
        return f"the capture cache is not used: {reason}; castcore captures anew"
    if not os.access(folder, os.W_OK | os.X_OK):
        return (
            f"the capture cache folder {folder} is not writable by you, so nothing is cached for the next run"
        )
    return None


def write(key: str, suffix: str, data: bytes) -> bool:
    """Store ``data`` under ``key``; False when the cache folder cannot be written (the sweep goes on)."""
    return write_cache_file(captures_dir() / f"{key}{suffix}", data)


@dataclass
class CacheInfo:
    location: Path
    captures: int
    fused: int
    bytes: int
    priced: int = 0

    def lines(self) -> list[str]:
        return [
            f"location  {self.location}",
            f"entries   {self.captures} captures, {self.fused} device rewrites of a model, {self.priced} priced "
            "step-time points",
            f"size      {self.bytes / 2**20:,.1f} MiB",
        ]


def _entries() -> list[Path]:
    folder = captures_dir()
    if not folder.is_dir():
        return []
    return [
        p for p in folder.iterdir() if p.is_file() and (p.suffix in SUFFIXES or p.name.endswith(".partial"))
    ]


def info() -> CacheInfo:
    entries = _entries()
    return CacheInfo(
        location=captures_dir(),
        captures=sum(p.suffix == ".capture" for p in entries),
        fused=sum(p.suffix == ".fused" for p in entries),
        priced=sum(p.suffix == ".priced" for p in entries),
        bytes=sum(p.stat().st_size for p in entries),
    )


def clear() -> CacheInfo:
    """Remove every entry (only the files this cache writes); what was there."""
    before = info()
    for path in _entries():
        path.unlink(missing_ok=True)
    return before
