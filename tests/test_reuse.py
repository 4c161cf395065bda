"""Repeated-layer reuse: one identical layer captured, the rest replayed, and nothing changes but speed."""

from __future__ import annotations

import pytest
import torch

import castcore
from castcore.workload.spec import build_workload
from castcore.recording.reuse import repeated_layers


def _both(session, spec, **options):
    workload = build_workload(spec, **options).build()
    reports = []
    for reuse in (False, True):
        captured = castcore.capture(workload.model, reuse=reuse, inputs_fn=workload.inputs_fn, **workload.kwargs)
        reports.append((captured, session.estimate_capture(captured)))
    return reports


@pytest.mark.parametrize("spec, options", [
    ("tests/data/tiny-llama.json", {"seq": 24}),
    ("tests/data/tiny-mixtral.json", {"seq": 16, "batch": 2}),
    ("tests/data/tiny-llama.json", {"phase": "decode", "kv_len": 40}),
    ("tests/data/tiny-gemma3.json", {"seq": 24}),  # sliding and full attention layers, seq beyond the window
    ("tests/data/tiny-deepseek-v3.json", {"seq": 16}),  # a dense first layer, then MoE layers; MLA attention
])
def test_totals_and_records_equal_a_full_capture(session, spec, options):
    (full_capture, full), (reused_capture, reused) = _both(session, spec, **options)
    assert [(r.invoke.name, r.invoke.module) for r in reused.records] == \
        [(r.invoke.name, r.invoke.module) for r in full.records]
    assert [r.invoke.key for r in reused.records] == [r.invoke.key for r in full.records]
    assert reused.time_s == full.time_s
    assert reused.flops == full.flops
    assert reused.memory.to_dict() == full.memory.to_dict()
    assert [r.index for r in (rec.invoke for rec in reused.records)] == list(range(len(reused.records)))


def test_layers_after_the_first_are_replayed_not_run(session, monkeypatch):
    workload = build_workload("tests/data/tiny-llama.json", seq=8).build()
    (layer0, layer1), = repeated_layers(workload.model)
    calls = []
    original = type(layer1).forward
    monkeypatch.setattr(type(layer1), "forward", lambda self, *a, **k: calls.append(self) or original(self, *a, **k))
    castcore.capture(workload.model, reuse=True, **workload.kwargs)
    assert calls == [layer0]
    calls.clear()
    castcore.capture(workload.model, reuse=False, **workload.kwargs)
    assert calls == [layer0, layer1]


def test_replayed_layers_use_their_own_weights_and_fresh_activations(session):
    workload = build_workload("tests/data/tiny-llama.json", seq=8).build()
    captured = castcore.capture(workload.model, reuse=True, **workload.kwargs)
    by_layer = {}
    for invoke in captured.invokes:
        if invoke.name == "aten::mm" and ".layers." in invoke.module:
            layer = invoke.module.split(".layers.")[1].split(".")[0]
            by_layer.setdefault(layer, []).append(invoke.args[1].storage)
    assert set(by_layer) == {"0", "1"}
    assert not set(by_layer["0"]) & set(by_layer["1"])
    assert set(by_layer["1"]) <= set(captured.weight_storages)


class _ThreeLinears(torch.nn.Module):
    """Layer 2 sees a batch twice as large, so it cannot replay layer 0's records and must run."""

    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(3))

    def forward(self, x):
        x = self.layers[1](self.layers[0](x))
        return self.layers[2](torch.cat([x, x]))


def test_a_layer_that_cannot_replay_runs_on_its_own_weights(session):
    model = _ThreeLinears()
    originals = [layer.weight for layer in model.layers]
    full = castcore.capture(model, torch.ones(4, 8), reuse=False)
    reused = castcore.capture(model, torch.ones(4, 8), reuse=True)
    assert [(i.name, i.module, i.key) for i in reused.invokes] == [(i.name, i.module, i.key) for i in full.invokes]
    assert reused.weight_storages == full.weight_storages
    assert session.estimate_capture(reused).memory.to_dict() == session.estimate_capture(full).memory.to_dict()
    weight_of = {i.module.rsplit(".", 1)[1]: i.args[2].storage for i in reused.invokes if i.name == "aten::addmm"}
    assert len(set(weight_of.values())) == 3 and set(weight_of.values()) <= set(reused.weight_storages)
    assert [layer.weight for layer in model.layers] == originals  # the module is left as it was


class _Block(torch.nn.Module):
    def __init__(self, gelu: bool):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)
        self.proj.gelu = gelu  # a plain flag on a submodule that changes which ops run

    def forward(self, x):
        y = self.proj(x)
        return torch.nn.functional.gelu(y) if self.proj.gelu else y


def test_layers_differing_only_in_a_submodule_flag_are_not_interchangeable(session):
    model = torch.nn.Sequential()
    model.layers = torch.nn.ModuleList([_Block(False), _Block(True), _Block(False)])
    model.forward = lambda x: model.layers[2](model.layers[1](model.layers[0](x)))
    assert [len(group) for group in repeated_layers(model)] == [2]
    full = castcore.capture(model, torch.ones(2, 8), reuse=False)
    reused = castcore.capture(model, torch.ones(2, 8), reuse=True)
    assert [i.name for i in reused.invokes] == [i.name for i in full.invokes]
    assert sum(i.name == "aten::gelu" for i in reused.invokes) == 1


class _LastWeightReused(torch.nn.Module):
    """Uses a later layer's weight outside that layer, which a replayed layer's deferred weight cannot serve."""

    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(3))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x @ self.layers[2].weight


@pytest.mark.parametrize("device", ["meta", "cpu"])
def test_a_weight_used_outside_its_replayed_layer_gives_a_full_capture(device):
    with torch.device(device):
        model = _LastWeightReused()
    full = castcore.capture(model, torch.ones(2, 8), reuse=False)
    reused = castcore.capture(model, torch.ones(2, 8), reuse=True)
    assert [(i.name, i.module, i.key) for i in reused.invokes] == [(i.name, i.module, i.key) for i in full.invokes]
    last_mm = reused.invokes[-1]
    assert last_mm.name == "aten::mm" and last_mm.args[1].storage in reused.weight_storages
    assert reused.weight_storages == full.weight_storages
