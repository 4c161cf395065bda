"""castcore's point-to-point send (castcore::send) as this pack prices it, NCCL's send: the level spanning both
devices, LL up to 16 KiB and Simple above where the level gives NCCL's protocol latencies, against numbers worked by
hand; and the transfers castcore prices through it (a prompt's KV cache between disaggregated pools)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import castcore
from castcore import Interconnect, OpInvoke, TensorMeta
from castpack_collectives.alphabeta import phases_time
from castpack_collectives.p2p import send_cost, send_seconds
from castpack_collectives.protocols import P2P_LL_THRESHOLD

US = 1e-6
# An HGX H100 board and its InfiniBand as castpack-nvidia's h100-sxm5-80gb describes them: 450 GB/s x 0.82 = 369 GB/s
# and 50 GB/s x 0.9 = 45 GB/s a GPU, NCCL's step latencies LL, LL128, Simple (tuning.cc hwLat).
NVLINK = Interconnect(name="nvlink", devices=8, bandwidth=4.5e11, latency_s=2e-6, efficiency=0.82, topology="switch",
                      protocol_latency_s=(0.6e-6, 1.9e-6, 3.4e-6))
IB = Interconnect(name="infiniband", devices=1024, bandwidth=5e10, latency_s=5e-6, efficiency=0.9, topology="clos",
                  protocol_latency_s=(2.7e-6, 4.0e-6, 14.0e-6))
PCIE = Interconnect(name="pcie", devices=8, bandwidth=3.2e10, latency_s=5e-6, efficiency=0.8, topology="switch",
                    protocol_latency_s=(1.0e-6, 0.0, 5.7e-6))
HCCS = Interconnect(name="hccs", devices=8, bandwidth=1.96e11, latency_s=3e-6, efficiency=0.7, topology="full-mesh")
LEVELS = (NVLINK, IB)
B_NVLINK, B_IB = 4.5e11 * 0.82, 5e10 * 0.9
KV = 1024 * 2 * 32 * 8 * 128 * 2  # Llama-3-8B's keys and values of a 1024-token prompt in bf16: 128 MiB

ROOT = Path(__file__).resolve().parents[3]
H100 = ROOT / "packs" / "castpack-nvidia" / "castpack_nvidia" / "profiles" / "h100-sxm5-80gb.toml"
A100 = H100.with_name("a100-sxm4-80gb.toml")
LLAMA = ROOT / "tests" / "data" / "tiny-llama.json"


def test_a_large_send_runs_simple_over_nvlink_inside_a_board():
    # Simple: base 8.4 us + one 3.4 us step + 128 MiB / 369 GB/s (363.73 us) = 375.53 us.
    phase = send_cost(KV, LEVELS, 2)
    assert (phase.level.name, phase.protocol, phase.algorithm, phase.steps) == ("nvlink", "Simple", "direct", 1)
    assert send_seconds(KV, LEVELS, 2) == pytest.approx(8.4 * US + 3.4 * US + KV / B_NVLINK)
    assert send_seconds(KV, LEVELS, 2) / US == pytest.approx(375.534, abs=1e-3)
    assert send_seconds(KV, LEVELS, 8) == send_seconds(KV, LEVELS, 2)  # a board's 8 GPUs all reach each other


def test_across_nodes_or_to_another_device_type_the_network_carries_it():
    # 16 devices span two boards: InfiniBand, Simple, 8.4 + 14.0 us + 128 MiB / 45 GB/s (2982.62 us) = 3005.02 us.
    across = send_cost(KV, LEVELS, 16)
    assert (across.level.name, across.protocol) == ("infiniband", "Simple")
    assert phases_time([across]) == pytest.approx(8.4 * US + 14.0 * US + KV / B_IB)
    assert phases_time([across]) / US == pytest.approx(3005.016, abs=1e-3)
    assert send_seconds(KV, LEVELS, 2, outermost=True) == phases_time([across])


def test_nccl_sends_up_to_16_kib_in_ll_and_above_in_simple():
    assert P2P_LL_THRESHOLD == 16384
    # LL: base 6.6 us + one 0.6 us step + 16 KiB at a third of 369 GB/s, capped at NCCL's 87.7 GB/s = 7.387 us.
    small = send_cost(16384, LEVELS, 2)
    assert small.protocol == "LL" and small.base_s == pytest.approx(6.6 * US)
    assert phases_time([small]) == pytest.approx(6.6 * US + 0.6 * US + 16384 / 87.7e9)
    # One byte more: Simple, 8.4 + 3.4 us + 16385 / 369 GB/s = 11.844 us.
    larger = send_cost(16385, LEVELS, 2)
    assert larger.protocol == "Simple" and phases_time([larger]) == pytest.approx(11.8 * US + 16385 / B_NVLINK)
    # Over InfiniBand LL gets a third of 45 GB/s (under the cap): 6.6 + 2.7 us + 1 KiB / 15 GB/s = 9.368 us.
    assert send_seconds(1024, LEVELS, 16) == pytest.approx(6.6 * US + 2.7 * US + 1024 / (B_IB / 3))
    # PCIe without LL128: the same rule, 8.4 + 5.7 us + 1 MiB / 25.6 GB/s = 55.06 us.
    assert send_seconds(2**20, (PCIE,), 2) == pytest.approx(8.4 * US + 5.7 * US + 2**20 / 25.6e9)


def test_a_level_without_protocol_latencies_is_the_plain_alpha_beta_one_link_on_a_full_mesh():
    # Ascend HCCS, a full mesh of 8: one peer gets 196 GB/s x 0.7 / 7 = 19.6 GB/s: 3 us + 1 MiB / 19.6 GB/s.
    phase = send_cost(2**20, (HCCS,), 2)
    assert phase.protocol == "" and phase.base_s == 0.0
    assert phases_time([phase]) == pytest.approx(3 * US + 2**20 / (1.96e11 * 0.7 / 7))


def test_bad_sends_are_refused():
    with pytest.raises(ValueError, match="no interconnect levels"):
        send_cost(1, (), 2)
    with pytest.raises(ValueError, match=">= 0 bytes"):
        send_cost(-1, LEVELS, 2)
    with pytest.raises(ValueError, match="whole number >= 1"):
        send_cost(1, LEVELS, 0)


def _send(nbytes: int, devices: int, outermost: bool = False) -> OpInvoke:
    x = TensorMeta((nbytes,), torch.uint8, (1,))
    return OpInvoke(op=torch.ops.castcore.send.default, args=(x, devices, outermost), out=x)


def test_the_pack_answers_castcores_send_before_the_core():
    with_pack = castcore.Session(load_packs=["collectives"], device_files=[H100])
    core = castcore.Session(load_packs=[], device_files=[H100])
    h100 = with_pack.device("h100-sxm5-80gb")
    assert h100.comm_op_cost_s == 0.0  # castpack-nvidia: NCCL's own base latency is the call's cost
    inside = with_pack.resolver.estimate(_send(KV, 2), h100)
    assert str(inside.source).startswith("castpack-collectives") and inside.detail["protocol"] == "Simple"
    assert inside.detail["level"] == "nvlink" and inside.time_s / US == pytest.approx(375.534, abs=1e-3)
    across = with_pack.resolver.estimate(_send(KV, 2, outermost=True), h100)
    assert across.detail["level"] == "infiniband" and across.time_s / US == pytest.approx(3005.016, abs=1e-3)
    # The core's default, the level's latency and bandwidth alone: 2 us + 363.73 us; 5 us + 2982.62 us.
    assert str(core.resolver.estimate(_send(KV, 2), h100).source) == "core (estimator)"
    assert core.resolver.estimate(_send(KV, 2), h100).time_s / US == pytest.approx(365.734, abs=1e-3)
    assert core.resolver.estimate(_send(KV, 16), h100).time_s / US == pytest.approx(2987.616, abs=1e-3)


def test_an_a100_pays_nccls_base_latency_and_no_fixed_cost_of_its_own():
    # castpack-nvidia's A100: NVLink 300 GB/s x 0.77 = 231 GB/s; LL gets a third, 77 GB/s (under the 87.7 cap).
    session = castcore.Session(load_packs=["collectives"], device_files=[A100])
    a100 = session.device("a100-sxm4-80gb")
    assert a100.comm_op_cost_s == 0.0
    # A 2-GPU send of 1 KiB: LL, 6.6 us base + 0.6 us step + 1024 B / 77 GB/s = 7.213 us (it was 34.2 us).
    send = session.resolver.estimate(_send(1024, 2), a100)
    assert send.detail["protocol"] == "LL" and send.overhead_s == 0.0
    assert send.time_s == pytest.approx(6.6 * US + 0.6 * US + 1024 / (3e11 * 0.77 / 3))
    assert 7.0 * US < send.time_s < 7.5 * US
    # The fixed part is the protocol's base latency: LL 6.6 us, Simple 8.4 us (a 1 MiB send), none in the pack.
    big = session.resolver.estimate(_send(2**20, 2), a100)
    assert big.detail["protocol"] == "Simple" and big.detail["base_s"] == pytest.approx(8.4 * US)
    assert big.time_s == pytest.approx(8.4 * US + 3.4 * US + 2**20 / (3e11 * 0.77))


def test_castcore_audit_lists_the_send_with_the_pack_answering_and_the_core_shadowed():
    done = subprocess.run([sys.executable, "-m", "castcore", "audit", "--device-file", str(H100), "--device",
                           "h100-sxm5-80gb", "--op", "castcore::send", "--json"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    [row] = json.loads(done.stdout)
    assert row["status"] == "ok" and row["winner"]["plugin"].startswith("castpack-collectives")
    assert row["winner"]["function"] == "estimate_send"
    assert [(c["plugin"], c["kind"]) for c in row["shadowed"]] == [("core", "estimator")]


def test_a_disaggregated_simulate_moves_the_kv_as_the_pack_prices_it():
    session = castcore.Session(load_packs=["collectives"], device_files=[H100])
    result = session.simulate(str(LLAMA), device="h100-sxm5-80gb", input_lengths="200", output_lengths="4",
                              requests=4, rate=10, prefill_instances=1, decode_instances=1)
    # 200 tokens of tiny-llama's 256 bytes = 51200 B, above 16 KiB: Simple over NVLink, 8.4 + 3.4 us + 0.139 us.
    nbytes = 200 * result.kv_bytes_per_token
    assert nbytes == 51200
    expected = 8.4 * US + 3.4 * US + nbytes / B_NVLINK
    assert result.summary["mean_kv_transfer_ms"] == pytest.approx(round(expected * 1e3, 4))
    assert any("moves over nvlink (castcore::send, answered by castpack-collectives" in n for n in result.notes)
