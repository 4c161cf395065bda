"""Capture once, estimate many: the pipeline's capture step with a memory and a disk cache in front of it.

A capture depends on the workload and, for the device, only on what plugins do before it: which ops a pack
claims whole there (``PluginHost.whole_ops``), how a pack's ``fuse_model`` rewrites the model there (castpack-ascend
fuses only for ``ascend-*``), and, under W8A8, whether the device has the matrix rate the quantized products
need (the capture refuses it otherwise). Devices alike in these share a capture: every efficiency variant of a
profile, every device no pack rewrites for. What a pack's rewrite does is found by running the plugins'
``fuse_model`` hooks on the model built once per model, dtype and device, and recorded by the lines they report
and the class of every module afterwards; that fingerprint is cached on disk too.

The key also holds castcore's, torch's and transformers' versions, a digest of castcore's and every plugin's
source files (an edited checkout is a new version), and the content of a config.json or factory module
(castcore.sweeps.capture_key makes these).

``CaptureCache()`` takes and returns what ``castcore.deploy.pipeline.capture_workload`` does; given to a
pipeline as its capture step (``castcore.Session(capture_step=CaptureCache())``), it serves that session's
``estimate``, ``serve`` (every step) and ``simulate`` (every mixed batch its step-time model captures) unchanged.
"""

from __future__ import annotations

import functools
import json
import zlib
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import replace
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from torch import nn

from castcore.recording import stored
from castcore.recording.recorder import CAPTURE_LOCK, Capture
from castcore.sweeps import store
from castcore.sweeps.capture_key import digest, environment, model_identity
from castcore.sweeps.store import Stats
from castcore.workload.models import BuiltModel
from castcore.workload.spec import Workload, is_factory

if TYPE_CHECKING:
    from castcore.devices.profile import DeviceProfile
    from castcore.plugins.host import PluginHost

# Of a stored entry (3: JSON through castcore.recording.stored); a new one makes every old key miss.
FORMAT = 3
MEMORY_ENTRIES = 32


class CaptureCache:
    """The pipeline's capture step with a memory cache (this process) and the disk cache behind it."""

    def __init__(self, disk: bool = True):
        from castcore.deploy.pipeline import capture_workload

        self.original = capture_workload
        self.disk = disk
        self.stats = Stats()
        self._memory: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._environment: dict[int, str] = {}
        self._fused: dict[str, str] = {}
        self._keys: dict[Any, Any] = {}
        self.on_capture: Callable[[], None] | None = None  # called once, when a capture is really made

    def _capturing(self) -> None:
        said, self.on_capture = self.on_capture, None
        if said:
            said()

    @property
    def warnings(self) -> list[str]:
        """Entries discarded, a folder refused or not writable: each said once (kept with the counts, so a sweep's
        workers send them back with their tasks)."""
        return self.stats.warnings

    def _warn(self, message: str) -> None:
        if message not in self.stats.warnings:
            self.stats.warnings.append(message)

    def __call__(
        self,
        host: PluginHost,
        workload: Workload,
        device: DeviceProfile,
        progress: Callable[[int], None] | None = None,
    ) -> tuple[BuiltModel, Capture]:
        if not workload.named:  # a module object: nothing to key it by
            self._capturing()
            return self.original(host, workload, device, progress)
        key = self.key(host, workload, device)
        entry = self._find(key)
        if entry is None:
            self._capturing()
            built, captured = self.original(host, workload, device, progress)
            self._keep(key, built, captured)
            return built, captured
        return self._built(entry, workload), entry["capture"]

    def decode_steps(
        self,
        host: PluginHost,
        workload: Workload,
        device: DeviceProfile,
        kv_lens: list[int],
        progress: Callable[[int], None] | None = None,
    ) -> tuple[BuiltModel, dict[int, Capture]]:
        """What ``castcore.deploy.pipeline.capture_decode_steps`` gives: the steps found in the cache, and the
        rest captured from one built model."""
        from castcore.deploy.pipeline import capture_decode_steps

        steps = {kv: replace(workload, kv_len=kv) for kv in kv_lens}
        keys = {kv: self.key(host, step, device) for kv, step in steps.items()} if workload.named else {}
        captures: dict[int, Capture] = {}
        built = None
        for kv, key in keys.items():
            entry = self._find(key)
            if entry is not None:
                captures[kv] = entry["capture"]
                built = built or self._built(entry, steps[kv])
        missing = [kv for kv in kv_lens if kv not in captures]
        if missing:
            self._capturing()
            made, fresh = capture_decode_steps(host, steps[missing[0]], device, missing[1:], progress)
            for kv, captured in fresh.items():
                if workload.named:
                    self._keep(keys[kv], made, captured)
                captures[kv] = captured
            built = made
        return built, captures

    def mixed(
        self,
        host: PluginHost,
        workload: Workload,
        device: DeviceProfile,
        chunks: tuple,
        capture: Callable[[], tuple[BuiltModel, Capture]],
    ) -> tuple[BuiltModel, Capture]:
        """What ``capture()`` gives for one mixed batch (castcore.serving.mixed_batch): ``workload`` is its packed row,
        ``chunks`` its sequences as (new tokens, cached tokens, samples), which the key adds."""
        key = digest({"mixed": self.key(host, workload, device), "chunks": [list(c) for c in chunks]})
        entry = self._find(key)
        if entry is None:
            self._capturing()
            built, captured = capture()
            self._keep(key, built, captured)
            return built, captured
        return self._built(entry, workload), entry["capture"]

    def priced(
        self,
        host: PluginHost,
        workload: Workload,
        device: DeviceProfile,
        chunks: tuple,
        price: Callable[[], Any],
    ) -> Any:
        """What ``price()`` makes of one mixed batch on ``device`` (plain data: castcore.serving.step_time's
        ladder point), kept on disk. Its key adds the whole profile to the capture's, since every number of it
        prices; it is made anew when a plugin is an object with no source file to key its estimates by."""
        if not (self.disk and workload.named and _keyed_by_source(host)):
            return price()
        key = digest(
            {
                "priced": self.key(host, workload, device),
                "chunks": [list(c) for c in chunks],
                "profile": repr(device),
            }
        )
        data = self._read(key, ".priced")
        if data is not None:
            try:
                entry = json.loads(zlib.decompress(data))
                if entry.get("format") == FORMAT:
                    return entry["value"]
            except (zlib.error, ValueError, AttributeError):
                pass  # cut or altered: priced again and stored over
        value = price()
        store.write(key, ".priced", zlib.compress(json.dumps({"format": FORMAT, "value": value}).encode(), 1))
        return value

    def _find(self, key: str) -> dict[str, Any] | None:
        """The entry of ``key`` from this process's memory, else from disk; None when it must be captured."""
        entry = self._memory.get(key)
        if entry is not None:
            self.stats.reused += 1
        elif self.disk and (entry := self._load(key)) is not None:
            self.stats.loaded += 1
            self._intern(entry["capture"])
        else:
            return None
        self._remember(key, entry)
        return entry

    def _keep(self, key: str, built: BuiltModel, captured: Capture) -> None:
        self.stats.captured += 1
        self._intern(captured)
        entry = {
            "format": FORMAT,
            "description": built.description,
            "notes": list(built.notes),
            "config": _plain_config(built.config),
            "kv_cache_shape": built.kv_cache_shape,
            "capture": captured,
            "layers": _layers(built.model),
        }
        if not (self.disk and self._store(key, entry)):
            self.stats.unstored += 1
        self._remember(key, entry)

    def _intern(self, captured: Capture) -> None:
        """Give equal calls one key object, across every capture of this process: the estimator cache then finds
        a call by identity instead of comparing its arguments, four times per call and device."""
        for invoke in captured.invokes:
            key = invoke.key
            invoke._key = self._keys.setdefault(key, key)

    def key(self, host: PluginHost, workload: Workload, device: DeviceProfile) -> str:
        env = self._environment.get(id(host))
        if env is None:
            env = self._environment[id(host)] = environment(host)
        return digest(
            {
                "format": FORMAT,
                "environment": env,
                "model": model_identity(workload.model),
                "workload": workload.options(),
                "device": self.device_signature(host, workload, device),
            }
        )

    def device_signature(self, host: PluginHost, workload: Workload, device: DeviceProfile) -> dict[str, Any]:
        """What of ``device`` the capture depends on (see the module docstring)."""
        signature: dict[str, Any] = {
            "whole_ops": sorted(
                (str(op), sorted(map(str, outranking))) for op, outranking in host.outranking(device).items()
            )
        }
        if workload.activations is not None or workload.weights in ("fp8-block", "nvfp4", "mxfp4"):
            signature["mma_dtypes"] = sorted(device.mma_flops)  # which products run, and which are refused
        if workload.fuse and not workload.train and host.plugins.pm.hook.fuse_model.get_hookimpls():
            signature["fused"] = self._fuse_fingerprint(host, workload, device)
        return signature

    def _fuse_fingerprint(self, host: PluginHost, workload: Workload, device: DeviceProfile) -> str:
        # The plugins' rewrite depends on the model's modules, which a preset or config.json builds the same at
        # any batch and length; a factory may build another model for each, so it is probed as asked.
        probe = (
            workload
            if is_factory(workload.model)
            else Workload(model=workload.model, dtype=workload.dtype, batch=1, seq=8)
        )
        key = digest(
            {
                "format": FORMAT,
                "environment": self._environment[id(host)],
                "device": repr(device),
                "model": model_identity(workload.model),
                "probe": probe.options(),
            }
        )
        if key in self._fused:
            return self._fused[key]
        found = self._read_fused(key) if self.disk else None
        if found is None:
            from castcore.deploy.pipeline import build

            with CAPTURE_LOCK:  # building touches process-wide state, as a capture does
                built = build(probe)
                lines = host.fuse(built.model, device)
            modules = [
                f"{name}:{type(m).__module__}.{type(m).__qualname__}"
                for name, m in built.model.named_modules()
            ]
            found = digest({"lines": lines, "modules": modules})
            if self.disk:
                store.write(key, ".fused", found.encode())
        self._fused[key] = found
        return found

    def _read(self, key: str, suffix: str) -> bytes | None:
        try:
            return store.read(key, suffix)
        except store.Refused as refused:
            self._warn(str(refused))
            return None

    def _read_fused(self, key: str) -> str | None:
        data = self._read(key, ".fused")
        try:
            text = data.decode("ascii") if data is not None else None
        except UnicodeDecodeError:
            text = None
        if data is not None and (text is None or len(text) != 64):
            self._warn(
                f"discarded the unreadable cache entry {store.captures_dir() / (key + '.fused')}; "
                "rebuilding it"
            )
            return None
        return text

    def _load(self, key: str) -> dict[str, Any] | None:
        data = self._read(key, ".capture")
        if data is None:
            return None
        try:
            entry = stored.loads(data)
        except (
            stored.StoredError
        ) as exc:  # cut, altered, or an op no longer registered: capture anew, store over
            self._warn(
                f"discarded the unreadable cache entry {store.captures_dir() / (key + '.capture')} ({exc}); "
                "capturing it again"
            )
            return None
        return entry if entry.get("format") == FORMAT else None

    def _store(self, key: str, entry: dict[str, Any]) -> bool:
        try:
            data = stored.dumps(entry)
        except stored.Unstorable:  # an op that is a Python callable, an object argument: kept in memory only
            return False
        if store.write(key, ".capture", data):
            return True
        self._warn(
            f"the capture cache folder {store.captures_dir()} cannot be written, so nothing is cached for "
            "the next run (set XDG_CACHE_HOME to a folder you can write)"
        )
        return False

    def _remember(self, key: str, entry: dict[str, Any]) -> None:
        self._memory[key] = entry
        self._memory.move_to_end(key)  # the most recently used goes last, the first to go is the least
        while len(self._memory) > MEMORY_ENTRIES:
            self._memory.popitem(last=False)

    def _built(self, entry: dict[str, Any], workload: Workload) -> BuiltModel:
        """What the pipeline reads of a built model after its capture. The model itself is read only to split a
        capture into pipeline stages, by its class name and its decoder layers; a stand-in with those serves."""
        return BuiltModel(
            model=_stand_in(*entry["layers"]),  # one per shape, shared: nothing writes to it
            description=entry["description"],
            notes=list(entry["notes"]),
            config=entry["config"],
            kv_cache_shape=entry["kv_cache_shape"],
        )


def _keyed_by_source(host: PluginHost) -> bool:
    """Whether the environment digest covers every plugin's code (castcore.sweeps.capture_key): a module's source
    file, or castcore's own for its objects (the core, a pack's claim table); not a caller's plugin object."""
    return all(
        getattr(plugin, "__file__", None) or type(plugin).__module__.startswith("castcore.")
        for _, plugin in host.plugins.pm.list_name_plugin()
    )


def _plain_config(config: Any) -> Any:
    """A built transformers config as a plain object with the same attributes (aliases such as GPT-2's n_head
    too): unpickling the config class itself would import much of transformers, seconds in a fresh worker."""
    to_dict = getattr(config, "to_dict", None)
    if config is None or isinstance(config, dict) or to_dict is None:
        return config
    plain = SimpleNamespace()
    for name in {*to_dict(), *(getattr(config, "attribute_map", None) or {})}:
        try:
            value = getattr(config, name)
        except Exception:  # a property that needs what this config lacks: it has no such field
            continue
        setattr(plain, name, _plain_config(value) if hasattr(value, "to_dict") else value)
    return plain


def _layers(model: nn.Module) -> tuple[str, str | None, int]:
    """The model's class name, and its decoder layers' path and count (None: it has none)."""
    from castcore.deploy.parallel.sequence import decoder_layers

    found = decoder_layers(model)
    return (
        (type(model).__name__, None, 0) if found is None else (type(model).__name__, found[0], len(found[1]))
    )


@functools.lru_cache(maxsize=8)
def _stand_in(name: str, path: str | None, count: int) -> nn.Module:
    """An empty module named as the model, with ``count`` empty decoder layers at ``path``: what
    castcore.deploy.parallel.pipeline_stages reads to split a capture (the records name the modules that made them)."""
    root = type(name, (nn.Module,), {})()
    if path:
        holder = root
        *parents, last = path.split(".")
        for part in parents:
            holder.add_module(part, nn.Module())
            holder = getattr(holder, part)
        holder.add_module(last, nn.ModuleList(nn.Module() for _ in range(count)))
        root.config = SimpleNamespace(num_hidden_layers=count)
    return root
