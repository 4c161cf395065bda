"""Running one plugin's code and registering what it declares, so that its faults stay its own.

Shared by the loaders of packs and of custom-op files (castcore.plugins.loading, castcore.plugins.custom_op_dirs).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pluggy

from castcore.plugins.claims import Claim, ClaimTable, duplicates
from castcore.plugins.hookspecs import API_VERSION, HOOK_NAMES
from castcore.plugins.packs import PluginInfo
from castcore.recording.invoke import op_name

# An import slower than this delays every castcore command; the plugin is named so its author can fix it.
SLOW_IMPORT_S = 2.0
# What an import is timed with; read at each call, so a test can put a clock of its own here.
clock = time.perf_counter


def run_plugin_code(
    info: PluginInfo, load: Callable[[], Any], describe: Callable[[BaseException], str]
) -> tuple[bool, Any]:
    """``(True, load())``, or ``(False, None)`` with ``info`` failed when the plugin's code raised anything,
    sys.exit() included (it must end the plugin, not castcore); Ctrl-C still stops castcore."""
    start = clock()
    try:
        value = load()
    except KeyboardInterrupt:
        raise
    except SystemExit as exc:
        info.fail(f"called sys.exit({exc.code!r}) while loading")
        return False, None
    except BaseException as exc:
        info.fail(describe(exc))
        return False, None
    took = clock() - start
    if took > SLOW_IMPORT_S:
        info.notes.append(
            f"took {took:.1f} s to import (more than {SLOW_IMPORT_S:.0f} s); every castcore command "
            "waits for it: import heavy modules inside the functions that use them"
        )
    return True, value


def register(pm: pluggy.PluginManager, info: PluginInfo, obj: Any, suffix: str = "") -> bool:
    """Register one object for ``info``; a spec mismatch marks the plugin failed instead of raising."""
    name = f"{info.kind}:{info.name}{suffix}"
    unknown = sorted(
        attr for attr in dir(obj) if attr not in HOOK_NAMES and pm.parse_hookimpl_opts(obj, attr) is not None
    )
    if unknown:
        # pluggy would register these and never call them; a misspelled hook must not pass silently.
        info.fail(f"{', '.join(unknown)} is not a castcore hook; the hooks are {', '.join(HOOK_NAMES)}")
        return False
    try:
        pm.register(obj, name=name)
    except pluggy.PluginValidationError as exc:
        info.fail(f"hook implementation does not match castcore's spec: {exc}")
        return False
    except ValueError as exc:  # the same object or name registered twice
        info.fail(str(exc))
        return False
    info.pluggy_names.append(name)
    info.hooks = sorted(set(info.hooks) | set(hook_names(pm, name)))
    return True


def register_with_claims(pm: pluggy.PluginManager, info: PluginInfo, obj: Any, claims: list[Claim]) -> None:
    """Register the plugin object (raw hookimpls) and, after it, its claim table (decorators)."""
    api = getattr(obj, "CASTCORE_API", API_VERSION)
    if not isinstance(api, int) or isinstance(api, bool) or api > API_VERSION:
        info.fail(
            f"refused: it declares CASTCORE_API = {api!r}, and this castcore supports plugin API "
            f"{API_VERSION} and lower; upgrade castcore (pip install -U castcore)"
        )
        return
    info.claims = claims
    if not register(pm, info, obj):
        return
    if claims and not register(pm, info, ClaimTable(claims), "#claims"):
        pm.unregister(name=info.pluggy_names[0])
        info.pluggy_names.clear()
        return
    info.warnings += duplicates(claims, op_name)


def hook_names(pm: pluggy.PluginManager, pluggy_name: str) -> list[str]:
    plugin = pm.get_plugin(pluggy_name)
    return sorted(caller.name for caller in pm.get_hookcallers(plugin) or ())
