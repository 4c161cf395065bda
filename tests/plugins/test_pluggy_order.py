"""castcore walks hook implementations itself to know who answered; it must match pluggy's own order."""

from __future__ import annotations

import pluggy

from castcore.plugins import hookspecs
from castcore.plugins.hookspecs import hookimpl
from castcore.plugins.resolve import hookimpls_in_call_order


def _plugin(name, calls, **opts):
    class Plugin:
        @hookimpl(**opts)
        def estimate_op(self, invoke, device):
            calls.append(name)

    return Plugin()


def test_our_call_order_is_pluggys_firstresult_order():
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    calls: list[str] = []
    for name, opts in [
        ("core", {"trylast": True}),
        ("pack-a", {}),
        ("pack-b", {}),
        ("eager", {"tryfirst": True}),
        ("user", {}),
    ]:
        pm.register(_plugin(name, calls, **opts), name=name)
    pm.hook.estimate_op(invoke=None, device=None)  # every implementation passes, so all are called
    assert calls == ["eager", "user", "pack-b", "pack-a", "core"]
    assert [impl.plugin_name for impl in hookimpls_in_call_order(pm.hook.estimate_op)] == calls
