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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pluggy

from . import hookspecs
from .builtin import CORE_NAME, CorePlugin
from .claims import Claim, ClaimTable, claims_of, declaring_modules
from .config import Config, ConfigError

ENTRY_POINT_GROUP = "castcore"
HOOK_NAMES = ("device_profiles", "estimate_op", "op_properties", "fuse_model")


@dataclass
class PluginInfo:
    """What castcore knows of one plugin, loaded or not: shown by ``castcore packs``."""

    name: str
    kind: str  # core | pack | file | script
    origin: str
    distribution: str | None = None
    version: str | None = None
    status: str = "loaded"  # loaded | disabled | failed
    error: str = ""
    claims: list[Claim] = field(default_factory=list)
    hooks: list[str] = field(default_factory=list)
    pluggy_names: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        """How reports name this plugin: a pack by distribution and version, a file by path."""
        if self.kind == "pack":
            return f"{self.distribution or self.name} {self.version or ''}".strip()
        if self.kind == "file":
            return f"file:{self.origin}"
        return self.name

    def fail(self, reason: str) -> None:
        # One line, but all of it: pluggy puts the useful part (the argument at fault) on later lines.
        self.status, self.error = "failed", " ".join(line.strip() for line in reason.splitlines() if line.strip()) or "failed"


@dataclass
class LoadedPlugins:
    pm: pluggy.PluginManager
    infos: list[PluginInfo]
    core: CorePlugin

    def info_for(self, pluggy_name: str) -> PluginInfo | None:
        for info in self.infos:
            if pluggy_name in info.pluggy_names:
                return info
        return None

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


def _entry_points() -> list[importlib.metadata.EntryPoint]:
    return sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: (ep.name, ep.value))


def _pack_infos(config: Config) -> list[tuple[PluginInfo, importlib.metadata.EntryPoint | None]]:
    found: dict[str, list[importlib.metadata.EntryPoint]] = {}
    for ep in _entry_points():
        found.setdefault(ep.name, []).append(ep)
    known = sorted(found)
    for setting in ("load_packs", "disable", "priority"):
        unknown = [n for n in (getattr(config, setting) or ()) if n not in found]
        if unknown:
            raise ConfigError(
                f"{setting} names {', '.join(unknown)}, which no installed pack provides "
                f"(from {config.origin} or the environment); installed packs: {', '.join(known) or 'none'}"
            )
    result = []
    for name, eps in found.items():
        dists = [_dist_of(ep) for ep in eps]
        info = PluginInfo(name=name, kind="pack", origin=f"entry point {eps[0].value}",
                          distribution=dists[0][0], version=dists[0][1])
        if len(eps) > 1:
            # pluggy would keep whichever registered last; refuse both and say which ones.
            info.fail(f"entry point name {name!r} is provided by {' and '.join(d for d, _ in dists)}; "
                      "uninstall one or rename its entry point")
            result.append((info, None))
            continue
        if (config.load_packs is not None and name not in config.load_packs) or name in config.disable:
            info.status = "disabled"
        result.append((info, eps[0]))
    order = {name: i for i, name in enumerate(reversed(config.priority))}
    # Sorted by name; packs named in priority go last (called first), the first named last of all.
    result.sort(key=lambda pair: (pair[0].name in order, order.get(pair[0].name, 0), pair[0].name))
    return result


def _dist_of(ep: importlib.metadata.EntryPoint) -> tuple[str, str | None]:
    dist = getattr(ep, "dist", None)
    if dist is None:
        return ep.value.split(":")[0], None
    return dist.metadata["Name"], dist.version


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


def load_plugins(config: Config) -> LoadedPlugins:
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    core = CorePlugin()
    core_info = PluginInfo(name=CORE_NAME, kind="core", origin="castcore.builtin", claims=core.claims,
                           distribution="castcore", version=_version())
    _register(pm, core_info, core)
    infos = [core_info]
    packages = {"castcore"}

    for info, ep in _pack_infos(config):
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
