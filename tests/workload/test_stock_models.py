"""A user's own transformers causal LM, passed as a module, is estimated as its preset would be."""

from __future__ import annotations

import json

import pytest
import torch

from castcore.hf.cache import cache_argument
from castcore.recording.repeated_layers import repeated_layers
from castcore.report.memory import kv_cache_bytes
from castcore.workload.spec import build_workload
from castcore.deploy.pipeline import build

CONFIGS = {
    "llama": {
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 160,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 500,
        "max_position_embeddings": 256,
        "tie_word_embeddings": False,
    },
    "qwen2": {
        "model_type": "qwen2",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 300,
        "max_position_embeddings": 256,
        "tie_word_embeddings": True,
    },
    "mixtral": {
        "model_type": "mixtral",
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 500,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "max_position_embeddings": 256,
        "tie_word_embeddings": False,
    },
}
# torch's fake-tensor grouped matmul (transformers' default for experts) takes bf16 only.
DTYPES = {"mixtral": torch.bfloat16}
BATCH, SEQ = 2, 12


def _stock(config: dict, meta: bool) -> torch.nn.Module:
    """What a user writes: AutoModelForCausalLM.from_config, default attention and use_cache."""
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = dict(config)
    model_type = fields.pop("model_type")
    hf_config = AutoConfig.for_model(model_type, **fields)
    torch.manual_seed(0)
    with torch.device("meta" if meta else "cpu"):
        return AutoModelForCausalLM.from_config(hf_config, dtype=DTYPES.get(model_type, torch.float32)).eval()


def _input_ids() -> torch.Tensor:
    return torch.zeros((BATCH, SEQ), dtype=torch.long)


@pytest.mark.parametrize("meta", [True, False], ids=["meta", "cpu-weights"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_a_stock_model_counts_what_its_preset_counts(session, tmp_path, name, meta):
    model = _stock(CONFIGS[name], meta)
    attention, use_cache = model.config._attn_implementation, model.config.use_cache
    assert (attention, use_cache) == ("sdpa", True)  # the defaults castcore has to work around
    path = tmp_path / "config.json"
    path.write_text(json.dumps(CONFIGS[name]))
    dtype = {torch.float32: "fp32", torch.bfloat16: "bf16"}[model.dtype]
    # as written
    preset = session.estimate(build_workload(str(path), batch=BATCH, seq=SEQ, dtype=dtype, fuse=False))
    # The preset's prefill computes the last token's logits; a server calls its model the same way.
    report = session.estimate(model, _input_ids(), kwargs={"logits_to_keep": torch.full((1,), SEQ - 1)})
    assert report.flops == pytest.approx(preset.flops, rel=1e-3)
    assert [r.invoke.name for r in report.records] == [r.invoke.name for r in preset.records]
    assert (
        report.memory.kv_cache_bytes
        == preset.memory.kv_cache_bytes
        == kv_cache_bytes(CONFIGS[name], BATCH, SEQ, model.dtype)
        > 0
    )
    assert any("attention as 'castcore'" in note and "'sdpa'" in note for note in report.notes)
    assert any("use_cache=False" in note for note in report.notes)
    # The user's model is left as it was.
    assert (model.config._attn_implementation, model.config.use_cache) == (attention, use_cache)
    assert {p.device.type for p in model.parameters()} == {"meta" if meta else "cpu"}


@pytest.mark.parametrize("meta", [True, False], ids=["meta", "cpu-weights"])
def test_layers_after_the_first_are_replayed(session, monkeypatch, meta):
    model = _stock(CONFIGS["llama"], meta)
    ((first, *others),) = repeated_layers(model)
    assert len(others) == 2
    calls = []
    original = type(first).forward
    monkeypatch.setattr(
        type(first), "forward", lambda self, *a, **k: calls.append(self) or original(self, *a, **k)
    )
    session.estimate(model, _input_ids())
    assert calls == [first]


def test_the_attention_setting_is_restored_when_the_capture_fails(session, monkeypatch):
    model = _stock(CONFIGS["llama"], meta=True)
    seen = []

    def failing_capture(target, *args, **kwargs):
        seen.append(target.config._attn_implementation)
        raise RuntimeError("capture failed")

    monkeypatch.setattr("castcore.deploy.pipeline.capture", failing_capture)
    with pytest.raises(RuntimeError, match="capture failed"):
        session.estimate(model, _input_ids())
    assert seen == ["castcore"]
    assert model.config._attn_implementation == "sdpa"


@pytest.mark.parametrize("kwargs", [{"use_cache": True}, {"use_cache": False}, {"cache": None}])
def test_the_callers_cache_choice_is_kept(kwargs):
    model = _stock(CONFIGS["llama"], meta=True)
    if "cache" in kwargs:  # the name the installed transformers takes its cache by
        kwargs = {cache_argument(model): None}
    built = build(build_workload(model, _input_ids(), kwargs=kwargs))
    assert built.kwargs == kwargs
    assert built.config is None and built.kv_cache_shape is None  # the capture holds whatever cache is made
    assert not any("use_cache" in note for note in built.notes)


def test_a_model_without_the_attention_interface_keeps_its_attention_with_a_note(session):
    config = {
        "model_type": "falcon",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "vocab_size": 256,
    }
    model = _stock(config, meta=True)
    built = build(build_workload(model, _input_ids()))
    assert "FalconForCausalLM cannot take castcore's attention path" in built.notes[0]
    report = session.estimate(model, _input_ids())
    assert report.flops > 0 and report.memory.kv_cache_bytes > 0
    assert model.config._attn_implementation == "sdpa"


def test_other_modules_are_left_as_they_are():
    built = build(build_workload(torch.nn.Linear(4, 4), torch.ones(2, 4)))
    assert built.kwargs == {} and built.notes == [] and built.config is None
