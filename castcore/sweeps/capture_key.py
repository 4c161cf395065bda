"""What a capture's cache key is made of besides the workload: castcore's, torch's, transformers' and every
plugin's versions and sources, and the content of a config.json or factory module (castcore.sweeps.capture)."""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from castcore.workload.spec import is_factory

if TYPE_CHECKING:
    from castcore.plugins.host import PluginHost

# castcore's own sources: this file is castcore/sweeps/capture_key.py
CASTCORE_FOLDER = Path(__file__).resolve().parents[1]


def digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=repr).encode()).hexdigest()


@lru_cache(maxsize=None)
def _source_digest(folder: Path) -> str:
    """The content of a package's Python files: an edited checkout is a new version."""
    files = sorted(folder.rglob("*.py")) if folder.is_dir() else [folder]
    found = hashlib.sha256()
    for path in files:
        if path.is_file():
            found.update(str(path.relative_to(folder.parent)).encode() + b"\0" + path.read_bytes() + b"\0")
    return found.hexdigest()


def _version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "unknown"


def environment(host: PluginHost) -> str:
    """castcore, torch, transformers and every loaded plugin, versions and sources."""
    plugins = []
    for name, plugin in host.plugins.pm.list_name_plugin():
        source = getattr(plugin, "__file__", None)
        if source:
            path = Path(source)
            plugins.append((name, _source_digest(path.parent if path.name == "__init__.py" else path)))
        else:
            plugins.append((name, type(plugin).__qualname__))
    labels = sorted(f"{info.label} {info.status}" for info in host.plugins.infos)
    return digest(
        {
            "castcore": [_version("castcore"), _source_digest(CASTCORE_FOLDER)],
            "torch": torch.__version__,
            "transformers": _version("transformers"),
            "plugins": sorted(plugins),
            "labels": labels,
        }
    )


def model_identity(model: str) -> str:
    """A preset's name; a config.json's or factory module's content, so an edited one is a new model."""
    path = Path(model)
    if not is_factory(model) and path.suffix == ".json" and path.is_file():
        return hashlib.sha256(path.read_bytes()).hexdigest()
    if is_factory(model):
        import importlib.util

        try:
            found = importlib.util.find_spec(model.partition(":")[0])
        except (ImportError, ValueError):
            found = None
        if found is not None and found.origin and Path(found.origin).is_file():
            return f"{model} {hashlib.sha256(Path(found.origin).read_bytes()).hexdigest()}"
    return model
