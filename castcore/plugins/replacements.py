"""What a fused operator runs instead of: the eager ops a deployed rewrite (the core's, or a pack's ``fuse_model``)
no longer calls. A claim on one of them that a workload never reaches is then said, never silently unused
(castcore.plugins.audit.unreached_claims)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from castcore.recording.invoke import op_name

_REPLACES: dict[str, tuple[str, ...]] = {}


def declare_replaces(op: Any, replaced: Iterable[Any]) -> None:
    """Say that ``op`` (a fused operator a rewrite calls) runs instead of ``replaced`` (operators, or names such as
    ``"aten::silu"``); declaring again adds to what was said."""
    name = op if isinstance(op, str) else op_name(op)
    names = [r if isinstance(r, str) else op_name(r) for r in replaced]
    _REPLACES[name] = tuple(dict.fromkeys([*_REPLACES.get(name, ()), *names]))


def replacements() -> dict[str, tuple[str, ...]]:
    """Every fused operator declared so far, with the eager ops it runs instead of."""
    return dict(_REPLACES)
