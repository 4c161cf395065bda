"""The registration decorators and the per-plugin claim tables they fill.

A decorator records a Claim under the module that declared it; when castcore loads a
plugin it gathers the claims of that plugin's modules into a ClaimTable, whose two hook
implementations answer with one dict lookup. Because claims are declared, the audit can
list them without running a model.
"""

from __future__ import annotations

import fnmatch
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from castcore.devices.profile import DeviceProfile
from castcore.plugins.hookspecs import hookimpl

ESTIMATOR = "estimator"
PROPERTIES = "properties"


@dataclass(frozen=True, slots=True)
class Claim:
    """A declaration that ``fn`` answers for ``op`` on devices matching ``device`` (None = all)."""

    op: Any
    kind: str
    fn: Callable
    device: str | None
    override: bool
    module: str
    takes_device: bool = True  # False: the seed RFC's one-parameter form, fn(invoke)

    def matches(self, device_name: str) -> bool:
        return self.device is None or fnmatch.fnmatchcase(device_name, self.device)

    def overlaps(self, other: Claim) -> bool:
        """Whether some device name could match both (judged from the globs themselves)."""
        if self.device is None or other.device is None:
            return True
        return fnmatch.fnmatchcase(self.device, other.device) or fnmatch.fnmatchcase(
            other.device, self.device
        )

    def answer(self, invoke: Any, device: Any) -> Any:
        return self.fn(invoke, device) if self.takes_device else self.fn(invoke)


_DECLARED: list[Claim] = []


def _overloads(op: Any) -> list[Any]:
    """An OpOverload as itself; an OpOverloadPacket (torch.ops.ns.op) as every one of its overloads."""
    if callable(op) and hasattr(op, "_schema"):
        return [op]
    if callable(op) and hasattr(op, "overloads") and hasattr(op, "_qualified_op_name"):
        return [getattr(op, name) for name in op.overloads()]
    raise TypeError(
        f"{op!r} is not a torch operator; pass e.g. torch.ops.aten.mm.default (one overload) "
        "or torch.ops.aten.mm (every overload)"
    )


def _takes_device(fn: Callable) -> bool:
    """True for fn(invoke, device); False for fn(invoke), the seed RFC's register_op_properties form."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # a builtin or C callable: assume castcore's own form
        return True
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return True
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if not positional:
        raise TypeError(f"{fn.__qualname__} takes no argument; it must take (invoke) or (invoke, device)")
    return len(positional) >= 2


def _declare(kind: str, op: Any, device: Any, override: bool) -> Callable[[Callable], Callable]:
    ops = _overloads(op)
    if isinstance(device, DeviceProfile):
        device = device.name
    if device is not None and not isinstance(device, str):
        raise TypeError(
            f"device must be None, a DeviceProfile or a device name or glob such as 'ascend-*', "
            f"not {device!r}"
        )

    def decorate(fn: Callable) -> Callable:
        takes_device = _takes_device(fn)
        _DECLARED.extend(Claim(o, kind, fn, device, bool(override), fn.__module__, takes_device) for o in ops)
        return fn

    return decorate


def register_op_estimator(op: Any, device: Any = None, override: bool = False):
    """Declare ``fn(invoke, device) -> Estimate | float`` as the time of ``op`` on matching devices.

    ``op`` is one overload or a whole OpOverloadPacket; ``device`` None (every device), a name or
    glob, or a DeviceProfile; the seed RFC's positional form ``(op, None, True)`` works as written.
    """
    return _declare(ESTIMATOR, op, device, override)


def register_op_properties(op: Any, device: Any = None, override: bool = False):
    """Declare ``fn(invoke, device)`` or ``fn(invoke)`` -> PerformanceProperties for ``op``; the roofline
    turns it into time. ``op`` and ``device`` as for register_op_estimator."""
    return _declare(PROPERTIES, op, device, override)


def claims_of(package: str) -> list[Claim]:
    """The claims declared by ``package`` or any module below it, in declaration order."""
    prefix = package + "."
    return [c for c in _DECLARED if c.module == package or c.module.startswith(prefix)]


def claims_in(modules: set[str]) -> list[Claim]:
    """The claims declared by exactly these modules, in declaration order."""
    return [c for c in _DECLARED if c.module in modules]


def declaring_modules() -> set[str]:
    return {c.module for c in _DECLARED}


def declared_count() -> int:
    """How many claims were ever declared: it only grows, so a change means new claims."""
    return len(_DECLARED)


def duplicates(claims: list[Claim], op_label: Callable[[Any], str]) -> list[str]:
    """One line per claim one plugin shadows itself (same op and kind, overlapping devices): only the
    first declared is ever asked, so the second would be dead code nobody is told about."""
    found = []
    for i, first in enumerate(claims):
        for second in claims[i + 1 :]:
            if (
                first.op == second.op
                and first.kind == second.kind
                and first.overlaps(second)
                and first.fn is not second.fn
            ):
                found.append(
                    f"claims {op_label(first.op)} twice as {first.kind} (devices "
                    f"{first.device or 'all'} and {second.device or 'all'}): {first.fn.__qualname__} "
                    f"answers, {second.fn.__qualname__} is never asked"
                )
    return found


class ClaimTable:
    """One plugin's claims as hook implementations. Registered as its own pluggy plugin."""

    def __init__(self, claims: list[Claim]):
        self.claims = list(claims)
        self._by_kind: dict[str, dict[Any, list[Claim]]] = {ESTIMATOR: {}, PROPERTIES: {}}
        for claim in self.claims:
            self._by_kind[claim.kind].setdefault(claim.op, []).append(claim)

    def find(self, kind: str, op: Any, device_name: str) -> Claim | None:
        """The first declared claim of ``kind`` for ``op`` that covers ``device_name``."""
        for claim in self._by_kind[kind].get(op, ()):
            if claim.matches(device_name):
                return claim
        return None

    def claimed_ops(self, device_name: str | None = None) -> set[Any]:
        """The ops this table claims on ``device_name``, either kind; None: on any device."""
        return {c.op for c in self.claims if device_name is None or c.matches(device_name)}

    @hookimpl
    def estimate_op(self, invoke, device):
        claim = self.find(ESTIMATOR, invoke.op, device.name)
        return None if claim is None else claim.answer(invoke, device)

    @hookimpl
    def op_properties(self, invoke, device):
        claim = self.find(PROPERTIES, invoke.op, device.name)
        return None if claim is None else claim.answer(invoke, device)
