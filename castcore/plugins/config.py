"""castcore's configuration: ``[tool.castcore]`` in the nearest pyproject.toml or a castcore.toml,
then environment variables, then explicit arguments (CLI flags), each overriding the one before.

Two custom-op directories are searched without being named, after any that are: ``custom_op/`` in the
project root and the per-user ``$XDG_CONFIG_HOME/castcore/custom_op`` (``default_custom_op_dirs = false``
turns that off).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from castcore.tomlfiles import read_toml
from castcore.errors import CastcoreError

ENV_CUSTOM_OP_PATH = "CASTCORE_CUSTOM_OP_PATH"
ENV_LOAD_PACKS = "CASTCORE_LOAD_PACKS"
ENV_DISABLE_PACKS = "CASTCORE_DISABLE_PACKS"
ENV_STRICT = "CASTCORE_STRICT"


class ConfigError(CastcoreError, ValueError):
    """Configuration castcore cannot act on; the message names the setting and the fix."""


@dataclass(frozen=True)
class Config:
    custom_op_dirs: tuple[Path, ...] = ()
    load_packs: tuple[str, ...] | None = None  # None: every installed pack
    disable: tuple[str, ...] = ()
    priority: tuple[str, ...] = ()  # pack names, first wins
    default_device: str | None = None
    device_files: tuple[Path, ...] = ()
    strict: bool = False
    on_error: str = "raise"  # or "fallback"
    default_custom_op_dirs: bool = True  # also load the project's and the user's custom_op/ (load_config)
    origin: str = "defaults"  # the file the settings came from, for messages

    def with_overrides(self, **overrides: Any) -> Config:
        """A copy with every override that is not None applied; list settings are added to."""
        changes = {}
        for key, value in overrides.items():
            if value is None:
                continue
            if key in ("custom_op_dirs", "device_files"):
                value = tuple(Path(v) for v in value) + getattr(self, key)
            elif isinstance(value, list):
                value = tuple(value)
            changes[key] = value
        if changes.get("on_error", "raise") not in ("raise", "fallback"):
            raise ConfigError(f"on_error = {changes['on_error']!r}; use 'raise' or 'fallback'")
        return replace(self, **changes)


def find_config_file(start: Path) -> Path | None:
    """The nearest castcore.toml, or pyproject.toml with a [tool.castcore] table, at or above ``start``."""
    for folder in (start, *start.parents):
        candidate = folder / "castcore.toml"
        if candidate.is_file():
            return candidate
        candidate = folder / "pyproject.toml"
        if candidate.is_file() and "castcore" in _tool_table(candidate):
            return candidate
    return None


def _read_toml(path: Path) -> dict:
    return read_toml(path, ConfigError, "settings file")


def _tool_table(path: Path) -> dict:
    tool = _read_toml(path).get("tool", {})
    if not isinstance(tool, dict):
        raise ConfigError(f"{path}: 'tool' must be a table ([tool.castcore] holds castcore's settings)")
    return tool


def from_file(path: Path) -> Config:
    table = _tool_table(path).get("castcore", {}) if path.name == "pyproject.toml" else _read_toml(path)
    if not isinstance(table, dict):
        raise ConfigError(
            f"{path}: 'tool.castcore' must be a table of settings, not {table!r}: write "
            "[tool.castcore] and the settings under it"
        )
    known = {
        "priority",
        "disable",
        "custom_op_dirs",
        "default_device",
        "load_packs",
        "device_files",
        "strict",
        "on_error",
        "default_custom_op_dirs",
    }
    unknown = sorted(set(table) - known)
    if unknown:
        raise ConfigError(
            f"{path}: unknown castcore setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
        )
    for key in ("strict", "default_custom_op_dirs"):
        if key in table and not isinstance(table[key], bool):
            raise ConfigError(f"{path}: '{key}' must be true or false, not {table[key]!r}")
    for key in ("priority", "disable", "custom_op_dirs", "load_packs", "device_files"):
        if key in table and not (
            isinstance(table[key], list) and all(isinstance(v, str) for v in table[key])
        ):
            raise ConfigError(f"{path}: '{key}' must be a list of strings")
    # Relative directories are relative to the file that names them.
    for key in ("custom_op_dirs", "device_files"):
        if key in table:
            table[key] = [str((path.parent / v).resolve()) for v in table[key]]
    return Config(origin=str(path)).with_overrides(**table)


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _split(value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]


def project_root(start: Path) -> Path:
    """The nearest folder at or above ``start`` holding a castcore.toml or pyproject.toml, else ``start``."""
    for folder in (start, *start.parents):
        if (folder / "castcore.toml").is_file() or (folder / "pyproject.toml").is_file():
            return folder
    return start


def user_config_dir(environ: Mapping[str, str]) -> Path:
    """castcore's per-user folder: $XDG_CONFIG_HOME/castcore, else ~/.config/castcore."""
    return Path(environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "castcore"


def default_custom_op_locations(
    cwd: Path | None = None, environ: Mapping[str, str] | None = None
) -> list[tuple[str, Path]]:
    """(which, path) of the custom-op directories searched unless turned off, whether they exist or not:
    the project's first (it wins), then the user's."""
    environ = os.environ if environ is None else environ
    start = (cwd or Path.cwd()).resolve()
    return [("project", project_root(start) / "custom_op"), ("user", user_config_dir(environ) / "custom_op")]


def load_config(
    cwd: Path | None = None, environ: Mapping[str, str] | None = None, **overrides: Any
) -> Config:
    """File settings, then CASTCORE_* environment variables, then ``overrides`` (None means not given);
    then the default custom-op directories that exist, after every named one."""
    environ = os.environ if environ is None else environ
    path = find_config_file((cwd or Path.cwd()).resolve())
    config = from_file(path) if path else Config()
    env: dict[str, Any] = {}
    if environ.get(ENV_CUSTOM_OP_PATH):
        env["custom_op_dirs"] = [p for p in environ[ENV_CUSTOM_OP_PATH].split(os.pathsep) if p]
    if ENV_LOAD_PACKS in environ:
        env["load_packs"] = _split(environ[ENV_LOAD_PACKS])
    if environ.get(ENV_DISABLE_PACKS):
        env["disable"] = _split(environ[ENV_DISABLE_PACKS])
    if environ.get(ENV_STRICT, "").strip():
        value = environ[ENV_STRICT].strip().lower()
        if value not in _TRUE + _FALSE:
            raise ConfigError(f"{ENV_STRICT}={environ[ENV_STRICT]!r}; use 1 or 0")
        env["strict"] = value in _TRUE
    config = config.with_overrides(**env).with_overrides(**overrides)
    if not config.default_custom_op_dirs:
        return config
    named = {d.expanduser().resolve() for d in config.custom_op_dirs}
    found: list[Path] = []
    for _, folder in default_custom_op_locations(cwd, environ):
        folder = folder.resolve()
        if folder.is_dir() and folder not in named and folder not in found:
            found.append(folder)
    return replace(config, custom_op_dirs=config.custom_op_dirs + tuple(found))
