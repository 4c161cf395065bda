"""A GB200/GB300 NVL72 rack is one NVLink domain of 72 GPUs: castpack-nvidia's rack profiles give their NVLink level
devices = 72, so a collective over up to 72 ranks is priced on NVLink alone, where an 8-GPU HGX board sends the
same group across the network."""

from __future__ import annotations

from pathlib import Path

import pytest

import castcore
from castpack_collectives.alphabeta import collective_cost

# castpack-nvidia's profiles read as files: this pack's session installs no other pack
PROFILES = Path(__file__).resolve().parents[2] / "castpack-nvidia" / "castpack_nvidia" / "profiles"
S = 2**28  # 256 MiB


def profile(name: str) -> castcore.DeviceProfile:
    return castcore.load_device_file(PROFILES / f"{name}.toml")


@pytest.mark.parametrize("rack", ["gb200-nvl72", "gb300-nvl72"])
@pytest.mark.parametrize("ranks", [64, 72])
def test_an_all_reduce_over_the_rack_costs_nvlink_time_not_network_time(rack, ranks):
    device = profile(rack)
    nvlink = device.interconnect[0]
    assert (nvlink.name, nvlink.devices) == ("nvlink", 72)
    cost = collective_cost("all_reduce", S, ranks, device.interconnect, device.comm_op_cost_s)
    assert cost.levels == ("nvlink",)
    assert all(phase.level.name == "nvlink" for phase in cost.phases)
    # At least the NVLink bandwidth term: a ring moves 2(n-1)/n S a rank at 900 GB/s x 0.8; NVLS moves S each way
    # at 900 GB/s x 0.53. Either way far under what the same bytes take through one 400-800 Gb/s NIC a GPU.
    nic = device.interconnect[-1].bandwidth * device.interconnect[-1].efficiency
    assert cost.comm_s < 2 * (ranks - 1) / ranks * S / nic / 2
    # a small one too: NCCL's NVLink step latencies, no network step
    small = collective_cost("all_reduce", 2**20, ranks, device.interconnect, device.comm_op_cost_s)
    assert small.levels == ("nvlink",)


def test_the_same_group_on_an_hgx_b200_board_goes_through_the_network():
    b200 = profile("b200")
    rack = profile("gb200-nvl72")
    board = collective_cost("all_reduce", S, 72, b200.interconnect, b200.comm_op_cost_s)
    assert "infiniband" in board.levels
    inside = collective_cost("all_reduce", S, 72, rack.interconnect, rack.comm_op_cost_s)
    assert inside.time_s < board.time_s / 3  # NVLink 900 GB/s a GPU against one 400 Gb/s NIC a GPU


def test_a_group_larger_than_the_rack_crosses_the_network():
    rack = profile("gb300-nvl72")
    cost = collective_cost("all_reduce", S, 144, rack.interconnect, rack.comm_op_cost_s)
    assert "infiniband" in cost.levels
