"""Which plugins and devices a session loads, as the plugin options say (--custom-op-dir, --device-file,
--no-packs, --strict, --no-default-custom-op-dirs), and the profiles that can be read without loading any plugin."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from castcore.devices.profile import DeviceProfile
from castcore.devices.profile_files import load_device_file, package_profiles_in
from castcore.plugins.config import load_config
from castcore.plugins.packs import pack_infos, packs_without_profile_hooks, profile_folders


@dataclass(frozen=True)
class PluginOptions:
    """The plugin options; ``strict`` None lets castcore.toml and CASTCORE_STRICT decide."""

    custom_op_dir: list[str] = field(default_factory=list)
    device_file: list[str] = field(default_factory=list)
    no_packs: bool = False
    strict: bool | None = None
    no_default_custom_op_dirs: bool = False

    @classmethod
    def of(cls, values: object) -> PluginOptions:
        """From anything holding the options by name (parsed arguments, a sweep spec's settings)."""
        get = (
            values.get
            if isinstance(values, dict)
            else lambda name, default=None: getattr(values, name, default)
        )
        return cls(
            custom_op_dir=list(get("custom_op_dir") or []),
            device_file=list(get("device_file") or []),
            no_packs=bool(get("no_packs")),
            strict=get("strict") or None,
            no_default_custom_op_dirs=bool(get("no_default_custom_op_dirs")),
        )

    def merged(self, other: PluginOptions) -> PluginOptions:
        """Both sets together: every directory and file of each, a switch on when either has it on."""
        return PluginOptions(
            custom_op_dir=[*self.custom_op_dir, *other.custom_op_dir],
            device_file=[*self.device_file, *other.device_file],
            no_packs=self.no_packs or other.no_packs,
            strict=self.strict or other.strict or None,
            no_default_custom_op_dirs=self.no_default_custom_op_dirs or other.no_default_custom_op_dirs,
        )

    def session_kwargs(self) -> dict[str, Any]:
        """castcore.Session's (and load_config's) keyword arguments."""
        return {
            "custom_op_dirs": self.custom_op_dir or None,
            "device_files": self.device_file or None,
            "load_packs": [] if self.no_packs else None,
            "strict": self.strict,
            "default_custom_op_dirs": False if self.no_default_custom_op_dirs else None,
        }


def profiles_without_plugins(options: PluginOptions) -> dict[str, DeviceProfile] | None:
    """The profiles packs ship as data and the device files, read without importing a pack or torch; None when
    some plugin's device_profiles hook may have to run (then a Session must load the plugins)."""
    config = load_config(**options.session_kwargs())
    if config.custom_op_dirs or not packs_without_profile_hooks(config):
        return None
    folders = profile_folders(config)
    devices: dict[str, DeviceProfile] = {}
    for info, _ in pack_infos(config):
        if info.name in folders:
            for profile in package_profiles_in(folders[info.name], info.distribution or info.name):
                devices.setdefault(profile.name, profile)
    devices.update((p.name, p) for p in map(load_device_file, config.device_files))
    return dict(sorted(devices.items()))
