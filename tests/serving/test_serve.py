"""castcore serve: TTFT, TPOT, latency, throughput and memory of a request batch; and last-token logits."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import pytest

import castcore
from castcore.cli.main import main
from castcore.workload.models import build_preset
from castcore.serving.static import decode_points, fit_line

INPUT, OUTPUT, BATCH = 16, 12, 2
KEYS = (
    "ttft_s",
    "tpot_s",
    "first_tpot_s",
    "middle_tpot_s",
    "last_tpot_s",
    "latency_s",
    "output_tokens_per_s",
    "output_tokens_per_s_per_device",
    "weight_bytes",
    "kv_cache_bytes",
    "activation_bytes",
    "peak_bytes",
    "device_memory_bytes",
    "free_bytes",
    "fits",
    "model",
    "device",
    "input_tokens",
    "output_tokens",
    "batch",
    "dtype",
    "tp",
)


def _argv(tiny_llama, h100_file, *extra: str) -> list[str]:
    return [
        "serve",
        "--model",
        str(tiny_llama),
        "--input",
        str(INPUT),
        "--output",
        str(OUTPUT),
        "--no-packs",
        "--device-file",
        str(h100_file),
        *extra,
    ]


@pytest.fixture
def served(session, tiny_llama) -> castcore.ServeReport:
    return session.serve(str(tiny_llama), input_tokens=INPUT, output_tokens=OUTPUT, batch=BATCH)


def test_the_command_prints_what_the_api_returns(served, tiny_llama, h100_file, capsys):
    assert main(_argv(tiny_llama, h100_file, "--batch", str(BATCH), "--json")) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(served.to_json())
    assert main(_argv(tiny_llama, h100_file, "--batch", str(BATCH))) == 0
    text = capsys.readouterr().out
    assert "TTFT" in text and "TPOT" in text and "output tokens/s" in text and ": fits" in text


def test_the_installed_command_gives_consistent_json(served, tiny_llama, h100_file):
    done = subprocess.run(
        [sys.executable, "-m", "castcore", *_argv(tiny_llama, h100_file, "--batch", str(BATCH), "--json")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert all(key in data for key in KEYS), [key for key in KEYS if key not in data]
    assert data == json.loads(served.to_json())
    assert data["latency_s"] == pytest.approx(data["ttft_s"] + OUTPUT * data["tpot_s"], rel=1e-12)
    assert data["output_tokens_per_s"] == pytest.approx(BATCH * OUTPUT / data["latency_s"], rel=1e-12)
    assert data["output_tokens_per_s_per_device"] == data["output_tokens_per_s"]  # one device
    assert data["peak_bytes"] == data["weight_bytes"] + data["kv_cache_bytes"] + data["activation_bytes"]
    assert data["free_bytes"] == data["device_memory_bytes"] - data["peak_bytes"] and data["fits"]
    assert data["first_tpot_s"] < data["tpot_s"] < data["last_tpot_s"]  # attention reads a growing cache


def test_ttft_is_the_prefill_and_memory_holds_the_whole_context(session, served, tiny_llama):
    prefill = session.estimate(castcore.build_workload(str(tiny_llama), batch=BATCH, seq=INPUT))
    assert served.ttft_s == prefill.time_s
    cfg = json.loads(tiny_llama.read_text())
    kv_bytes = 2 * cfg["num_hidden_layers"] * BATCH * (INPUT + OUTPUT) * cfg["num_key_value_heads"] * 16 * 2
    # and the cache's few position counters
    assert kv_bytes <= served.memory()["kv_cache_bytes"] < kv_bytes + 64


def test_interpolated_decode_equals_stepping_every_token(session, served, tiny_llama):
    steps = [
        session.estimate(
            castcore.build_workload(str(tiny_llama), batch=BATCH, seq=INPUT, phase="decode", kv_len=kv)
        ).time_s
        for kv in range(INPUT, INPUT + OUTPUT)
    ]
    # Every op's roofline time is affine in the KV length, so the fit through three steps is exact.
    assert served.decode_s == pytest.approx(sum(steps), rel=1e-12)
    assert served.kv_points == [INPUT, INPUT + (OUTPUT - 1) // 2, INPUT + OUTPUT - 1]
    assert [served.tpot_at(kv) for kv in served.kv_points] == [steps[kv - INPUT] for kv in served.kv_points]
    assert not any("not affine" in note for note in served.notes)


def test_a_decode_steps_own_kernels_line_says_it_is_the_decode_steps_and_shared_lines_come_once(served):
    deployed = [n for n in served.notes if "deployed kernels by castcore" in n]
    prefill, decode = deployed  # the decode steps' line adds their cache writes, so it is their own
    assert prefill.startswith("deployed kernels by castcore: ") and "kv_cache_write" not in prefill
    assert decode.startswith("decode steps: deployed kernels by castcore: ") and "kv_cache_write" in decode
    assert len(served.notes) == len(set(served.notes))


def test_the_fit_and_its_points():
    assert decode_points(100, 1) == [100] and decode_points(100, 2) == [100, 101]
    assert fit_line({5: 2.0}) == (2.0, 0.0)
    a, b = fit_line({10: 1.0, 20: 2.0, 30: 3.0})
    assert a == pytest.approx(0.0, abs=1e-12) and b == pytest.approx(0.1)


def test_max_batch_fits_and_one_more_does_not(session, tiny_llama):
    small = replace(session.device(), memory_bytes=1_000_000)  # a few dozen tiny-llama sequences
    found = session.serve(
        str(tiny_llama), input_tokens=INPUT, output_tokens=OUTPUT, batch="max", device=small
    )
    assert found.memory()["fits"] and found.max_batch.startswith(f"{found.batch}: bisection")
    more = session.serve(
        str(tiny_llama), input_tokens=INPUT, output_tokens=OUTPUT, batch=found.batch + 1, device=small
    )
    assert not more.memory()["fits"]
    assert 10 < found.batch < 100


def test_a_batch_that_does_not_fit_warns(tiny_llama, h100_file, tmp_path, capsys):
    device = tmp_path / "small.toml"
    device.write_text(
        h100_file.read_text()
        .replace('name = "h100-sxm"', 'name = "small"')
        .replace("memory_bytes = 85899345920", "memory_bytes = 100000")
    )
    assert main(_argv(tiny_llama, device, "--batch", "4")) == 0
    captured = capsys.readouterr()
    assert "does NOT fit" in captured.out and "warning: does not fit" in captured.err


@pytest.mark.parametrize(
    "options, message",
    [
        ({"--output": "0"}, "--output 0: must be a whole number of at least 1"),
        (
            {"--batch": "0"},
            "--batch 0: must be a whole number of at least 1, the requests served together; or use --max-batch",
        ),
        ({"--input": "300"}, "--input 300 is longer than"),  # tiny-llama's context is 256 tokens
        ({"--input": "250"}, "use --output 6 or less"),
    ],
)
def test_bad_requests_are_one_line_errors(tiny_llama, h100_file, capsys, options, message):
    given = {"--input": str(INPUT), "--output": str(OUTPUT), **options}
    argv = ["serve", "--model", str(tiny_llama), "--no-packs", "--device-file", str(h100_file)]
    assert main(argv + [word for pair in given.items() for word in pair]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("castcore: error: ") and message in err and "\n" not in err


def test_bad_requests_raise_model_error_in_python(session, tiny_llama):
    for options in (dict(output_tokens=0), dict(batch=0), dict(input_tokens=257), dict(batch="all")):
        with pytest.raises(castcore.ModelError):
            session.serve(str(tiny_llama), **{"input_tokens": INPUT, "output_tokens": OUTPUT, **options})


def test_tensor_parallel_figures_are_per_device_or_decode_is_refused(session, tiny_llama):
    try:
        report = session.serve(str(tiny_llama), input_tokens=INPUT, output_tokens=OUTPUT, batch=BATCH, tp=2)
    except castcore.ModelError as exc:  # decode under --tp not supported: refused in one line, never faked
        assert "decode" in str(exc) and "\n" not in str(exc)
        return
    data = report.to_dict()
    assert data["output_tokens_per_s_per_device"] == data["output_tokens_per_s"] / 2


def _lm_head_rows(records) -> int:
    (head,) = [
        r.invoke for r in records if r.invoke.name == "aten::mm" and r.invoke.module.endswith("lm_head")
    ]
    return head.args[0].shape[0]


def test_a_prefill_computes_the_last_tokens_logits(session, tiny_llama):
    report = session.estimate(castcore.build_workload(str(tiny_llama), batch=BATCH, seq=INPUT))
    assert _lm_head_rows(report.records) == BATCH
    assert "last-token logits" in report.description
    every = build_preset(
        str(tiny_llama),
        batch=BATCH,
        seq=INPUT,
        dtype="bf16",
        phase="prefill",
        kv_len=INPUT,
        train=False,
        all_logits=True,
    )
    assert _lm_head_rows(session.estimate(every.model, kwargs=every.kwargs).records) == BATCH * INPUT
    assert every.description.endswith("logits for every token")


def test_all_logits_reaches_the_prefill(session, tiny_llama, h100_file, capsys):
    report = session.estimate(
        castcore.build_workload(str(tiny_llama), batch=BATCH, seq=INPUT, all_logits=True)
    )
    assert _lm_head_rows(report.records) == BATCH * INPUT
    assert (
        main(
            [
                "estimate",
                "--json",
                "--model",
                str(tiny_llama),
                "--batch",
                str(BATCH),
                "--seq",
                str(INPUT),
                "--all-logits",
                "--no-packs",
                "--device-file",
                str(h100_file),
            ]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out)["workload"]["all_logits"] is True


def test_all_logits_is_for_models_castcore_builds():
    import torch

    with pytest.raises(castcore.ModelError, match="all_logits=True"):
        castcore.build_workload(torch.nn.Linear(2, 2), torch.ones(1, 2), all_logits=True)


@pytest.mark.parametrize(
    "options", [{}, {"tp": 2}, {"tp": 2, "weights": "int8", "kv_cache": "fp8"}, {"fuse": False}]
)
def test_decode_steps_from_one_built_model_equal_separate_estimates(session, tiny_llama, options):
    workload = castcore.build_workload(str(tiny_llama), batch=2, seq=16, phase="decode", kv_len=16, **options)
    shared = session.pipeline.run_decode_steps(workload, [16, 24, 31])
    for kv_len, report in shared.items():
        alone = session.estimate(
            castcore.build_workload(
                str(tiny_llama), batch=2, seq=16, phase="decode", kv_len=kv_len, **options
            )
        )
        assert report.to_dict() == alone.to_dict()
        assert f"over {kv_len} cached" in report.description
