"""Memory footprint of real captures: liveness by storage, views and in-place ops, HF weights, fit, KV cache."""

from __future__ import annotations

import json

import pytest
import torch

import castcore
from castcore.report.memory import analyze_memory, kv_cache_bytes
from castcore.workload.spec import build_workload, load_model_config
from castcore.deploy.pipeline import build

MiB = 2**20
N = MiB // 4  # float32 elements in 1 MiB


def x_1mib() -> torch.Tensor:
    return torch.empty(512, 512, device="meta")  # float32: exactly 1 MiB


def names(captured: castcore.Capture) -> list[str]:
    return [i.name for i in captured.invokes]


def test_pointwise_chain_holds_input_plus_two_intermediates():
    captured = castcore.capture(lambda x: (((x * 2) + 1) * 3) - 1, x_1mib())
    assert names(captured) == ["aten::mul.Tensor", "aten::add.Tensor", "aten::mul.Tensor", "aten::sub.Tensor"]
    report = analyze_memory(captured)
    # Each op reads the previous result and writes a new one; the one before that is dead.
    assert report.weight_bytes == 0
    assert report.input_bytes == 1 * MiB
    assert report.activation_peak_bytes == 2 * MiB
    assert report.peak_bytes == 3 * MiB
    assert report.peak_index == 1  # the first op where two intermediates are live
    assert [s.bytes for s in report.top_live] == [MiB, MiB]
    assert [s.index for s in report.top_live] == [0, 1]


def test_returned_intermediates_stay_live_to_the_end():
    def f(x):
        a = x * 2
        return a, ((a + 1) * 3) - 1

    report = analyze_memory(castcore.capture(f, x_1mib()))
    # At the second mul: a (an output), a + 1 and its product are live, plus the input.
    assert report.peak_bytes == 4 * MiB
    assert report.peak_index == 2


def test_views_do_not_add_memory():
    def f(x):
        a = x * 2
        b = a.view(-1).view(512, 512).transpose(0, 1)[:, :]
        return x.view(-1).view(512, 512).t() + b

    captured = castcore.capture(f, x_1mib())
    view_ops = [
        n
        for n in names(captured)
        if n in ("aten::view", "aten::transpose.int", "aten::t", "aten::slice.Tensor")
    ]
    assert len(view_ops) >= 6
    report = analyze_memory(captured)
    assert report.peak_bytes == 3 * MiB  # x, a, and the sum; no view is an allocation
    assert [s.bytes for s in report.top_live] == [MiB, MiB]


def test_inplace_ops_do_not_add_memory():
    def f(x):
        x.add_(1)
        a = x * 2
        a.add_(1).mul_(3).relu_()
        return a

    captured = castcore.capture(f, x_1mib())
    assert names(captured) == [
        "aten::add_.Tensor",
        "aten::mul.Tensor",
        "aten::add_.Tensor",
        "aten::mul_.Tensor",
        "aten::relu_",
    ]
    report = analyze_memory(captured)
    assert report.peak_bytes == 2 * MiB
    assert [s.index for s in report.top_live] == [1]  # the one allocation, made by the out-of-place mul


@pytest.mark.parametrize("tied", [False, True])
def test_tiny_llama_weights_and_peak(tiny_llama, tmp_path, tied):
    config = json.loads(tiny_llama.read_text())
    config["tie_word_embeddings"] = tied
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    workload = build(build_workload(str(path), batch=2, seq=16, dtype="fp32"))
    model = workload.model
    captured = castcore.capture(model, *workload.args, **workload.kwargs)
    report = analyze_memory(captured)

    # both iterators skip tied duplicates
    unique = {id(t): t for t in [*model.parameters(), *model.buffers()]}
    expected = sum(t.numel() * t.element_size() for t in unique.values())
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tied
    assert report.weight_bytes == expected
    # int64 input_ids, and the last position's index (logits_to_keep)
    assert report.input_bytes == 2 * 16 * 8 + 8
    assert report.peak_bytes > report.weight_bytes + report.input_bytes
    root, _, path_in_model = report.peak_module.partition(".")
    assert root == type(model).__name__ and path_in_model
    model.get_submodule(path_in_model)  # raises if the peak module is not inside the model
    assert report.peak_module == captured.invokes[report.peak_index].module
    assert json.loads(json.dumps(report.to_dict()))["peak_bytes"] == report.peak_bytes


def test_fits_and_the_warning(h100_file):
    report = analyze_memory(castcore.capture(lambda x: (((x * 2) + 1) * 3) - 1, x_1mib()))
    h100 = castcore.load_device_file(h100_file)
    assert report.fits(h100.memory_bytes) and report.fits(h100)
    assert report.fits(3 * MiB) and not report.fits(3 * MiB - 1)
    lines = report.summary_lines(h100)
    assert not any("does not fit" in line for line in lines)
    assert "peak memory  3.00 MiB of 80.00 GiB on h100-sxm" in "\n".join(lines)

    small = castcore.device_from_dict(
        {
            "name": "tiny",
            "vendor": "test",
            "mma_flops": {},
            "gp_flops": {},
            "memory_bytes": MiB,
            "memory_bandwidth": 1e12,
            "sources": {"memory_bytes": "test value", "memory_bandwidth": "test value"},
        }
    )
    assert not report.fits(small.memory_bytes)
    lines = report.summary_lines(small)
    assert lines[-1] == (
        "warning: does not fit: needs 3.00 MiB of 1.00 MiB; try --tp 4 or a smaller --batch/--seq"
    )

    with_cache = analyze_memory(castcore.capture(lambda x: x * 2, x_1mib()), kv_cache_bytes=5 * MiB)
    assert with_cache.peak_bytes == 7 * MiB
    assert "KV cache     5.00 MiB" in with_cache.summary_lines(h100)


def test_kv_cache_bytes_llama_3_8b():
    config = load_model_config("llama-3-8b")
    assert (
        kv_cache_bytes(config, batch=1, kv_len=8192, dtype=torch.bfloat16)
        == 2 * 32 * 8192 * 8 * 128 * 2
        == 2**30
    )
    assert kv_cache_bytes(config, 4, 8192, "fp32") == 8 * 2**30
    assert kv_cache_bytes({**config, "head_dim": 64}, 1, 8192, torch.bfloat16) == 2**29
