"""Configs a user may hand to --model: older architectures estimate (their fields go by other names), and a
config castcore cannot build is one line naming the file, the field and what castcore supports."""

from __future__ import annotations

import json

import pytest

import castcore
from castcore.cli.main import main

SMALL = {"vocab_size": 1000}
ESTIMATES = {
    "gpt2": {"n_layer": 2, "n_head": 4, "n_embd": 64, "n_positions": 256},
    "gptj": {"n_layer": 2, "n_head": 4, "n_embd": 64, "rotary_dim": 8, "n_positions": 256},
    "llama": {"hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128},  # heads from the defaults
    "opt": {
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "hidden_size": 64,
        "ffn_dim": 128,
        "word_embed_proj_dim": 64,
    },
    "gpt_neox": {
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "hidden_size": 64,
        "intermediate_size": 128,
    },
    "phi": {"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64, "intermediate_size": 128},
    "gemma": {
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "hidden_size": 64,
        "intermediate_size": 128,
        "head_dim": 16,
    },
}


def write(tmp_path, data) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return str(path)


@pytest.mark.parametrize("model_type", sorted(ESTIMATES))
def test_older_architectures_estimate_with_their_kv_cache(model_type, tmp_path, session):
    spec = write(tmp_path, {"model_type": model_type, **SMALL, **ESTIMATES[model_type]})
    report = session.estimate(castcore.build_workload(spec, batch=2, seq=16))
    assert report.flops > 0 and report.fallback_calls == 0
    built = session.build(castcore.build_workload(spec))
    config = built.model.config
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    assert report.memory.kv_cache_bytes == 2 * config.num_hidden_layers * 2 * 16 * kv_heads * head_dim * 2


@pytest.mark.parametrize(
    "data, message",
    [
        ([1, 2], "holds a JSON list, not an object"),
        ({"hidden_size": 64}, "has no 'model_type'"),
        ({"model_type": "blorp"}, "'model_type' = 'blorp' is not a model type transformers"),
        ({"model_type": "llama", "hidden_size": "64"}, "transformers refuses this llama config"),
        ({"model_type": "t5", "d_model": 64, "num_layers": 2}, "t5 is not a causal language model"),
        ({"model_type": "vit", "hidden_size": 64}, "vit is not a causal language model"),
    ],
)
def test_a_config_castcore_cannot_build_is_one_line(data, message, tmp_path, h100_file, capsys):
    spec = write(tmp_path, data)
    code = main(["estimate", "--model", spec, "--seq", "8", "--no-packs", "--device-file", str(h100_file)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("castcore: error:") and message in err[-1], err
    assert spec in err[-1] and "Traceback" not in "\n".join(err)


def test_a_factory_that_raises_is_named(h100_file, capsys, tmp_path, monkeypatch):
    (tmp_path / "broken_factory.py").write_text("def make(batch):\n    raise RuntimeError('no GPU here')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    code = main(["estimate", "--model", "broken_factory:make", "--no-packs", "--device-file", str(h100_file)])
    assert code == 2
    assert "model factory 'broken_factory:make' raised RuntimeError: no GPU here" in capsys.readouterr().err
