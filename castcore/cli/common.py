"""What several commands share: the plugin options and the Session they make, printing notes, --strict."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from castcore.errors import StrictFailure
from castcore.plugins.selection import PluginOptions

if TYPE_CHECKING:
    from castcore.session import Session

__all__ = ["StrictFailure", "make_session"]


def capture_cache_from(args: argparse.Namespace):
    """The capture cache a command gives its Session as the capture step (``make_session(args,
    capture_step=...)``), unless --no-cache; None then."""
    if args.no_cache:
        return None
    from castcore.sweeps.capture import CaptureCache

    return CaptureCache()


def report_capture_cache(cache) -> None:
    """What the capture cache did that a user should know: entries it discarded or could not keep, a load."""
    if cache is None:
        return
    for line in cache.warnings:
        warn(line)
    if cache.stats.loaded and not cache.stats.captured:
        note("loaded the capture from castcore's cache (--no-cache captures anew)")


def chosen_device(session: Session, name: str | None):
    """``--device``'s profile (an unknown name fails here, before any work); a note when none was given and the
    default is merely the first installed profile."""
    device = session.device(name)
    why = None if name else session.default_by_name()
    if why:
        note(f"note: {why}")
    return device


def announce_capture(cache, message: str) -> None:
    """Say ``message`` (what is captured) when a capture is really made: at once without a cache, else when the
    cache misses; a capture loaded from the cache is said by report_capture_cache instead."""
    if cache is None:
        note(message)
    else:
        cache.on_capture = lambda: note(message)


def make_session(args: argparse.Namespace, **extra) -> Session:
    """A Session from the plugin options; plugin problems are printed, and fail under --strict."""
    from castcore.sweeps.sweep import open_session

    return open_session(
        PluginOptions.of(args), lambda line: print(f"castcore: {line}", file=sys.stderr), **extra
    )


def progress_printer():
    """A capture progress callback when stderr is a terminal, else None."""
    if not sys.stderr.isatty():
        return None

    def show(count: int) -> None:
        print(f"\rcastcore: {count} op calls captured", end="", file=sys.stderr, flush=True)

    return show


def note(message: str) -> None:
    print(f"castcore: {message}", file=sys.stderr)


def warn(message: str) -> None:
    print(f"castcore: warning: {message}", file=sys.stderr)


def fail_on_fallback(session: Session, fallback_ops: list[str]) -> None:
    """Under --strict, ops left to the memory-only estimate are a failure naming them."""
    if session.config.strict and fallback_ops:
        raise StrictFailure(
            f"{len(fallback_ops)} op(s) fell back to the memory-only estimate and --strict is on: "
            f"{', '.join(fallback_ops)}; give them an estimator or op_properties"
        )
