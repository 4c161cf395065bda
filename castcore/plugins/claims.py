"""The registration decorators and the per-plugin claim tables they fill.

A decorator records a Claim under the module that declared it; when castcore loads a
plugin it gathers the claims of that plugin's modules into a ClaimTable, whose two hook
implementations answer with one dict lookup. Because claims are declared, the audit can
list them without running a model.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

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

    def matches(self, device_name: str) -> bool:
        return self.device is None or fnmatch.fnmatchcase(device_name, self.device)


_DECLARED: list[Claim] = []


def _declare(kind: str, op: Any, device: str | None, override: bool) -> Callable[[Callable], Callable]:
    if not callable(op) or not hasattr(op, "_schema"):
        raise TypeError(
            f"{op!r} is not a torch operator overload; pass e.g. torch.ops.aten.mm.default "
            "(an OpOverload, not the OpOverloadPacket torch.ops.aten.mm)"
        )
    if device is not None and not isinstance(device, str):
        raise TypeError(f"device must be a device name or glob such as 'ascend-*', not {device!r}")

    def decorate(fn: Callable) -> Callable:
        _DECLARED.append(Claim(op, kind, fn, device, bool(override), fn.__module__))
        return fn

    return decorate


def register_op_estimator(op: Any, device: str | None = None, override: bool = False):
    """Declare ``fn(invoke, device) -> Estimate | float`` as the time of ``op`` on matching devices."""
    return _declare(ESTIMATOR, op, device, override)


def register_op_properties(op: Any, device: str | None = None, override: bool = False):
    """Declare ``fn(invoke, device) -> PerformanceProperties`` for ``op``; the roofline turns it into time."""
    return _declare(PROPERTIES, op, device, override)


def claims_of(package: str) -> list[Claim]:
    """The claims declared by ``package`` or any module below it, in declaration order."""
    prefix = package + "."
    return [c for c in _DECLARED if c.module == package or c.module.startswith(prefix)]


def declaring_modules() -> set[str]:
    return {c.module for c in _DECLARED}


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

    @hookimpl
    def estimate_op(self, invoke, device):
        claim = self.find(ESTIMATOR, invoke.op, device.name)
        return None if claim is None else claim.fn(invoke, device)

    @hookimpl
    def op_properties(self, invoke, device):
        claim = self.find(PROPERTIES, invoke.op, device.name)
        return None if claim is None else claim.fn(invoke, device)
