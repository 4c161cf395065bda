"""Building the PluginManager: core builtins, entry-point packs, custom-op files, each isolated.

Registration order is the priority order (pluggy calls the last registered first):
core (trylast) < packs (sorted by name, then reordered by config ``priority``) < custom-op
files < claims declared by the embedding program itself. A plugin that fails to load is
recorded with a one-line reason and never stops the others.
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass, field
from typing import Any

import pluggy

from castcore.plugins import hookspecs
from castcore.plugins.claims import Claim, ClaimTable, claims_of, declaring_modules, duplicates
from castcore.plugins.config import Config
from castcore.plugins.custom_op_dirs import checked_directory, file_modules, load_directory
from castcore.plugins.packs import SYS_PATH, PluginInfo, castcore_requirement_problem, pack_infos
from castcore.plugins.registration import register, register_with_claims, run_plugin_code
from castcore.recording.invoke import op_name

CORE_NAME = "core"


@dataclass
class LoadedPlugins:
    pm: pluggy.PluginManager
    infos: list[PluginInfo]
    core: Any  # the core plugin
    packages: set[str] = field(default_factory=set)  # castcore's and the packs' top-level packages

    def info_for(self, pluggy_name: str) -> PluginInfo | None:
        for info in self.infos:
            if pluggy_name in info.pluggy_names:
                return info
        return None

    def info_for_pack(self, name: str) -> PluginInfo | None:
        return next((i for i in self.infos if i.kind == "pack" and i.name == name), None)

    def label(self, pluggy_name: str) -> str:
        info = self.info_for(pluggy_name)
        return info.label if info else pluggy_name


def _load_pack(pm: pluggy.PluginManager, info: PluginInfo, ep: importlib.metadata.EntryPoint) -> None:
    problem = castcore_requirement_problem(info, ep, _version())
    if problem:  # refused before its code runs: it was written for another castcore
        info.fail(problem)
        return
    loaded, obj = run_plugin_code(
        info,
        ep.load,
        lambda exc: (
            f"import failed: {type(exc).__name__}: {exc}; fix the pack or disable it with "
            f"CASTCORE_DISABLE_PACKS={info.name}"
        ),
    )
    if loaded:
        register_with_claims(pm, info, obj, claims_of(ep.module.split(".")[0]))


def load_plugins(config: Config, core: Any) -> LoadedPlugins:
    """Register ``core`` (the core's own plugin, a ClaimTable), then the packs and files ``config`` allows. Two
    threads load plugins one after the other."""
    with (
        SYS_PATH
    ):  # a custom-op directory goes on sys.path while it loads (see castcore.plugins.packs.SYS_PATH)
        return _load_plugins(config, core)


def _load_plugins(config: Config, core: Any) -> LoadedPlugins:
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    core_info = PluginInfo(
        name=CORE_NAME,
        kind="core",
        origin="castcore.builtin",
        claims=core.claims,
        distribution="castcore",
        version=_version(),
    )
    register(pm, core_info, core)
    infos = [core_info]
    packages = {"castcore"}

    for info, ep in pack_infos(config):
        infos.append(info)
        if ep is not None:
            packages.add(ep.module.split(".")[0])
            if info.status == "loaded":
                _load_pack(pm, info, ep)

    # Earlier directories win, so they register last.
    for directory in reversed([checked_directory(d) for d in config.custom_op_dirs]):
        infos += load_directory(pm, directory)

    plugins = LoadedPlugins(pm=pm, infos=infos, core=core, packages=packages)
    refresh_scripts(plugins)
    return plugins


def _script_claims(packages: set[str]) -> dict[str, list[Claim]]:
    """The embedding program's own claims (e.g. from __main__), by top-level module: every claim no pack,
    custom-op file or castcore itself declared."""
    owned = file_modules()
    tops = sorted({m.split(".")[0] for m in declaring_modules() - owned} - packages)
    return {top: [c for c in claims_of(top) if c.module not in owned] for top in tops}


def refresh_scripts(plugins: LoadedPlugins) -> bool:
    """(Re-)register the program's own claims, after every other plugin so they are asked first; True
    when they changed since the last call, so answers given before may be stale."""
    fresh = _script_claims(plugins.packages)
    current = [i for i in plugins.infos if i.kind == "script"]
    if fresh == {i.name: i.claims for i in current}:
        return False
    for info in current:
        for name in info.pluggy_names:
            plugins.pm.unregister(name=name)
        plugins.infos.remove(info)
    for top, claims in fresh.items():
        info = PluginInfo(name=top, kind="script", origin=f"module {top}", claims=claims)
        plugins.infos.append(info)
        if register(plugins.pm, info, ClaimTable(claims)):
            info.warnings += duplicates(claims, op_name)
    return True


def _version() -> str | None:
    try:
        return importlib.metadata.version("castcore")
    except importlib.metadata.PackageNotFoundError:
        return None
