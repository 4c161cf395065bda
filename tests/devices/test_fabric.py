"""A network level described by its fabric: one NIC's line rate and the NICs each device has give the level's
bandwidth; every wrong value is one error naming the file and the field, and one line with exit 2 on the command
line."""

from __future__ import annotations

import pytest

import castcore
from castcore.devices.profile import DeviceError

PROFILE = """
name = "cluster"
vendor = "test"
memory_bytes = 1e9
memory_bandwidth = 1e11
[mma_flops]
bfloat16 = 1e13
[gp_flops]
float32 = 1e12
[[interconnect]]
name = "nvlink"
devices = 8
bandwidth = 3e11
latency_s = 2e-6
[[interconnect]]
name = "infiniband"
devices = 16
FABRIC
latency_s = 5e-6
efficiency = 0.7
topology = "clos"
[sources]
memory_bytes = "test value"
memory_bandwidth = "test value"
mma_flops = "test value"
gp_flops = "test value"
"interconnect.nvlink" = "test value"
"interconnect.infiniband" = "test value"
"""


def _write(tmp_path, fabric: str):
    path = tmp_path / "cluster.toml"
    path.write_text(PROFILE.replace("FABRIC", fabric))
    return path


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
    level = castcore.load_device_file(_write(tmp_path, fabric)).interconnect[1]
    assert level.bandwidth == pytest.approx(bandwidth)
    assert level.nics_per_device == nics
    assert level.efficiency == 0.7  # the fraction of line rate the library reaches stays its own field
    assert level.tree_latency_s == ((5e-6, 8.5e-6, 14e-6) if "tree" in fabric else ())


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
    ],
)
def test_bad_fabric_values_name_the_file_and_field(tmp_path, fabric, message):
    path = _write(tmp_path, fabric)
    with pytest.raises(DeviceError) as info:
        castcore.load_device_file(path)
    assert str(path) in str(info.value) and message in str(info.value)


def test_on_the_command_line_a_bad_fabric_is_one_line_and_exit_2(tmp_path, capsys):
    from castcore.cli.main import main

    path = _write(tmp_path, "nic_bandwidth = 2.5e10\nnics_per_device = 0")
    assert main(["devices", "--no-packs", "--device-file", str(path)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"castcore: error: {path}: ") and "nics_per_device' must be greater than 0" in line
