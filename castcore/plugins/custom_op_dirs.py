"""Custom-op directories: the user's own plugins as ``.py`` files, each loaded safely and on its own.

Every ``*.py`` in a directory is a plugin, except names starting with ``_``: those are helpers the plugins
may import (``from _helpers import x``), as may any module in the directory, because the directory is on
sys.path while its files load. Helpers are forgotten afterwards, so two directories may each have their
own ``_helpers.py``. Code that is writable by every user or owned by someone else is refused: it would
run with the user's rights.
"""

from __future__ import annotations

import importlib.util
import os
import re
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

import pluggy

from castcore.options.catalog import say
from castcore.plugins.claims import claims_in
from castcore.plugins.config import ConfigError
from castcore.plugins.packs import PluginInfo
from castcore.plugins.registration import register_with_claims, run_plugin_code

MODULE_PREFIX = "castcore_custom_op_"
HELPER_NOTE = "its name starts with _, so it is a helper the directory's files may import, not a plugin"

_loaded_files = 0
# Every module a custom-op file or its helpers made: their claims belong to that file, never to the
# embedding program (castcore.plugins.loading gives a program's own claims a plugin of their own).
_FILE_MODULES: set[str] = set()


def file_modules() -> set[str]:
    return set(_FILE_MODULES)


def unsafe_reason(path: Path) -> str | None:
    """Why code at ``path`` must not run with the user's rights, or None if it may."""
    st = path.stat()
    if st.st_mode & stat.S_IWOTH:
        return f"{path} is writable by every user (chmod o-w {path})"
    if hasattr(os, "getuid") and st.st_uid not in (os.getuid(), 0):
        return f"{path} is owned by uid {st.st_uid}, not by you (uid {os.getuid()})"
    return None


def _unsafe_entry(path: Path) -> str | None:
    """The entry itself (stat follows a symlink to its target) and, for a symlink, the target's folder,
    where anyone who may write could swap the target."""
    reason = unsafe_reason(path)
    if reason is None and path.is_symlink():
        target = path.resolve()
        reason = unsafe_reason(target.parent)
        if reason:
            reason = f"{path} links to {target}, and {reason}"
    return reason


def checked_directory(directory: Path) -> Path:
    """``directory`` resolved; a ConfigError naming the fix when it is missing or a file."""
    resolved = directory.expanduser().resolve()
    where = f"fix {say('custom_op_dir')} / CASTCORE_CUSTOM_OP_PATH / custom_op_dirs"
    if resolved.is_file():
        raise ConfigError(
            f"custom-op directory {resolved} is a file, not a directory; name the folder that holds "
            f"it instead ({where})"
        )
    if not resolved.is_dir():
        raise ConfigError(f"custom-op directory {resolved} does not exist; create it or {where}")
    return resolved


@dataclass
class _Folder:
    """One custom-op directory as found: its plugin files, helpers, and what in it is unsafe."""

    path: Path
    plugins: list[Path]
    helpers: list[Path]
    unsafe: dict[Path, str]  # entry -> why it must not run
    reason: str | None  # why the whole directory must not

    @classmethod
    def scan(cls, directory: Path) -> _Folder:
        entries = sorted(directory.iterdir())
        sources = [p for p in entries if p.suffix == ".py" and p.is_file()]
        unsafe = {p: r for p in entries if (p in sources or p.is_dir()) and (r := _unsafe_entry(p))}
        return cls(
            directory,
            [p for p in sources if not p.name.startswith("_")],
            [p for p in sources if p.name.startswith("_")],
            unsafe,
            unsafe_reason(directory),
        )

    @property
    def why_not_importable(self) -> str:
        """An import from the directory could reach any module in it (or its __pycache__), so the directory
        goes on sys.path only if everything in it is safe; else why not."""
        if self.reason is None and not self.unsafe:
            return ""
        return f"{self.path} is not importable: {self.reason or next(iter(self.unsafe.values()))}"

    def helper_modules(self, names: set[str]) -> set[str]:
        """Those of ``names`` that are modules of this directory, other than its plugin files (which are
        their own plugins even when another file imports them)."""
        return {
            name
            for name in names
            if (file := _module_file(name)) and file.is_relative_to(self.path) and file not in self.plugins
        }


def _module_file(name: str) -> Path | None:
    file = getattr(sys.modules.get(name), "__file__", None)
    return Path(file).resolve() if file else None


def _load_file(pm: pluggy.PluginManager, info: PluginInfo, path: Path, folder: _Folder) -> None:
    global _loaded_files
    _loaded_files += 1
    # A fresh module name per load, so two sessions loading the same file keep separate claims.
    stem = re.sub(r"\W", "_", path.stem)
    module_name = f"{MODULE_PREFIX}{_loaded_files}_{stem}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    # Found for every file given here: the folder scan gives .py files, which the path-based finder loads
    assert spec is not None and spec.loader is not None
    loader = spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    before = set(sys.modules)

    def describe(exc: BaseException) -> str:
        where = f" (line {exc.lineno})" if isinstance(exc, SyntaxError) else ""
        hint = (
            f" ({folder.why_not_importable})"
            if folder.why_not_importable and isinstance(exc, ImportError)
            else ""
        )
        return f"could not load{where}: {type(exc).__name__}: {exc}{hint}"

    loaded, _ = run_plugin_code(info, lambda: loader.exec_module(module), describe)
    helpers = folder.helper_modules(set(sys.modules) - before)
    _FILE_MODULES.update(helpers | {module_name})
    if not loaded:
        del sys.modules[module_name]
        return
    # A claim made in a helper module the file imported is the file's own.
    register_with_claims(pm, info, module, claims_in(helpers | {module_name}))


def load_directory(pm: pluggy.PluginManager, directory: Path) -> list[PluginInfo]:
    """Load every plugin file of one (resolved) directory; one PluginInfo per ``.py`` file, helpers included."""
    folder = _Folder.scan(directory)
    importable = not folder.why_not_importable
    before = set(sys.modules)
    if importable:
        sys.path.insert(0, str(directory))
    infos = []
    try:
        for path in reversed(folder.plugins):  # the first file by name registers last, so it is asked first
            info = PluginInfo(name=str(path), kind="file", origin=str(path))
            infos.append(info)
            reason = folder.reason or folder.unsafe.get(path)
            if reason:
                info.fail(f"refused: {reason}; code in it would run with your rights")
            else:
                _load_file(pm, info, path, folder)
    finally:
        if importable and str(directory) in sys.path:
            sys.path.remove(str(directory))
        # Forget what the files imported from the directory, so another directory's _helpers is its own.
        for name in set(sys.modules) - before:
            if (
                not name.startswith(MODULE_PREFIX)
                and (file := _module_file(name))
                and file.is_relative_to(directory)
            ):
                _FILE_MODULES.add(name)
                del sys.modules[name]
    for path in folder.helpers:
        info = PluginInfo(name=str(path), kind="file", origin=str(path), status="skipped", error=HELPER_NOTE)
        reason = folder.reason or folder.unsafe.get(path)
        if reason:
            info.fail(f"refused: {reason}; so no file in {directory} may import from the directory")
        infos.append(info)
    return infos
