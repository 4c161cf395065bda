"""Repeated-layer reuse: one identical layer captured, the rest replayed, and nothing changes but speed."""

from __future__ import annotations

import pytest
import torch

import castcore
from castcore.hf.cache import cache_argument
from castcore.workload.spec import build_workload
from castcore.recording.repeated_layers import repeated_layers
from castcore.deploy.pipeline import build


def _both(session, spec, **options):
    workload = build(build_workload(spec, **options))
    reports = []
    for reuse in (False, True):
        captured = castcore.capture(
            workload.model, reuse=reuse, inputs_fn=workload.inputs_fn, **workload.kwargs
        )
        reports.append((captured, session.estimate_capture(captured)))
    return reports


@pytest.mark.parametrize(
    "spec, options",
    [
        ("tests/data/tiny-llama.json", {"seq": 24}),
        ("tests/data/tiny-mixtral.json", {"seq": 16, "batch": 2}),
        ("tests/data/tiny-llama.json", {"phase": "decode", "kv_len": 40}),
        (
            "tests/data/tiny-gemma3.json",
            {"seq": 24},
        ),  # sliding and full attention layers, seq beyond the window
        (
            "tests/data/tiny-deepseek-v3.json",
            {"seq": 16},
        ),  # a dense first layer, then MoE layers; MLA attention
    ],
)
def test_totals_and_records_equal_a_full_capture(session, spec, options):
    (full_capture, full), (reused_capture, reused) = _both(session, spec, **options)
    assert [(r.invoke.name, r.invoke.module) for r in reused.records] == [
        (r.invoke.name, r.invoke.module) for r in full.records
    ]
    assert [r.invoke.key for r in reused.records] == [r.invoke.key for r in full.records]
    assert reused.time_s == full.time_s
    assert reused.flops == full.flops
    assert reused.memory.to_dict() == full.memory.to_dict()
    assert [r.index for r in (rec.invoke for rec in reused.records)] == list(range(len(reused.records)))


def test_layers_after_the_first_are_replayed_not_run(session, monkeypatch):
    workload = build(build_workload("tests/data/tiny-llama.json", seq=8))
    ((layer0, layer1),) = repeated_layers(workload.model)
    calls = []
    original = type(layer1).forward
    monkeypatch.setattr(
        type(layer1), "forward", lambda self, *a, **k: calls.append(self) or original(self, *a, **k)
    )
    castcore.capture(workload.model, reuse=True, **workload.kwargs)
    assert calls == [layer0]
    calls.clear()
    castcore.capture(workload.model, reuse=False, **workload.kwargs)
    assert calls == [layer0, layer1]


def test_replayed_layers_use_their_own_weights_and_fresh_activations(session):
    workload = build(build_workload("tests/data/tiny-llama.json", seq=8))
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
    assert [(i.name, i.module, i.key) for i in reused.invokes] == [
        (i.name, i.module, i.key) for i in full.invokes
    ]
    assert reused.weight_storages == full.weight_storages
    assert (
        session.estimate_capture(reused).memory.to_dict() == session.estimate_capture(full).memory.to_dict()
    )
    weight_of = {
        i.module.rsplit(".", 1)[1]: i.args[2].storage for i in reused.invokes if i.name == "aten::addmm"
    }
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
    assert [(i.name, i.module, i.key) for i in reused.invokes] == [
        (i.name, i.module, i.key) for i in full.invokes
    ]
    last_mm = reused.invokes[-1]
    assert last_mm.name == "aten::mm" and last_mm.args[1].storage in reused.weight_storages
    assert reused.weight_storages == full.weight_storages


def _count_runs(monkeypatch, layer_class: type) -> list:
    """Every call of ``layer_class`` that really runs, appended as it starts (a replayed call is not)."""
    runs = []
    original = layer_class.forward
    monkeypatch.setattr(
        layer_class, "forward", lambda self, *a, **k: runs.append(self) or original(self, *a, **k)
    )
    return runs


def _storages(captured) -> list:
    """Every call with the storage of each tensor it reads and writes: what memory liveness is computed from."""
    return [
        (i.name, i.module, i.key, [(t.storage, t.storage_nbytes) for t in (*i.inputs(), *i.outputs())])
        for i in captured.invokes
    ] + [captured.weight_storages, captured.state_storages, captured.output_storages]


@pytest.mark.parametrize(
    "spec, options, runs",
    [
        (
            "tests/data/tiny-llama.json",
            {"phase": "decode", "kv_len": 32},
            1,
        ),  # a StaticCache in every layer's inputs
        ("tests/data/tiny-mixtral.json", {"phase": "decode", "kv_len": 32, "batch": 2}, 1),
        (
            "tests/data/tiny-gemma3.json",
            {"phase": "decode", "kv_len": 32},
            2,
        ),  # sliding-window and full cache layers
        (
            "tests/data/tiny-llama.json",
            {"seq": 16, "tp": 2},
            1,
        ),  # DTensor weights, local-shard ops, all_reduce
        ("tests/data/tiny-mixtral.json", {"seq": 16, "batch": 2, "tp": 2}, 1),
        ("tests/data/tiny-gemma3.json", {"seq": 16, "tp": 2}, 2),
        (
            "tests/data/tiny-llama.json",
            {"phase": "decode", "kv_len": 32, "batch": 2, "tp": 2},
            1,
        ),  # per-device cache
        (
            "tests/data/tiny-mixtral.json",
            {"phase": "decode", "kv_len": 32, "batch": 2, "tp": 2},
            1,
        ),  # split experts
    ],
)
def test_decode_and_tensor_parallel_reports_equal_a_full_capture(session, monkeypatch, spec, options, runs):
    layers = build(build_workload(spec, seq=8)).model.model.layers
    ran = _count_runs(monkeypatch, type(layers[0]))
    reports = []
    for reuse in (False, True):
        ran.clear()
        reports.append(session.estimate(build_workload(spec, reuse=reuse, **options)))
        assert len(ran) == (runs if reuse else len(layers))  # one run per distinct layer; the rest replayed
    full, reused = reports
    assert reused.totals() == full.totals()
    assert [s.to_dict() for s in reused.by_op()] == [s.to_dict() for s in full.by_op()]
    assert reused.memory.to_dict() == full.memory.to_dict()


def _dynamic_cache_step(model, batch: int, cached: int, made: list):
    """inputs_fn of a decode step over a DynamicCache already holding ``cached`` tokens; the cache goes in ``made``."""
    from transformers import DynamicCache

    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads

    def make():
        cache = DynamicCache(config=config)
        for index in range(config.num_hidden_layers):
            keys = torch.zeros(batch, config.num_key_value_heads, cached, head_dim, dtype=torch.bfloat16)
            cache.update(keys, keys.clone(), index)
        made.append(cache)
        return (), {
            "input_ids": torch.zeros(batch, 1, dtype=torch.long),
            cache_argument(model): cache,
            "use_cache": True,
        }

    return make


def _cache_state(cache) -> list:
    """Each cache layer's attributes, a tensor as its layout over its storage (a sliding layer keeps a view)."""
    return [
        {
            k: (v.shape, v.stride(), v.storage_offset(), v.untyped_storage().nbytes())
            if isinstance(v, torch.Tensor)
            else v
            for k, v in vars(layer).items()
        }
        for layer in cache.layers
    ]


@pytest.mark.parametrize(
    "spec, runs", [("tests/data/tiny-llama.json", 1), ("tests/data/tiny-gemma3.json", 2)]
)
def test_a_dynamic_cache_grows_in_replayed_layers_as_in_a_full_capture(session, monkeypatch, spec, runs):
    model = build(build_workload(spec, seq=8)).model
    ran = _count_runs(monkeypatch, type(model.model.layers[0]))
    results = []
    for reuse in (False, True):
        ran.clear()
        made = []
        captured = castcore.capture(model, reuse=reuse, inputs_fn=_dynamic_cache_step(model, 2, 12, made))
        results.append((captured, made[0], len(ran)))
    (full, full_cache, full_runs), (reused, reused_cache, reused_runs) = results
    assert (full_runs, reused_runs) == (len(model.model.layers), runs)
    assert _storages(reused) == _storages(full)
    assert (
        session.estimate_capture(reused).memory.to_dict() == session.estimate_capture(full).memory.to_dict()
    )
    # Each replayed layer's cache holds the new token too (a grown tensor of its own; Gemma 3's sliding
    # layers also count it), just as if the layer had run.
    assert _cache_state(reused_cache) == _cache_state(full_cache)
    assert len({id(layer.keys) for layer in reused_cache.layers}) == len(reused_cache.layers)
    # A prefill with use_cache=True: the model makes its own DynamicCache and every layer fills its part.
    captures = []
    for reuse in (False, True):
        ran.clear()
        captures.append(
            castcore.capture(
                model, input_ids=torch.zeros(2, 12, dtype=torch.long), use_cache=True, reuse=reuse
            )
        )
    assert len(ran) == runs
    assert _storages(captures[1]) == _storages(captures[0])


class _CachedLayer(torch.nn.Module):
    def __init__(self, layer_idx: int, peek: bool):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)
        self.layer_idx, self.peek = layer_idx, peek

    def forward(self, x, cache):
        k = self.proj(x)[:, None]  # batch x 1 head x tokens x 8
        keys, values = cache.update(k, k, self.layer_idx)
        if self.peek:  # also reads another layer's cache
            keys = keys + cache.layers[(self.layer_idx + 1) % len(cache.layers)].keys.sum()
        return x + keys.mean(dim=(1, 2))[:, None] + values.mean()


class _CachedLayers(torch.nn.Module):
    def __init__(self, layer_indices: list[int], peek: bool = False):
        super().__init__()
        self.layers = torch.nn.ModuleList(_CachedLayer(i, peek) for i in layer_indices)

    def forward(self, x, cache):
        for layer in self.layers:
            x = layer(x, cache)
        return x


def _prefilled_cache():
    from transformers.cache_utils import Cache, DynamicLayer

    cache = Cache(layers=[DynamicLayer() for _ in range(3)])
    for layer in cache.layers:
        layer.update(torch.zeros(2, 1, 4, 8), torch.zeros(2, 1, 4, 8))
    return (), {"cache": cache}


@pytest.mark.parametrize(
    "model, runs",
    [
        (
            _CachedLayers([2, 1, 0]),
            1,
        ),  # a layer owns the cache layer of its layer_idx, not of its list position
        (_CachedLayers([0, 1, 2], peek=True), 3),  # cache state of another layer: not replayable, all run
    ],
)
def test_a_layer_owns_the_cache_layer_of_its_layer_idx(monkeypatch, model, runs):
    ran = _count_runs(monkeypatch, _CachedLayer)
    full = castcore.capture(model, torch.ones(2, 3, 8), inputs_fn=_prefilled_cache, reuse=False)
    ran.clear()
    reused = castcore.capture(model, torch.ones(2, 3, 8), inputs_fn=_prefilled_cache, reuse=True)
    assert len(ran) == runs
    assert _storages(reused) == _storages(full)
