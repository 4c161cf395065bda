"""Device profiles load from TOML, and every mistake is named with its file and field (a network level's fabric
included: its NICs give its bandwidth)."""

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
    # the profile's file name, which a user sees in the pack, names the profile in it
    with pytest.raises(
        DeviceError,
        match=r"unknown device 'H100-SXM' \(did you mean 'h100-sxm', the profile in h100-sxm.toml\?\)",
    ):
        session.device("H100-SXM")


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


# A network level described by its fabric: one NIC's line rate and the NICs each device has give its bandwidth.
CLUSTER = GOOD.replace(
    "[sources]",
    """[[interconnect]]
name = "infiniband"
devices = 16
FABRIC
latency_s = 5e-6
efficiency = 0.7
topology = "clos"
[sources]
"interconnect.infiniband" = "test value"
""",
)


@pytest.mark.parametrize(
    "fabric, bandwidth, nics",
    [
        # Two A100 nodes with one 200 Gb/s NIC per two GPUs: 25 GB/s x 0.5 = 12.5 GB/s a GPU.
        ("nic_bandwidth = 2.5e10\nnics_per_device = 0.5", 1.25e10, 0.5),
        # One 400 Gb/s NIC per 8-GPU node.
        ("nic_bandwidth = 5e10\nnics_per_device = 0.125", 6.25e9, 0.125),
        # A DGX: one NIC a GPU, the default count.
        ("nic_bandwidth = 5e10", 5e10, 1.0),
        # Both ways at once, agreeing.
        ("nic_bandwidth = 5e10\nnics_per_device = 2\nbandwidth = 1e11", 1e11, 2.0),
        # The plain per-device bandwidth, as before, with NCCL's ring and tree step latencies.
        (
            "bandwidth = 2.5e10\nprotocol_latency_s = [2.7e-6, 4e-6, 14e-6]\ntree_latency_s = [5e-6, 8.5e-6, 14e-6]",
            2.5e10,
            0.0,
        ),
    ],
)
def test_the_fabric_gives_the_levels_bandwidth(tmp_path, fabric, bandwidth, nics):
    level = castcore.load_device_file(_write(tmp_path, CLUSTER.replace("FABRIC", fabric))).interconnect[1]
    assert level.bandwidth == pytest.approx(bandwidth)
    assert level.nics_per_device == nics
    assert level.efficiency == 0.7  # the fraction of line rate the library reaches stays its own field
    assert level.tree_latency_s == ((5e-6, 8.5e-6, 14e-6) if "tree" in fabric else ())
    assert level.library == "nccl"  # unless the level names another


def test_a_level_names_the_collective_library_that_runs_on_it(tmp_path):
    fabric = 'bandwidth = 1e10\nlibrary = "rccl"\nprotocol_latency_s = [3e-6, 0, 3e-6]'
    level = castcore.load_device_file(_write(tmp_path, CLUSTER.replace("FABRIC", fabric))).interconnect[1]
    assert (level.library, level.protocol_latency_s) == ("rccl", (3e-6, 0.0, 3e-6))


@pytest.mark.parametrize(
    "fabric, message",
    [
        (
            "nic_bandwidth = 2.5e10\nnics_per_device = 0",
            "'interconnect[1].nics_per_device' must be greater than 0",
        ),
        (
            "nic_bandwidth = 2.5e10\nnics_per_device = -1",
            "'interconnect[1].nics_per_device' = -1 must be a finite",
        ),
        ('nic_bandwidth = "200G"', "'interconnect[1].nic_bandwidth' = '200G' must be a finite number"),
        ("nic_bandwidth = 0", "'interconnect[1].nic_bandwidth' must be greater than 0"),
        (
            "nics_per_device = 0.5\nbandwidth = 2.5e10",
            "'interconnect[1].nics_per_device' needs 'nic_bandwidth'",
        ),
        (
            "nic_bandwidth = 2.5e10\nnics_per_device = 0.5\nbandwidth = 2.5e10",
            "'interconnect[1].bandwidth' = 2.5e+10 disagrees with nic_bandwidth x nics_per_device = 1.25e+10",
        ),
        ("", "'interconnect[1]' is missing 'bandwidth' (or 'nic_bandwidth' with 'nics_per_device')"),
        (
            "bandwidth = 1e10\ntree_latency_s = [5e-6, 8.5e-6, 14e-6]",
            "'interconnect[1].tree_latency_s' needs 'protocol_latency_s', the ring's step latencies",
        ),
        (
            "bandwidth = 1e10\nprotocol_latency_s = [2.7e-6, 4e-6, 14e-6]\ntree_latency_s = [5e-6]",
            "'interconnect[1].tree_latency_s' must be [LL, LL128, Simple]",
        ),
        ('bandwidth = 1e10\nlibrary = "mpi"', "'interconnect[1].library' = 'mpi'; use one of nccl, rccl"),
    ],
)
def test_bad_fabric_values_name_the_file_and_field(tmp_path, fabric, message):
    path = _write(tmp_path, CLUSTER.replace("FABRIC", fabric))
    with pytest.raises(DeviceError) as info:
        castcore.load_device_file(path)
    assert str(path) in str(info.value) and message in str(info.value)


def test_on_the_command_line_a_bad_fabric_is_one_line_and_exit_2(tmp_path, capsys):
    from castcore.cli.main import main

    path = _write(tmp_path, CLUSTER.replace("FABRIC", "nic_bandwidth = 2.5e10\nnics_per_device = 0"))
    assert main(["devices", "--no-packs", "--device-file", str(path)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"castcore: error: {path}: ") and "nics_per_device' must be greater than 0" in line
