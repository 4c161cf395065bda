"""NCCL's protocols (LL, LL128, Simple) on a level that gives their step latencies, against numbers worked by hand."""

from __future__ import annotations

import pytest

import castcore
from castcore import Interconnect
from castpack_collectives import describe
from castpack_collectives.alphabeta import ENGINE, NCCL, collective_cost, flat, phases_time
from castpack_collectives.protocols import BASE_LATENCY_S, LL_MAX_BUS_BANDWIDTH

US = 1e-6
# An HGX H100 board as castpack-nvidia describes it: 450 GB/s x 0.82 = 369 GB/s a GPU, NVLS at 0.58 after 40 us, and
# NCCL's NVLink step latencies LL 0.6, LL128 1.9, Simple 3.4 us.
NVLINK = Interconnect(name="nvlink", devices=8, bandwidth=4.5e11, latency_s=2e-6, efficiency=0.82, topology="switch",
                      reduction_efficiency=0.58, reduction_latency_s=40e-6, protocol_latency_s=(0.6e-6, 1.9e-6, 3.4e-6))
RING_ONLY = Interconnect(name="nvlink", devices=8, bandwidth=4.5e11, latency_s=2e-6, efficiency=0.82,
                         topology="switch", protocol_latency_s=(0.6e-6, 1.9e-6, 3.4e-6))
IB = Interconnect(name="ib", devices=1024, bandwidth=5e10, latency_s=5e-6, efficiency=0.9, topology="clos",
                  protocol_latency_s=(2.7e-6, 4.0e-6, 14.0e-6))
# Eight L40S on one PCIe host: 32 GB/s x 0.8 = 25.6 GB/s, no LL128 off NVLink.
PCIE = Interconnect(name="pcie", devices=8, bandwidth=3.2e10, latency_s=5e-6, efficiency=0.8, topology="switch",
                    protocol_latency_s=(1.0e-6, 0.0, 5.7e-6))
B = 4.5e11 * 0.82  # 369 GB/s


def test_a_1_kib_all_reduce_on_8_h100_runs_the_ring_in_ll_for_15_us():
    # 14 steps of 0.6 us, 2 x 7/8 x 1024 = 1792 B at min(369/4, 87.7) = 87.7 GB/s, and LL's base 6.6 us once.
    cost = collective_cost("all_reduce", 1024, 8, (NVLINK,))
    assert (cost.algorithm, cost.protocols) == ("ring", ("LL",))
    assert cost.time_s == pytest.approx(6.6 * US + 14 * 0.6 * US + 1792 / 87.7e9)  # 15.02 us
    assert cost.overhead_s == 0.0 and cost.time_s < 16 * US  # not the 20 us a call it paid before
    # NVLS pays its 40 us; the ring in LL128 14 + 14 x 1.9 us, in Simple 8.4 + 14 x 3.4 us
    assert cost.candidates["in_switch"] == pytest.approx(40 * US + 1024 / (4.5e11 * 0.58))
    assert flat("all_reduce", "ring", 1024, 8, RING_ONLY).protocol == "LL"
    assert describe(cost)["protocol"] == "LL"


def test_ll_gets_a_quarter_of_the_bus_for_all_reduce_capped_at_nccls_87_7_gb_s():
    big = flat("all_reduce", "ring", 1024, 8, RING_ONLY)
    assert big.time_s == pytest.approx(14 * 0.6 * US + 1792 / LL_MAX_BUS_BANDWIDTH)  # 369 / 4 = 92 > 87.7: the cap
    # on PCIe the quarter is below the cap: 25.6 / 4 = 6.4 GB/s; 8.4 + 14 x 1.0 us + 1792 / 6.4e9
    pcie = collective_cost("all_reduce", 1024, 8, (PCIE,))
    assert pcie.protocols == ("LL",)
    assert pcie.time_s == pytest.approx(6.6 * US + 14 * 1.0 * US + 1792 / 6.4e9)  # 20.88 us
    # all-gather takes a third: 7 steps, 7/8 x 8 KiB = 7168 B at 25.6 / 3 GB/s
    gather = collective_cost("all_gather", 8192, 8, (PCIE,))
    assert gather.time_s == pytest.approx(6.6 * US + 7 * 1.0 * US + 7168 / (25.6e9 / 3))


def test_a_1_gib_all_reduce_on_8_h100_reduces_in_the_switch_at_bus_bandwidth():
    s = 2**30
    cost = collective_cost("all_reduce", s, 8, (NVLINK,))
    assert (cost.algorithm, cost.protocols) == ("in_switch", ("Simple",))
    assert cost.time_s == pytest.approx(40 * US + s / (4.5e11 * 0.58))  # 4154 us, no base latency for NVLS
    assert s / cost.time_s * 1.75 / 1e9 == pytest.approx(452, abs=1)  # nccl-tests busbw, above the 450 GB/s wire
    # NVLS off: the ring in Simple, 14 x 3.4 + 8.4 us and 2 x 7/8 S at the whole 369 GB/s
    ring = collective_cost("all_reduce", s, 8, (RING_ONLY,))
    assert (ring.algorithm, ring.protocols) == ("ring", ("Simple",))
    assert ring.time_s == pytest.approx(8.4 * US + 14 * 3.4 * US + 1.75 * s / B)
    assert s / ring.time_s * 1.75 == pytest.approx(B, rel=0.02)  # busbw = bandwidth x efficiency


def test_the_protocol_crossovers_fall_where_the_formulas_put_them():
    # LL against LL128 (NVLS off): 15.0 + 1.75 S / 87.7 GB/s = 40.6 + 1.75 S / (0.92 x 369 GB/s) at S = 1.73 MB
    ll = 1.75 / LL_MAX_BUS_BANDWIDTH
    ll128 = 1.75 / (0.92 * B)
    crossing = (BASE_LATENCY_S["LL128"] - BASE_LATENCY_S["LL"] + 14 * (1.9 - 0.6) * US) / (ll - ll128)
    assert crossing == pytest.approx(1.73e6, rel=0.01)
    assert collective_cost("all_reduce", 0.98 * crossing, 8, (RING_ONLY,)).protocols == ("LL",)
    assert collective_cost("all_reduce", 1.02 * crossing, 8, (RING_ONLY,)).protocols == ("LL128",)
    # LL128 against Simple: 40.6 + 1.75 S / 339.5 GB/s = 56.0 + 1.75 S / 369 GB/s at S = 37.3 MB
    simple = (8.4 * US + 14 * 3.4 * US - 14.0 * US - 14 * 1.9 * US) / (ll128 - 1.75 / B)
    assert simple == pytest.approx(37.3e6, rel=0.01)
    assert collective_cost("all_reduce", 0.98 * simple, 8, (RING_ONLY,)).protocols == ("LL128",)
    assert collective_cost("all_reduce", 1.02 * simple, 8, (RING_ONLY,)).protocols == ("Simple",)
    # With NVLS: the ring in LL up to 40 + S / 261 GB/s = 15.0 + 1.75 S / 87.7 GB/s, S = 1.55 MB, then the switch
    nvls = (40 * US - 15.0 * US) / (ll - 1 / (4.5e11 * 0.58))
    assert nvls == pytest.approx(1.55e6, rel=0.01)
    assert collective_cost("all_reduce", 0.98 * nvls, 8, (NVLINK,)).algorithm == "ring"
    assert collective_cost("all_reduce", 1.02 * nvls, 8, (NVLINK,)).algorithm == "in_switch"


def test_nvls_runs_only_above_four_gpus_and_recursive_doubling_not_at_all():
    four = collective_cost("all_reduce", 2**30, 4, (NVLINK,))
    assert four.algorithm == "ring" and "in_switch" not in four.candidates
    assert "in_switch" in collective_cost("all_reduce", 2**30, 5, (NVLINK,)).candidates
    assert "recursive_doubling" not in collective_cost("all_reduce", 8, 8, (NVLINK,)).candidates
    assert flat("all_reduce", "recursive_doubling", 8, 8, NVLINK) is None


def test_all_to_all_goes_point_to_point_in_ll_or_simple_never_ll128():
    # 7 sends one after another: 6.6 + 7 x 0.6 us, 7/8 x 1 KiB = 896 B at 87.7 GB/s (a third of 369 is above the cap)
    small = collective_cost("all_to_all", 1024, 8, (NVLINK,))
    assert (small.algorithm, small.protocols) == ("direct", ("LL",))
    assert small.time_s == pytest.approx(6.6 * US + 7 * 0.6 * US + 896 / LL_MAX_BUS_BANDWIDTH)  # 10.8 us
    large = collective_cost("all_to_all", 2**28, 8, (NVLINK,))
    assert large.protocols == ("Simple",)
    assert large.time_s == pytest.approx(8.4 * US + 7 * 3.4 * US + 7 / 8 * 2**28 / B)


def test_a_hierarchical_collective_pays_the_base_latency_once():
    cost = collective_cost("all_reduce", 2**20, 16, (NVLINK, IB))
    assert cost.algorithm == "hierarchical" and len(cost.phases) == 3
    base = max(p.base_s for p in cost.phases)
    assert base in BASE_LATENCY_S.values()
    assert cost.time_s == pytest.approx(sum(p.time_s for p in cost.phases) + base) == phases_time(cost.phases)
    assert cost.time_s < sum(p.time_s + p.base_s for p in cost.phases)


def test_a_library_cost_a_call_is_still_added_on_top():
    plain = collective_cost("all_reduce", 1024, 8, (NVLINK,))
    padded = collective_cost("all_reduce", 1024, 8, (NVLINK,), 27e-6)
    assert padded.time_s == pytest.approx(plain.time_s + 27e-6) and padded.overhead_s == 27e-6


def test_the_engine_all_reduce_stops_at_its_rank_limit():
    level = Interconnect(name="pcie", devices=8, bandwidth=3.2e10, latency_s=5e-6, efficiency=0.8,
                         protocol_latency_s=(1.0e-6, 0.0, 5.7e-6), engine_allreduce_max_bytes=8 * 2**20,
                         engine_allreduce_max_ranks=2, one_shot_latency_s=5.3e-6, one_shot_bandwidth=9.4e9,
                         two_shot_latency_s=5.3e-6, two_shot_bandwidth=9.4e9)
    two = collective_cost("all_reduce", 4096, 2, (level,), 0.0, ENGINE)
    assert two.algorithm == "one_shot" and two.time_s == pytest.approx(5.3e-6 + 4096 / 9.4e9)
    four = collective_cost("all_reduce", 4096, 4, (level,), 0.0, ENGINE)
    assert four.algorithm == "ring" and "one_shot" not in four.candidates  # vLLM hands it to NCCL
    assert four.time_s == collective_cost("all_reduce", 4096, 4, (level,), 0.0, NCCL).time_s


def test_profiles_load_the_step_latencies_and_the_rank_limit():
    base = {"name": "x", "vendor": "y", "memory_bytes": 1.0, "memory_bandwidth": 1.0, "mma_flops": {"float32": 1.0},
            "gp_flops": {"float32": 1.0}, "sources": {"memory_bytes": "m", "memory_bandwidth": "m", "mma_flops": "m",
                                                      "gp_flops": "m", "interconnect": "m"}}
    level = {"name": "pcie", "devices": 8, "bandwidth": 3.2e10, "latency_s": 5e-6,
             "protocol_latency_s": [1.0e-6, 0.0, 5.7e-6], "engine_allreduce_max_ranks": 2}
    device = castcore.device_from_dict({**base, "interconnect": [level]})
    assert device.interconnect[0].protocol_latency_s == (1.0e-6, 0.0, 5.7e-6)
    assert device.interconnect[0].engine_allreduce_max_ranks == 2
    bare = castcore.device_from_dict({**base, "interconnect": [{k: v for k, v in level.items()
                                                                 if k not in ("protocol_latency_s",
                                                                              "engine_allreduce_max_ranks")}]})
    assert bare.interconnect[0].protocol_latency_s == () and bare.interconnect[0].engine_allreduce_max_ranks == 0
    for bad in ([1e-6, 2e-6], [0.0, 0.0, 0.0], [1e-6, -1.0, 1e-6]):
        with pytest.raises(castcore.DeviceError, match="protocol_latency_s"):
            castcore.device_from_dict({**base, "interconnect": [{**level, "protocol_latency_s": bad}]})
    with pytest.raises(castcore.DeviceError, match="engine_allreduce_max_ranks"):
        castcore.device_from_dict({**base, "interconnect": [{**level, "engine_allreduce_max_ranks": -1}]})
