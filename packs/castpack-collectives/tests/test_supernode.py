"""A Huawei CloudMatrix384 super node is one Unified Bus (UB) domain of 768 Ascend 910C dies: castpack-ascend's
ascend-910c-die-cm384 gives its UB levels (ub-l1 inside a node, ub-l2 across the 48 nodes) up to 768 devices, so
wide expert parallelism over 256 or 384 dies is priced on UB alone, where the same group on a standalone Atlas A3
server's die (ascend-910c-die, 16 dies on UB) goes out over RoCE."""

from __future__ import annotations

from pathlib import Path

import pytest

import castcore
from castpack_collectives.alphabeta import collective_cost

# castpack-ascend's profiles read as files: this pack's session installs no other pack
PROFILES = Path(__file__).resolve().parents[2] / "castpack-ascend" / "castpack_ascend" / "profiles"
UB = {
    "sio",
    "ub-l1",
    "ub-l2",
}  # the on-package link and the two UB switch tiers: everything inside the super node
S = 2**28  # 256 MiB


def profile(file: str) -> castcore.DeviceProfile:
    return castcore.load_device_file(PROFILES / f"{file}.toml")


SUPERNODE = "atlas-900-a3-superpod-910c-die"
SERVER = "atlas-a3-910c-die"


@pytest.mark.parametrize("collective", ["all_to_all", "all_reduce"])
@pytest.mark.parametrize("ranks", [256, 384])
@pytest.mark.parametrize("nbytes", [2**20, S])
def test_a_collective_over_the_super_node_costs_ub_time_not_network_time(collective, ranks, nbytes):
    device = profile(SUPERNODE)
    assert device.name == "ascend-910c-die-cm384"
    assert {level.name: level.devices for level in device.interconnect}["ub-l2"] == 768
    cost = collective_cost(collective, nbytes, ranks, device.interconnect, device.comm_op_cost_s)
    assert cost.fits and set(cost.levels) <= UB and "ub-l2" in cost.levels
    assert all(phase.level.name != "roce" for phase in cost.phases)


@pytest.mark.parametrize("collective", ["all_to_all", "all_reduce"])
@pytest.mark.parametrize("ranks", [256, 384])
def test_the_same_group_on_standalone_a3_servers_goes_through_roce(collective, ranks):
    server, pod = profile(SERVER), profile(SUPERNODE)
    assert server.name == "ascend-910c-die"
    apart = collective_cost(collective, S, ranks, server.interconnect, server.comm_op_cost_s)
    assert "roce" in apart.levels
    inside = collective_cost(collective, S, ranks, pod.interconnect, pod.comm_op_cost_s)
    # 196 GB/s of UB a die against one 200 Gb/s (25 GB/s) RDMA port a die
    assert inside.time_s < apart.time_s / 1.4
    if (
        collective == "all_to_all"
    ):  # every byte but a node's share crosses the network: the gap is widest here
        assert inside.time_s < apart.time_s / 4


def test_a_group_inside_one_node_is_priced_the_same_on_both():
    server, pod = profile(SERVER), profile(SUPERNODE)
    a = collective_cost("all_to_all", S, 16, server.interconnect, server.comm_op_cost_s)
    b = collective_cost("all_to_all", S, 16, pod.interconnect, pod.comm_op_cost_s)
    assert a.levels == b.levels == ("ub-l1",) and a.time_s == pytest.approx(b.time_s)


def test_a_group_larger_than_the_super_node_crosses_the_network():
    pod = profile(SUPERNODE)
    cost = collective_cost("all_to_all", S, 1536, pod.interconnect, pod.comm_op_cost_s)
    assert "roce" in cost.levels
