"""The hook specifications castcore plugins implement (see docs/architecture.md, "The plugin hooks")."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from castcore.devices.costs import Estimate, PerformanceProperties
    from castcore.devices.profile import DeviceProfile
    from castcore.recording.invoke import OpInvoke

PROJECT = "castcore"
# The plugin API these hooks and the claim decorators make. A pack may set ``CASTCORE_API = N`` at module
# level; castcore refuses one that needs a higher N than this, by name, rather than fail inside it later.
API_VERSION = 1
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def device_profiles() -> list[DeviceProfile]:  # type: ignore[empty-body]  # a spec: pluggy never calls its body
    """Return the device profiles this plugin knows; every plugin's list is collected."""


@hookspec(firstresult=True)
def estimate_op(invoke: OpInvoke, device: DeviceProfile) -> Estimate | float | None:
    """Return the time of one operator call on ``device`` (an Estimate or seconds), or None to pass."""


@hookspec(firstresult=True)
def op_properties(invoke: OpInvoke, device: DeviceProfile) -> PerformanceProperties | None:
    """Return the FLOPs per dtype and the bytes moved by one operator call, or None to pass."""


@hookspec
def fuse_model(model, device: DeviceProfile) -> list[str] | None:
    """Rewrite ``model`` in place to call this plugin's fused operators on ``device`` (as a serving
    engine runs it with the vendor's kernels); return a line per replacement. Called for every model
    castcore builds unless ``--eager``; every plugin's implementation runs, then the core's own rewrites
    on what is left (castcore.deploy.kernels.fusing), which leave modules a plugin swapped in alone."""


# Every hook's name, read off the specs above so the list cannot drift from them.
HOOK_NAMES = tuple(name for name, value in list(globals().items()) if hasattr(value, f"{PROJECT}_spec"))
