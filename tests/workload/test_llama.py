"""A small Llama built from config captures on fake tensors, and its matmul FLOPs match a hand count."""

from __future__ import annotations

import json

import torch

from castcore.workload.spec import build_workload
from castcore.deploy.pipeline import build


def test_mm_flops_equal_hand_count(session, tiny_llama):
    cfg = json.loads(tiny_llama.read_text())
    batch, seq = 2, 16
    workload = build(build_workload(str(tiny_llama), batch=batch, seq=seq, dtype="bf16"))
    report = session.estimate(workload.model, kwargs=workload.kwargs)

    tokens = batch * seq
    h, inter, vocab = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    head_dim = h // cfg["num_attention_heads"]
    kv = cfg["num_key_value_heads"] * head_dim
    # Per layer: q, k, v, o projections, then gate, up, down; then the LM head for each sequence's last token.
    per_layer = [(h, h), (h, kv), (h, kv), (h, h), (h, inter), (h, inter), (inter, h)]
    expected = (
        sum(2 * tokens * k * n for k, n in per_layer) * cfg["num_hidden_layers"] + 2 * batch * h * vocab
    )

    mm = [r for r in report.records if r.invoke.name == "aten::mm"]
    assert len(mm) == 7 * cfg["num_hidden_layers"] + 1
    assert sum(r.flops for r in mm) == expected


def test_attention_reaches_the_estimator_as_one_causal_op(session, tiny_llama):
    workload = build(build_workload(str(tiny_llama), batch=1, seq=32, dtype="bf16"))
    report = session.estimate(workload.model, kwargs=workload.kwargs)
    attention = [r for r in report.records if "scaled_dot_product" in r.invoke.name]
    assert len(attention) == 2  # one per layer, not a decomposition into bmm + softmax
    for record in attention:
        assert record.invoke.argument("is_causal") is True
        assert record.invoke.module.endswith("self_attn")
    # (The rotary tables are a float32 bmm before transformers 5.16: not attention.)
    assert not any(
        r.invoke.name in ("aten::bmm", "aten::_softmax")
        for r in report.records
        if not r.invoke.module.endswith("rotary_emb")
    )


def test_weights_are_never_allocated_and_model_is_untouched(session, tiny_llama):
    workload = build(build_workload(str(tiny_llama), batch=1, seq=8))
    before = {n: (p.device.type, p.shape) for n, p in workload.model.named_parameters()}
    report = session.estimate(workload.model, kwargs=workload.kwargs)
    # Every op ran on fake CPU tensors standing in for the weights, never on the meta weights themselves.
    assert {t.device for r in report.records for t in r.invoke.inputs()} == {"cpu"}
    after = {n: (p.device.type, p.shape) for n, p in workload.model.named_parameters()}
    assert before == after
    assert {dev for dev, _ in after.values()} == {"meta"}


def test_real_module_on_cpu_is_estimated_without_changing_its_weights(session):
    linear = torch.nn.Linear(32, 16)
    weight = linear.weight.detach().clone()
    report = session.estimate(linear, torch.randn(4, 32))
    assert [r.invoke.name for r in report.records if r.flops] == ["aten::addmm"]
    assert report.flops == 2 * 4 * 32 * 16 + 4 * 16
    assert torch.equal(linear.weight, weight)
