"""The plugin host: one configuration's plugins loaded, and the answers they give about ops and devices.

A PluginHost loads the installed packs, custom-op files and the program's claims around the core's plugin it
is given, collects the devices they provide, and answers which device a name means, which ops a capture keeps
whole, and how the plugins rewrite a model (``fuse_model``). It estimates no model: castcore.deploy.pipeline
does, with a host; ``castcore.Session`` is a host with that pipeline on top.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any

from castcore.hf.versions import version_warnings
from castcore.devices.profile import DeviceError, DeviceProfile
from castcore.devices.profile_files import load_device_file, package_profiles_in
from castcore.errors import did_you_mean
from castcore.options.catalog import say
from castcore.plugins.claims import ClaimTable, declared_count
from castcore.plugins.config import Config, load_config
from castcore.plugins.loading import LoadedPlugins, load_plugins, refresh_scripts
from castcore.plugins.packs import profile_folders, remember_hooks
from castcore.plugins.resolve import Resolver, hookimpls_in_call_order
from castcore.recording.invoke import op_name

if TYPE_CHECKING:
    import torch


class PluginHost:
    """Plugins and devices loaded once, from ``config`` with any Config field given as an override.

    ``core`` is the core's own plugin (castcore.builtin.CorePlugin), asked after every other; it is handed this
    host's resolver, through which it asks the others for op properties.
    """

    def __init__(self, core: ClaimTable, config: Config | None = None, **overrides: Any):
        self.config = config.with_overrides(**overrides) if config else load_config(**overrides)
        self.plugins: LoadedPlugins = load_plugins(self.config, core)
        self.resolver = Resolver(self.plugins.pm, self.plugins.label, on_error=self.config.on_error)
        self.plugins.core.resolver = self.resolver
        self._claims_seen = declared_count()
        infos = self.plugins.infos
        self.warnings: list[str] = [
            f"{info.label}: {info.error}" for info in infos if info.status == "failed"
        ]
        self.warnings += [f"{info.label}: {warning}" for info in infos for warning in info.warnings]
        # Worth telling (a slow import), but no fault: --strict does not fail on these.
        self.notes: list[str] = [f"{info.label}: {note}" for info in infos for note in info.notes]
        self.notes += version_warnings()  # a torch or transformers release the test suite does not run on
        remember_hooks(self.plugins.infos)
        self.devices: dict[str, DeviceProfile] = self._collect_devices()
        # A claim on a device glob that matches no installed device: likely a typo, and never asked (no fault).
        self.notes += self._unmatched_device_claims()

    def refresh_claims(self) -> None:
        """Take in claims the program declared after this host was made (a decorator in __main__ run later), so
        they answer from now on; the default session does this each time it is used."""
        if declared_count() == self._claims_seen:
            return
        self._claims_seen = declared_count()
        if refresh_scripts(self.plugins):
            self.resolver.clear_cache()

    def _collect_devices(self) -> dict[str, DeviceProfile]:
        devices: dict[str, DeviceProfile] = {}
        provider: dict[str, str] = {}  # device name -> the plugin that gave it
        for impl in reversed(self.plugins.pm.hook.device_profiles.get_hookimpls()):
            label = self.plugins.label(impl.plugin_name)
            try:
                # pluggy types what a hook returns as object; each item is checked below, and what is not a
                # list raises here and is reported
                profiles = list(impl.function() or ())  # type: ignore[call-overload]
            except (Exception, SystemExit) as exc:  # sys.exit() in a plugin ends the plugin, not castcore
                self.warnings.append(f"{label}: device_profiles raised {type(exc).__name__}: {exc}")
                continue
            for profile in profiles:
                if not isinstance(profile, DeviceProfile):
                    self.warnings.append(
                        f"{label}: device_profiles returned {type(profile).__name__}, not a DeviceProfile"
                    )
                elif profile.name in devices:
                    self.warnings.append(
                        f"device {profile.name!r} is provided by both {provider[profile.name]} "
                        f"and {label}; using {provider[profile.name]}'s (set priority to choose)"
                    )
                else:
                    devices[profile.name] = profile if profile.origin else replace(profile, origin=label)
                    provider[profile.name] = label
        for name, folder in profile_folders(self.config).items():  # profiles packs ship as data
            info = self.plugins.info_for_pack(name)
            if info is None or info.status != "loaded":
                continue
            for profile in package_profiles_in(folder, info.distribution or name):
                if profile.name in devices:
                    self.warnings.append(
                        f"device {profile.name!r} is provided by both {provider[profile.name]} "
                        f"and {info.label}; using {provider[profile.name]}'s (set priority to choose)"
                    )
                else:
                    devices[profile.name], provider[profile.name] = profile, info.label
        self._file_devices = []
        for path in self.config.device_files:
            profile = load_device_file(path)
            self._file_devices.append(profile.name)
            if profile.name in devices:
                self.warnings.append(f"{path} replaces device {profile.name!r} from {provider[profile.name]}")
            devices[profile.name] = profile
        return dict(sorted(devices.items()))

    def _unmatched_device_claims(self) -> list[str]:
        """A line per claim whose device glob matches no installed device: likely a typo, and never asked."""
        lines, seen = [], set()
        for info in self.plugins.infos:
            if info.kind == "core" or info.status != "loaded":
                continue
            for claim in info.claims:
                key = (info.name, claim.fn, claim.device)
                if claim.device is None or key in seen or any(claim.matches(name) for name in self.devices):
                    continue
                seen.add(key)
                lines.append(
                    f"{info.label}: {claim.fn.__qualname__} claims {op_name(claim.op)} on devices "
                    f"{claim.device!r}, which matches no installed device "
                    f"({', '.join(self.devices) or 'none installed'})"
                )
        return lines

    def device(self, name: str | DeviceProfile | None = None) -> DeviceProfile:
        """A device by name; None picks the configured default, else a --device-file's device, else the
        first installed profile marked ``default``, else the first by name."""
        if isinstance(name, DeviceProfile):
            return name
        name = name or self.config.default_device
        if name is None:
            if self._file_devices:
                return self.devices[self._file_devices[0]]
            marked = [d for d in self.devices.values() if d.default]
            chosen = marked or list(self.devices.values())
            if not chosen:
                raise DeviceError(
                    "no device profiles are installed: install a pack (pip install castpack-ascend) "
                    f"or pass {say('device_file', 'my.toml')}"
                )
            return chosen[0]
        if name not in self.devices:
            raise DeviceError(
                f"unknown device {name!r}{self._nearest(name)}; installed: "
                f"{', '.join(self.devices) or 'none'} "
                "(castcore devices lists them)"
            )
        return self.devices[name]

    def _nearest(self, name: str) -> str:
        """The profile a mistyped device name means: the one whose file is called so (a pack's
        atlas-800t-a2-910b2.toml holds ascend-910b2), else the names spelled alike."""
        for device in self.devices.values():
            file = PurePosixPath(device.origin.rpartition(":")[2])
            if file.stem.lower() == name.lower():
                return f" (did you mean {device.name!r}, the profile in {file.name}?)"
        return did_you_mean(name, self.devices)

    def default_by_name(self) -> str | None:
        """Why the default device is merely the first installed profile by name (no configured default, no
        --device-file, no profile marked default: castpack-ascend, which marks ascend-910b3, is missing), or None."""
        if self.config.default_device or self._file_devices or not self.devices:
            return None
        if any(d.default for d in self.devices.values()):
            return None
        first = next(iter(self.devices))
        return (
            f"no installed profile is marked default (castpack-ascend marks ascend-910b3: pip install "
            f"castpack-ascend); using {first}, the first installed by name ({say('device')} chooses another)"
        )

    def whole_ops(self, device: str | DeviceProfile | None = None) -> frozenset:
        """The ops a capture for ``device`` records as one call although torch decomposes them (see
        castcore.recording.whole): every op a pack, custom-op file or the program claims there. The core's
        claims keep nothing whole, so a model no plugin claims such an op for is captured as before.
        None: the claims for any device, for a capture estimated on several."""
        name = None if device is None else self.device(device).name
        return frozenset(
            op
            for plugin in self.plugins.pm.get_plugins()
            if isinstance(plugin, ClaimTable) and plugin is not self.plugins.core
            for op in plugin.claimed_ops(name)
        )

    def outranking(self, device: str | DeviceProfile | None = None) -> dict[Any, frozenset]:
        """Each op of ``whole_ops(device)`` with the ops claimed there by plugins asked before its own claimer (a
        custom-op file before a pack, a pack before another by priority): a call of it whose decomposition runs
        one of those is captured op by op, so the earlier claim answers (castcore.recording.whole)."""
        name = None if device is None else self.device(device).name
        tables = [
            impl.plugin
            for impl in hookimpls_in_call_order(self.plugins.pm.hook.estimate_op)
            if isinstance(impl.plugin, ClaimTable) and impl.plugin is not self.plugins.core
        ]
        claimed = [table.claimed_ops(name) for table in tables]
        found: dict[Any, frozenset] = {}
        for rank, ops in enumerate(claimed):
            before = frozenset().union(*claimed[:rank])
            for op in ops:
                found.setdefault(op, before - {op})
        return found

    def fuse(self, model: torch.nn.Module, device: str | DeviceProfile | None = None) -> list[str]:
        """Let every plugin swap parts of ``model`` for its fused operators on ``device``; what each did.

        A plugin that raises is reported in ``warnings`` and the model keeps what the others did.
        """
        profile = self.device(device)
        done: list[str] = []
        for impl in reversed(self.plugins.pm.hook.fuse_model.get_hookimpls()):
            label = self.plugins.label(impl.plugin_name)
            try:
                given = {"model": model, "device": profile}
                # pluggy types what a hook returns as object: the lines a plugin says it did
                lines = impl.function(*(given[a] for a in impl.argnames)) or ()
                done += [f"{label}: {line}" for line in lines]  # type: ignore[attr-defined]
            except Exception as exc:
                self.warnings.append(f"{label}: fuse_model raised {type(exc).__name__}: {exc}")
        return done
