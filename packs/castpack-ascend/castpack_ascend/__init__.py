"""castcore pack for Huawei Ascend NPUs: device profiles (TOML data files in ``profiles/``)."""

from __future__ import annotations

from importlib import resources

import castcore


@castcore.hookimpl
def device_profiles() -> list[castcore.DeviceProfile]:
    folder = resources.files(__package__) / "profiles"
    return [castcore.device_from_dict(castcore.devices.tomllib.loads(f.read_text(encoding="utf-8")),
                                      origin=f"castpack-ascend:profiles/{f.name}")
            for f in sorted(folder.iterdir(), key=lambda f: f.name) if f.name.endswith(".toml")]
