"""Installed packs as entry points: their distributions, whether config enables them, and their profile data.

Torch-free: ``castcore devices`` lists the profiles packs ship as data without importing any pack.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

from castcore.plugins.claims import Claim
from castcore.plugins.config import Config, ConfigError
from castcore.tomlfiles import read_json

ENTRY_POINT_GROUP = "castcore"
# A pack may also name a folder of device-profile TOML files in this group, under the same entry-point
# name: castcore then reads them without importing the pack (its value: package.folder).
PROFILES_GROUP = "castcore.profiles"


@dataclass
class PluginInfo:
    """What castcore knows of one plugin, loaded or not: shown by ``castcore packs``."""

    name: str
    kind: str  # core | pack | file | script
    origin: str
    distribution: str | None = None
    version: str | None = None
    status: str = "loaded"  # loaded | disabled | failed | skipped
    error: str = ""  # why it failed or was skipped
    claims: list[Claim] = field(default_factory=list)
    hooks: list[str] = field(default_factory=list)
    pluggy_names: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # faults of a loaded plugin (--strict fails on them)
    notes: list[str] = field(default_factory=list)  # worth knowing, never a fault (a slow import)

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
        self.status, self.error = (
            "failed",
            " ".join(line.strip() for line in reason.splitlines() if line.strip()) or "failed",
        )


# Loading a custom-op directory puts it on sys.path and takes it off again; a scan of the entry points over a
# sys.path being edited in another thread can miss every pack. Both hold this (castcore.plugins.loading too).
SYS_PATH = threading.RLock()


def _entry_points() -> list[importlib.metadata.EntryPoint]:
    with SYS_PATH:
        found = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
    return sorted(found, key=lambda ep: (ep.name, ep.value))


def pack_infos(config: Config) -> list[tuple[PluginInfo, importlib.metadata.EntryPoint | None]]:
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
    result: list[tuple[PluginInfo, importlib.metadata.EntryPoint | None]] = []
    for name, eps in found.items():
        dists = [_dist_of(ep) for ep in eps]
        info = PluginInfo(
            name=name,
            kind="pack",
            origin=f"entry point {eps[0].value}",
            distribution=dists[0][0],
            version=dists[0][1],
        )
        if len(eps) > 1:
            # pluggy would keep whichever registered last; refuse both and say which ones.
            info.fail(
                f"entry point name {name!r} is provided by {' and '.join(d for d, _ in dists)}; "
                "uninstall one or rename its entry point"
            )
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


def castcore_requirement_problem(
    info: PluginInfo, ep: importlib.metadata.EntryPoint, castcore_version: str | None
) -> str | None:
    """Why the pack's distribution cannot run on this castcore (its Requires-Dist on castcore excludes
    this version), or None. pip enforces this on install, but not with --no-deps, --target or an old pack."""
    dist = getattr(ep, "dist", None)
    if dist is None or castcore_version is None:
        return None
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    for line in dist.requires or ():
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if canonicalize_name(req.name) != "castcore" or (
            req.marker and not req.marker.evaluate({"extra": ""})
        ):
            continue
        if not req.specifier.contains(castcore_version, prereleases=True):
            return (
                f"refused: it requires castcore{req.specifier}, but castcore {castcore_version} is installed; "
                f"upgrade castcore (pip install -U castcore) or disable the pack with "
                f"CASTCORE_DISABLE_PACKS={info.name}"
            )
    return None


def profile_folders(config: Config) -> dict[str, Path]:
    """Entry-point name -> the profile folder an enabled pack declares in ``castcore.profiles``."""
    enabled = {info.name for info, ep in pack_infos(config) if ep is not None and info.status == "loaded"}
    folders = {}
    for ep in importlib.metadata.entry_points(group=PROFILES_GROUP):
        if ep.name not in enabled:
            continue
        top, _, rest = ep.value.partition(".")
        spec = importlib.util.find_spec(top)  # a top-level package: found, not imported
        if spec is None or not spec.submodule_search_locations:
            continue
        folders[ep.name] = (
            Path(list(spec.submodule_search_locations)[0], *rest.split("."))
            if rest
            else Path(list(spec.submodule_search_locations)[0])
        )
    return folders


def cache_dir() -> Path:
    """castcore's cache folder: $XDG_CACHE_HOME/castcore, else ~/.cache/castcore."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "castcore"


def write_cache_file(path: Path, data: bytes) -> bool:
    """``data`` at ``path`` in castcore's cache, whole or not at all: written to a uniquely named temporary file
    beside it and renamed into place, so readers and other writers never see part of it. False when the folder
    cannot be written (a cache that cannot be written is only slower)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
        try:
            with os.fdopen(handle, "wb") as out:
                out.write(data)
            os.replace(temporary, path)
        finally:
            Path(temporary).unlink(missing_ok=True)
    except OSError:
        return False
    return True


def _hooks_file() -> Path:
    return cache_dir() / "pack-hooks.json"


def _pack_key(info: PluginInfo) -> str:
    return f"{info.distribution} {info.version} {info.origin}"


def remember_hooks(infos: list[PluginInfo]) -> None:
    """Note which hooks each loaded pack implements, so ``castcore devices`` knows which packs it need
    not import (those with no device_profiles hook). A cache that cannot be written is only slower."""
    known = _known_hooks()
    fresh = {_pack_key(i): i.hooks for i in infos if i.kind == "pack" and i.status == "loaded"}
    if all(known.get(k) == v for k, v in fresh.items()):
        return
    # Whole or not at all: a reader never sees half a record (which it would take for "no packs known").
    write_cache_file(_hooks_file(), json.dumps({**known, **fresh}, indent=1, sort_keys=True).encode())


def _known_hooks() -> dict[str, list[str]]:
    try:
        data = read_json(_hooks_file(), ConfigError, "record of pack hooks")
    except ConfigError:  # none yet, or unreadable: the packs are imported and it is written anew
        return {}
    return data if isinstance(data, dict) else {}


def packs_without_profile_hooks(config: Config) -> bool:
    """True when every enabled pack is known (from an earlier load of this very version) not to implement
    device_profiles: then its profiles are exactly the data it declares, and it need not be imported."""
    known = _known_hooks()
    for info, ep in pack_infos(config):
        if info.status == "disabled":
            continue
        hooks = known.get(_pack_key(info))
        if ep is None or hooks is None or "device_profiles" in hooks:
            return False
    return True
