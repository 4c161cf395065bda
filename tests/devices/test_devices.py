"""Device profiles load from TOML, and every mistake is named with its file and field."""

from __future__ import annotations

from pathlib import Path

import pytest

import castcore
from castcore.devices.profile import DeviceError

PACK_PROFILES = Path(__file__).parents[2] / "packs" / "castpack-ascend" / "castpack_ascend" / "profiles"


def _write(tmp_path, text: str) -> Path:
    path = tmp_path / "dev.toml"
    path.write_text(text)
    return path


GOOD = """
name = "tiny"
vendor = "test"
memory_bytes = 1e9
memory_bandwidth = 1e11
[mma_flops]
bfloat16 = 1e13
[gp_flops]
float32 = 1e12
[[interconnect]]
name = "link"
devices = 4
bandwidth = 1e10
latency_s = 1e-6
[sources]
memory_bytes = "test value"
memory_bandwidth = "test value"
mma_flops = "test value"
gp_flops = "test value"
"interconnect.link" = "test value"
"""


def test_a_good_file_loads(tmp_path):
    profile = castcore.load_device_file(_write(tmp_path, GOOD))
    assert profile.name == "tiny"
    assert profile.mma_flops == {"bfloat16": 1e13}
    assert profile.interconnect[0].devices == 4
    assert profile.interconnect[0].topology == "switch"
    # no in-network reduction unless the file says so
    assert profile.interconnect[0].reduction_efficiency == 0.0


@pytest.mark.parametrize(
    "change, message",
    [
        (("memory_bandwidth = 1e11", "memory_bandwidth = -1"), "'memory_bandwidth' = -1"),
        (("bfloat16 = 1e13", "bfloat17 = 1e13"), "'mma_flops.bfloat17' is not a torch dtype name"),
        (('"interconnect.link" = "test value"', ""), "no source for interconnect.link"),
        (('mma_flops = "test value"', ""), "no source for mma_flops.bfloat16"),
        (('vendor = "test"', 'vendor = "test"\ncolour = "red"'), "unknown field(s) colour"),
        (("devices = 4", "devices = 0"), "'interconnect[0].devices' must be a whole number"),
        (
            ("devices = 4", "devices = 4\nreduction_efficiency = 1.5"),
            "'interconnect[0].reduction_efficiency' = 1.5",
        ),
        (
            ("devices = 4", 'devices = 4\ntopology = "ring"\nreduction_efficiency = 0.5'),
            "'interconnect[0].reduction_efficiency' needs topology 'switch'",
        ),
        (
            ("devices = 4", "devices = 4\nreduction_latency_s = -1"),
            "'interconnect[0].reduction_latency_s' = -1",
        ),
        (
            ("devices = 4", "devices = 4\none_shot_latency_s = 5e-6"),
            "'interconnect[0]' gives part of the engine all-reduce; give all of engine_allreduce_max_bytes",
        ),
        (
            ("devices = 4", "devices = 4\none_shot_bandwidth = -1"),
            "'interconnect[0].one_shot_bandwidth' = -1",
        ),
        (("vendor", "[vendor"), "not valid TOML"),
    ],
)
def test_mistakes_name_the_file_and_field(tmp_path, change, message):
    path = _write(tmp_path, GOOD.replace(*change, 1))
    with pytest.raises(DeviceError) as info:
        castcore.load_device_file(path)
    assert str(path) in str(info.value)
    assert message in str(info.value)


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(DeviceError, match="no such device file"):
        castcore.load_device_file(tmp_path / "nope.toml")


@pytest.mark.parametrize(
    "path",
    sorted(PACK_PROFILES.glob("*.toml")) + [Path(__file__).parents[1] / "data" / "h100-sxm.toml"],
    ids=lambda p: p.name,
)
def test_shipped_profiles_load_with_every_number_sourced(path):
    profile = castcore.load_device_file(path)
    assert profile.sources
    assert all(rate > 0 for rate in profile.mma_flops.values())


def test_device_file_works_with_no_pack_and_is_the_default(session):
    assert list(session.devices) == ["h100-sxm"]
    assert session.device().name == "h100-sxm"


def test_unknown_device_lists_installed(session):
    with pytest.raises(DeviceError, match="unknown device 'a100'; installed: h100-sxm"):
        session.device("a100")
    with pytest.raises(
        DeviceError, match=r"unknown device 'h100' \(did you mean 'h100-sxm'\?\); installed: h100-sxm"
    ):
        session.device("h100")


def test_no_devices_at_all_says_how_to_get_one():
    with pytest.raises(DeviceError, match="pip install castpack-ascend"):
        castcore.Session(load_packs=[]).device()


@pytest.mark.parametrize(
    "content, message",
    [
        (b"\x89PNG\r\n\x1a\n\x00\x00", "not valid TOML"),
        (None, "is a directory; name the device file itself"),
    ],
)
def test_a_device_file_that_is_not_toml_is_one_line(content, message, tmp_path, capsys):
    from castcore.cli.main import main

    path = tmp_path / "gpu.toml"
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    assert main(["devices", "--no-packs", "--device-file", str(path)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"castcore: error: {path}: ") and message in line
