"""Resolving one OpInvoke on one device to an Estimate, recording who answered and at which step."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import pluggy

from castcore.errors import CastcoreError
from castcore.devices.costs import STEP_ESTIMATOR, STEP_PROPERTIES, Estimate, PerformanceProperties, Source
from castcore.plugins.claims import ESTIMATOR, PROPERTIES, ClaimTable

if TYPE_CHECKING:
    from castcore.devices.profile import DeviceProfile
    from castcore.recording.invoke import OpInvoke


class EstimatorError(CastcoreError, RuntimeError):
    """A plugin raised or answered nonsense; the message names the plugin, the op and its inputs."""


def hookimpls_in_call_order(caller: pluggy.HookCaller) -> list[pluggy.HookImpl]:
    """The non-wrapper implementations of a hook in the order a firstresult call tries them.

    pluggy keeps implementations so that the last one is called first; this is the only
    place castcore relies on that, and tests/plugins/test_pluggy_order.py fails if pluggy changes it.
    """
    return [impl for impl in reversed(caller.get_hookimpls()) if not (impl.hookwrapper or impl.wrapper)]


def _call(impl: pluggy.HookImpl, invoke: OpInvoke, device: DeviceProfile) -> Any:
    available = {"invoke": invoke, "device": device}
    return impl.function(*(available[name] for name in impl.argnames))


def _function_name(impl: pluggy.HookImpl, invoke: OpInvoke, device: DeviceProfile) -> str:
    """The user's own function: the decorated one behind a claim table, else the hook function."""
    if isinstance(impl.plugin, ClaimTable):
        kind = ESTIMATOR if impl.function.__name__ == "estimate_op" else PROPERTIES
        claim = impl.plugin.find(kind, invoke.op, device.name)
        if claim is not None:
            return claim.fn.__qualname__
    return impl.function.__name__


def _describe_inputs(invoke: OpInvoke) -> str:
    return ", ".join(repr(t) for t in invoke.inputs()) or "no tensor inputs"


class Resolver:
    """Answers estimate and properties questions through the plugin order, caching by invoke key."""

    def __init__(self, pm: pluggy.PluginManager, display_name, on_error: str = "raise"):
        self.pm = pm
        self.display_name = display_name  # pluggy plugin name -> name shown to users
        self.on_error = (
            on_error  # "raise": stop at a plugin's error; "fallback": record it, ask the next plugin
        )
        self.errors: list[str] = []
        self._estimates: dict[tuple, Estimate] = {}
        self._properties: dict[tuple, tuple[PerformanceProperties | None, Source | None]] = {}
        self._profiles: dict[int, DeviceProfile] = {}

    def _device_key(self, device: DeviceProfile) -> int:
        """Cached answers belong to one profile object, not to its name: a profile changed under the same name
        (an efficiency variant in a sweep) is estimated afresh. The profile is kept so its id stays its own."""
        self._profiles.setdefault(id(device), device)
        return id(device)

    def clear_cache(self) -> None:
        """Forget every answer, so the next questions go to the plugins again."""
        self._estimates.clear()
        self._properties.clear()
        self._profiles.clear()

    def _error(
        self, impl: pluggy.HookImpl, invoke: OpInvoke, device: DeviceProfile, what: str
    ) -> EstimatorError:
        return EstimatorError(
            f"{self.display_name(impl.plugin_name)}: {_function_name(impl, invoke, device)} {what} "
            f"for {invoke.name} on inputs {_describe_inputs(invoke)}"
        )

    def _ask(self, caller: pluggy.HookCaller, invoke: OpInvoke, device: DeviceProfile, check):
        """Walk the implementations in call order; return (first checked answer, its impl) or (None, None).

        ``check(result, impl, invoke, device)`` turns a raw answer into a valid one or raises EstimatorError.
        """
        for impl in hookimpls_in_call_order(caller):
            try:
                try:
                    result = _call(impl, invoke, device)
                except EstimatorError:
                    raise  # already names the plugin at fault (a nested properties question)
                except (Exception, SystemExit) as exc:  # a plugin's bug, sys.exit() too, is reported by name
                    raise self._error(impl, invoke, device, f"raised {type(exc).__name__}: {exc}") from exc
                if result is None:
                    continue
                try:
                    return check(result, impl, invoke, device), impl
                except EstimatorError:
                    raise
                except Exception as exc:  # an answer so malformed that checking it failed
                    raise self._error(
                        impl, invoke, device, f"returned a malformed answer ({type(exc).__name__}: {exc})"
                    ) from exc
            except EstimatorError as exc:
                if self.on_error == "raise":
                    raise
                self.errors.append(str(exc))
        return None, None

    def estimate(self, invoke: OpInvoke, device: DeviceProfile) -> Estimate:
        """The first estimate in plugin order (the core's roofline answers last)."""
        cache_key = (invoke.key, self._device_key(device))
        cached = self._estimates.get(cache_key)
        if cached is not None:
            return cached
        estimate, impl = self._ask(self.pm.hook.estimate_op, invoke, device, self._checked_estimate)
        if estimate is not None:
            if estimate.source is None:
                estimate.source = Source(self.display_name(impl.plugin_name), STEP_ESTIMATOR)
            self._estimates[cache_key] = estimate
            return estimate
        raise EstimatorError(f"no plugin estimated {invoke.name}: the core plugin is not registered")

    def _checked_estimate(self, result: Any, impl: pluggy.HookImpl, invoke: OpInvoke, device) -> Estimate:
        if isinstance(result, Estimate):
            estimate = result
        elif isinstance(result, (int, float)) and not isinstance(result, bool):
            estimate = Estimate(time_s=float(result))
        else:
            raise self._error(
                impl, invoke, device, f"returned {type(result).__name__}, not an Estimate or seconds"
            )
        numbers = [
            estimate.time_s,
            estimate.compute_s,
            estimate.memory_s,
            estimate.comm_s,
            estimate.overhead_s,
        ]
        if not all(isinstance(x, (int, float)) and math.isfinite(x) and x >= 0 for x in numbers):
            raise self._error(
                impl,
                invoke,
                device,
                f"returned a time that is negative, NaN or infinite ({estimate.time_s!r})",
            )
        return estimate

    def properties(
        self, invoke: OpInvoke, device: DeviceProfile
    ) -> tuple[PerformanceProperties | None, Source | None]:
        """The first op_properties answer in plugin order, with its source; (None, None) if nobody claims it."""
        cache_key = (invoke.key, self._device_key(device))
        if cache_key in self._properties:
            return self._properties[cache_key]
        props, impl = self._ask(self.pm.hook.op_properties, invoke, device, self._checked_properties)
        answer = (
            (props, Source(self.display_name(impl.plugin_name), STEP_PROPERTIES)) if impl else (None, None)
        )
        self._properties[cache_key] = answer
        return answer

    def _checked_properties(
        self, result: Any, impl: pluggy.HookImpl, invoke: OpInvoke, device
    ) -> PerformanceProperties:
        if not isinstance(result, PerformanceProperties):
            raise self._error(
                impl, invoke, device, f"returned {type(result).__name__}, not PerformanceProperties"
            )
        problems = result.problems()
        if problems:
            raise self._error(impl, invoke, device, f"returned nonsense properties ({'; '.join(problems)})")
        return result
