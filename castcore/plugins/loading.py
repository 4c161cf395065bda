"""Building the PluginManager: core builtins, entry-point packs, custom-op files, each isolated.

Registration order is the priority order (pluggy calls the last registered first):
core (trylast) < packs (sorted by name, then reordered by config ``priority``) < custom-op
files < claims declared by the embedding script itself. A plugin that fails to load is
recorded with a one-line reason and never stops the others.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import stat
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pluggy

from castcore.plugins import hookspecs
from castcore.plugins.hookspecs import HOOK_NAMES
from castcore.plugins.packs import PluginInfo, pack_infos
from castcore.plugins.claims import ClaimTable, claims_of, declaring_modules
from castcore.plugins.config import Config, ConfigError

CORE_NAME = "core"


@dataclass
class LoadedPlugins:
    pm: pluggy.PluginManager
    infos: list[PluginInfo]
    core: Any  # the core plugin

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


def _register(pm: pluggy.PluginManager, info: PluginInfo, obj: Any, suffix: str = "") -> bool:
    """Register one object for ``info``; a spec mismatch marks the plugin failed instead of raising."""
    name = f"{info.kind}:{info.name}{suffix}"
    unknown = sorted(attr for attr in dir(obj) if attr not in HOOK_NAMES and pm.parse_hookimpl_opts(obj, attr) is not None)
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


def _register_with_claims(pm: pluggy.PluginManager, info: PluginInfo, obj: Any, package: str) -> None:
    """Register the plugin object (raw hookimpls) and, after it, its claim table (decorators)."""
    info.claims = claims_of(package)
    if not _register(pm, info, obj):
        return
    if info.claims and not _register(pm, info, ClaimTable(info.claims), "#claims"):
        pm.unregister(name=info.pluggy_names[0])
        info.pluggy_names.clear()


def _load_pack(pm: pluggy.PluginManager, info: PluginInfo, ep: importlib.metadata.EntryPoint) -> None:
    try:
        obj = ep.load()
    except Exception as exc:  # any import-time error of a pack is that pack's failure only
        info.fail(f"import failed: {type(exc).__name__}: {exc}; fix the pack or disable it with "
                  f"CASTCORE_DISABLE_PACKS={info.name}")
        return
    _register_with_claims(pm, info, obj, package=ep.module.split(".")[0])


def unsafe_reason(path: Path) -> str | None:
    """Why code at ``path`` must not run with the user's rights, or None if it may."""
    st = path.stat()
    if st.st_mode & stat.S_IWOTH:
        return f"{path} is writable by every user (chmod o-w {path})"
    if hasattr(os, "getuid") and st.st_uid not in (os.getuid(), 0):
        return f"{path} is owned by uid {st.st_uid}, not by you (uid {os.getuid()})"
    return None


def custom_op_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.glob("*.py") if not p.name.startswith("_"))


_loaded_files = 0


def _load_file(pm: pluggy.PluginManager, info: PluginInfo, path: Path) -> None:
    global _loaded_files
    reason = unsafe_reason(path) or unsafe_reason(path.parent)
    if reason:
        info.fail(f"refused: {reason}; code in it would run with your rights")
        return
    _loaded_files += 1
    # A fresh module name per load, so two sessions loading the same file keep separate claims.
    stem = re.sub(r"\W", "_", path.stem)
    module_name = f"castcore_custom_op_{_loaded_files}_{stem}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[module_name]
        where = f" (line {exc.lineno})" if isinstance(exc, SyntaxError) else ""
        info.fail(f"could not load{where}: {type(exc).__name__}: {exc}")
        return
    _register_with_claims(pm, info, module, package=module_name)


def load_plugins(config: Config, core: Any) -> LoadedPlugins:
    """Register ``core`` (the core's own plugin, a ClaimTable), then the packs and files ``config`` allows."""
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    core_info = PluginInfo(name=CORE_NAME, kind="core", origin="castcore.builtin", claims=core.claims,
                           distribution="castcore", version=_version())
    _register(pm, core_info, core)
    infos = [core_info]
    packages = {"castcore"}

    for info, ep in pack_infos(config):
        infos.append(info)
        if ep is not None:
            packages.add(ep.module.split(".")[0])
            if info.status == "loaded":
                _load_pack(pm, info, ep)

    # Earlier directories win, so they register last.
    for directory in reversed(config.custom_op_dirs):
        directory = directory.expanduser().resolve()
        if not directory.is_dir():
            raise ConfigError(f"custom-op directory {directory} does not exist; create it or fix "
                              f"--custom-op-dir / CASTCORE_CUSTOM_OP_PATH / custom_op_dirs")
        dir_reason = unsafe_reason(directory)
        for path in reversed(custom_op_files(directory)):
            info = PluginInfo(name=str(path), kind="file", origin=str(path))
            infos.append(info)
            if dir_reason:
                info.fail(f"refused: {dir_reason}; code in it would run with your rights")
            else:
                _load_file(pm, info, path)

    # Claims declared by the embedding program itself (e.g. __main__) win over everything.
    scripts = {m.split(".")[0] for m in declaring_modules()} - packages
    for top in sorted(s for s in scripts if not s.startswith("castcore_custom_op_")):
        info = PluginInfo(name=top, kind="script", origin=f"module {top}", claims=claims_of(top))
        infos.append(info)
        _register(pm, info, ClaimTable(info.claims))
    return LoadedPlugins(pm=pm, infos=infos, core=core)


def _version() -> str | None:
    try:
        return importlib.metadata.version("castcore")
    except importlib.metadata.PackageNotFoundError:
        return None


def hook_names(pm: pluggy.PluginManager, pluggy_name: str) -> list[str]:
    plugin = pm.get_plugin(pluggy_name)
    return sorted(caller.name for caller in pm.get_hookcallers(plugin) or ())
