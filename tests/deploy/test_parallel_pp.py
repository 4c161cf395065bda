"""Pipeline parallelism (--pp): stages split from one capture, GPipe's prefill bubble, overlapped decode."""

from __future__ import annotations

import json

import pytest

import castcore
from castcore.cli.main import main
from castcore.deploy.parallel.pipeline_stages import stage_layers

BATCH, SEQ, HIDDEN = 4, 16, 64  # tiny-llama: 2 layers, hidden 64, 2 KV heads of 16
NVLINK = 4.5e11 * 0.82  # tests/data/h100-sxm.toml's first interconnect level, B/s
HOP = 2e-6 + 1e-5  # its latency and comm_op_cost_s


def test_layers_split_as_vllm_splits_them():
    assert stage_layers(2, 2) == [1, 1]
    assert stage_layers(5, 2) == [3, 2]  # the remainder before the last stage, which holds the LM head
    assert stage_layers(7, 4) == [2, 2, 2, 1]
    assert stage_layers(80, 3) == [27, 27, 26]


@pytest.mark.parametrize("micro_batches", [1, 2, 4])
def test_stages_add_up_to_the_model_and_ttft_has_the_bubble(session, tiny_llama, micro_batches):
    staged = session.estimate(
        castcore.build_workload(str(tiny_llama), batch=BATCH, seq=SEQ, pp=2, micro_batches=micro_batches)
    )
    # The same model unsplit, at the micro-batch one stage runs at a time.
    whole = session.estimate(castcore.build_workload(str(tiny_llama), batch=BATCH // micro_batches, seq=SEQ))
    pipe = staged.pipeline
    assert pipe.layers == [1, 1] and len(pipe.stage_times_s) == 2
    assert sum(pipe.stage_flops) == pytest.approx(whole.flops, rel=1e-12)
    assert sum(pipe.stage_times_s) == pytest.approx(whole.time_s, rel=1e-12)
    assert staged.time_s == max(pipe.stage_times_s) == pipe.stage_times_s[pipe.slowest]
    # One micro-batch's activation [batch / M, seq, hidden] in bf16 crosses the stage boundary.
    assert pipe.transfer_bytes == BATCH // micro_batches * SEQ * HIDDEN * 2
    assert pipe.transfer_s == pytest.approx(pipe.transfer_bytes / NVLINK + HOP, rel=1e-12)
    assert pipe.step_s == pytest.approx(
        (micro_batches + 2 - 1) * max(pipe.stage_times_s) + pipe.transfer_s, rel=1e-12
    )
    assert pipe.bubble_s == max(pipe.stage_times_s)
    assert "pipeline stage" in staged.description and any("TTFT = " in n for n in staged.notes)
    data = json.loads(staged.to_json())
    assert (
        data["pipeline"]["stage_times_s"] == pipe.stage_times_s and data["totals"]["time_s"] == staged.time_s
    )


def test_memory_is_the_heaviest_stages(session, tiny_llama):
    staged = session.estimate(castcore.build_workload(str(tiny_llama), batch=BATCH, seq=SEQ, pp=2))
    whole = session.estimate(castcore.build_workload(str(tiny_llama), batch=BATCH, seq=SEQ))
    # Each stage holds one of the two layers' KV cache; the weights split between the stages (the embedding with
    # the first, the final norm and LM head with the last).
    assert staged.memory.kv_cache_bytes * 2 == whole.memory.kv_cache_bytes
    pipe = staged.pipeline
    assert sum(pipe.stage_weight_bytes) == whole.memory.weight_bytes
    layer = (2 * 64 * 64 + 2 * 64 * 32 + 2 * 160 * 64 + 64 * 160 + 2 * 64) * 2
    # + rotary buffers
    assert pipe.stage_weight_bytes == [
        500 * 64 * 2 + layer + 2 * 8 * 4,
        layer + 64 * 2 + 500 * 64 * 2,
    ]
    assert (
        staged.memory.peak_bytes == max(pipe.stage_peak_bytes)
        and staged.memory.weight_bytes == pipe.stage_weight_bytes[pipe.heaviest]
    )


def test_decode_overlaps_the_stages_on_micro_batches(session, tiny_llama):
    staged = session.estimate(
        castcore.build_workload(str(tiny_llama), phase="decode", kv_len=SEQ, batch=BATCH, pp=2)
    )
    whole = session.estimate(
        castcore.build_workload(str(tiny_llama), phase="decode", kv_len=SEQ, batch=BATCH // 2)
    )
    pipe = staged.pipeline
    assert pipe.micro_batches == 2  # batch / pp sequences each, pp of them in flight
    assert sum(pipe.stage_times_s) == pytest.approx(whole.time_s, rel=1e-12)
    assert pipe.step_s == pytest.approx(2 * max(pipe.stage_times_s) + pipe.transfer_s, rel=1e-12)
    assert pipe.transfer_bytes == BATCH // 2 * 1 * HIDDEN * 2
    # The stage holds the KV cache of every sequence in flight: one layer of 4 x 17 slots x 2 heads x 16 x bf16.
    assert staged.memory.kv_cache_bytes == 2 * BATCH * (SEQ + 1) * 2 * 16 * 2 + 8
    one = session.estimate(
        castcore.build_workload(str(tiny_llama), phase="decode", kv_len=SEQ, batch=1, pp=2)
    )
    assert one.pipeline.bubble_s == max(one.pipeline.stage_times_s) and any("idles" in n for n in one.notes)


def test_serve_uses_the_pipeline_formulas(session, tiny_llama):
    report = session.serve(
        str(tiny_llama), input_tokens=SEQ, output_tokens=6, batch=BATCH, pp=2, micro_batches=2
    )
    assert report.ttft_s == report.prefill.pipeline.step_s
    assert report.tpot_at(report.kv_points[-1]) == report.decode[report.kv_points[-1]].pipeline.step_s
    data = report.to_dict()
    assert data["devices"] == 2 and data["output_tokens_per_s_per_device"] * 2 == data["output_tokens_per_s"]
    assert data["pipeline"]["prefill_stage_times_s"] == report.prefill.pipeline.stage_times_s
    assert data["pipeline"]["prefill_bubble_s"] == max(report.prefill.pipeline.stage_times_s)
    assert data["ttft_s"] == pytest.approx(
        3 * max(data["pipeline"]["prefill_stage_times_s"]) + data["pipeline"]["transfer_s"], rel=1e-12
    )
    assert report.format_text().splitlines()[0].endswith("pp 2 = 2 devices (figures per device)")


@pytest.mark.parametrize(
    "argv,start",
    [
        (["--pp", "3"], "--pp 3 is more pipeline stages"),
        (["--micro-batches", "2"], "--micro-batches"),  # without --pp
        (["--pp", "2", "--micro-batches", "3", "--batch", "4"], "--micro-batches 3"),
    ],
)
def test_pp_refusals_are_one_line(tiny_llama, h100_file, capsys, argv, start):
    code = main(
        [
            "estimate",
            "--no-packs",
            "--device-file",
            str(h100_file),
            "--model",
            str(tiny_llama),
            "--seq",
            "16",
            *argv,
        ]
    )
    assert code == 2 and capsys.readouterr().err.strip().splitlines()[-1].startswith(
        f"castcore: error: {start}"
    )
