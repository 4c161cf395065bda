"""castcore::send, the core's point-to-point send: the op, the core's default time on numbers worked by hand, and
the transfers castcore prices through it (a pipeline stage's activations, a prompt's KV cache between disaggregated
pools), answered by whichever plugin claims the op."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import castcore
from castcore.builtin.comm_ops import SEND, send_call
from castcore.plugins.audit import static_audit
from castcore.serving.disaggregated import transfer_seconds
from castcore.deploy.parallel.pipeline_stages import transfer_time

NVLINK, NVLINK_LATENCY = 4.5e11 * 0.82, 2e-6  # tests/data/h100-sxm.toml's levels: 369 GB/s, 2 us
IB, IB_LATENCY = 5e10 * 0.9, 5e-6  # 45 GB/s, 5 us
CALL_COST = 1e-5  # its comm_op_cost_s
KV = 1024 * 2 * 32 * 8 * 128 * 2  # Llama-3-8B's keys and values of a 1024-token prompt in bf16: 128 MiB


def test_the_op_returns_what_the_peer_receives_and_captures_as_one_call(session):
    x = torch.arange(6.0).reshape(2, 3)
    sent = torch.ops.castcore.send(x, 2)
    assert torch.equal(sent, x) and sent.data_ptr() != x.data_ptr()
    with pytest.raises(RuntimeError, match="devices must be >= 1"):
        torch.ops.castcore.send(x, 0)
    report = session.estimate(
        lambda t: torch.ops.castcore.send(t, 2, True),
        torch.empty(1000, dtype=torch.bfloat16),
        device="h100-sxm",
    )
    [record] = report.records
    assert record.invoke.name == "castcore::send" and str(record.estimate.source) == "core (estimator)"
    # outermost: the network
    assert record.estimate.time_s == pytest.approx(IB_LATENCY + 2000 / IB + CALL_COST)


def test_the_core_times_a_send_over_the_level_spanning_both_devices(session):
    h100 = session.device("h100-sxm")
    # 128 MiB between two GPUs of one board: 134217728 / 369e9 = 363.73 us, + 2 us + 10 us = 375.73 us.
    inside = session.resolver.estimate(send_call(KV, 2), h100)
    assert inside.time_s == pytest.approx(
        KV / NVLINK + NVLINK_LATENCY + CALL_COST
    ) and inside.time_s * 1e6 == pytest.approx(375.734, abs=1e-3)
    assert (inside.detail["level"], str(inside.source), inside.bound) == (
        "nvlink",
        "core (estimator)",
        "comm",
    )
    assert inside.overhead_s == CALL_COST and inside.comm_s == pytest.approx(inside.time_s - CALL_COST)
    # 16 devices span two boards: InfiniBand, 134217728 / 45e9 = 2982.62 us, + 5 us + 10 us = 2997.62 us.
    across = session.resolver.estimate(send_call(KV, 16), h100)
    assert (
        across.time_s == pytest.approx(KV / IB + IB_LATENCY + CALL_COST)
        and across.detail["level"] == "infiniband"
    )
    assert across.time_s * 1e6 == pytest.approx(2997.616, abs=1e-3)
    # outermost: the network whatever the count (another node, another device type)
    assert session.resolver.estimate(send_call(KV, 2, outermost=True), h100).time_s == across.time_s


def test_a_full_mesh_gives_one_peer_one_link(session):
    h100 = session.device("h100-sxm")
    mesh = dataclasses.replace(h100.interconnect[0], topology="full-mesh")
    meshed = dataclasses.replace(h100, interconnect=[mesh, *h100.interconnect[1:]])
    # 8 devices, one link per peer: 369 GB/s / 7 for one transfer.
    assert session.resolver.estimate(send_call(1e6, 2), meshed).time_s == pytest.approx(
        1e6 / (NVLINK / 7) + NVLINK_LATENCY + CALL_COST
    )


def test_transfers_keep_todays_formula_without_a_plugin_and_name_who_answered(session):
    h100 = session.device("h100-sxm")
    assert (
        transfer_time(KV, h100, 2)
        == transfer_time(KV, h100, 2, resolver=session.resolver)
        == (pytest.approx(KV / NVLINK + NVLINK_LATENCY + CALL_COST), "nvlink")
    )
    assert transfer_seconds(h100, 16, True, KV, session.resolver) == (
        pytest.approx(KV / IB + IB_LATENCY + CALL_COST),
        "infiniband",
    )
    bare = dataclasses.replace(h100, interconnect=[])
    with pytest.raises(castcore.ModelError, match="no interconnect to move a prompt's KV cache over"):
        transfer_seconds(bare, 2, True, KV, session.resolver)


def test_the_audit_lists_the_send_and_the_core_answers_it(session):
    [row] = static_audit(session, ["h100-sxm"], op="castcore::send")
    assert (row.status, str(row.winner)) == ("ok", "core (estimator)")
    assert row.winner.function == "send_estimate"


SEND_FILE = """
import torch
import castcore

@castcore.register_op_estimator(torch.ops.castcore.send.default)
def flat_send(invoke, device):
    return 1e-3 + invoke.args[0].nbytes * 1e-9  # 1 ms + 1 ns a byte
"""


def test_a_plugin_claiming_the_send_prices_every_transfer(tmp_path, h100_file, tiny_llama):
    (tmp_path / "flat_send.py").write_text(SEND_FILE)
    session = castcore.Session(load_packs=[], device_files=[h100_file], custom_op_dirs=[tmp_path])
    h100 = session.device("h100-sxm")
    assert transfer_seconds(h100, 2, True, 1000, session.resolver)[0] == pytest.approx(1e-3 + 1e-6)
    [row] = static_audit(session, ["h100-sxm"], op="castcore::send")
    assert row.winner.plugin.startswith("file:") and [c.plugin for c in row.candidates][-1] == "core"
    # A pipeline stage's activations: [batch 4, seq 16, hidden 64] in bf16 = 8192 bytes.
    staged = session.estimate(castcore.build_workload(str(tiny_llama), batch=4, seq=16, pp=2))
    assert staged.pipeline.transfer_s == pytest.approx(1e-3 + 8192e-9)
    assert staged.pipeline.transfer_by.startswith("file:") and "answered by file:" in staged.notes[-1]
    # A prompt's KV: 200 tokens of tiny-llama's 256 bytes a token.
    result = session.simulate(
        str(tiny_llama),
        device="h100-sxm",
        input_lengths="200",
        output_lengths="4",
        requests=4,
        rate=10,
        prefill_instances=1,
        decode_instances=1,
    )
    assert result.summary["mean_kv_transfer_ms"] == pytest.approx(round((1e-3 + 200 * 256e-9) * 1e3, 4))
    assert any("castcore::send, answered by file:" in n for n in result.notes)


def test_a_disaggregated_simulate_without_packs_says_the_core_answered(session, tiny_llama):
    result = session.simulate(
        str(tiny_llama),
        device="h100-sxm",
        input_lengths="200",
        output_lengths="4",
        requests=4,
        rate=10,
        prefill_instances=1,
        decode_instances=1,
    )
    # Two one-device instances share a board: NVLink, 51200 bytes / 369 GB/s + 2 us + 10 us = 12.139 us.
    assert result.kv_bytes_per_token == 256
    assert result.summary["mean_kv_transfer_ms"] == pytest.approx(round((51200 / NVLINK + 12e-6) * 1e3, 4))
    assert any("moves over nvlink (castcore::send, answered by core (estimator)" in n for n in result.notes)


def test_the_op_is_the_cores_own():
    assert SEND is torch.ops.castcore.send.default and SEND.namespace == "castcore"
