"""Model sources: shipped presets, config.json files of other architectures, factories, phases, training, MoE."""

from __future__ import annotations

import pytest
import torch

from castcore.report.memory import kv_cache_bytes
from castcore.workload.models import build_preset
from castcore.hf.versions import older_than_tested
from castcore.workload.spec import ModelError, build_workload, load_model_config, preset_names
from castcore.deploy.pipeline import build

PRESET_PARAMS = {  # published parameter counts (billions), and half the last digit they are published to
    "llama-3-8b": (8.0, 0.05),
    "llama-3-70b": (70.6, 0.05),
    "qwen2.5-7b": (7.6, 0.05),
    "mistral-7b": (7.2, 0.05),
    "mixtral-8x7b": (46.7, 0.05),
    "mixtral-8x22b": (141, 0.5),
    "llama-3.1-8b": (8.0, 0.05),  # "8B" (8.03 on the hub)
    "llama-3.1-70b": (70.6, 0.05),
    "llama-3.1-405b": (405, 1),  # "405B" (406 on the hub)
    "llama-3.3-70b": (70.6, 0.05),
    "qwen3-8b": (8.2, 0.05),  # the model card's "Number of Parameters: 8.2B"
    "qwen3-32b": (32.8, 0.05),  # "32.8B"
    "qwen3-30b-a3b": (30.5, 0.05),
    "qwen3-235b-a22b": (235, 0.5),
    "deepseek-v3": (
        671,
        0.5,
    ),  # without its multi-token-prediction module, which serving does not run by default
    "kimi-k2": (1000, 50),  # "1 trillion total parameters"
    "kimi-k2-thinking": (1000, 50),  # "Total Parameters 1T"
    "deepseek-v3.1": (671, 0.5),  # the model card's "671B", as deepseek-v3 without its MTP module
    "deepseek-v3.2": (671, 1),  # config_671B_v3.2.json: V3's 671B; castcore's 671.9B adds the indexers' 0.85B
    "glm-4.5-air": (
        106,
        1,
    ),  # "106B-A12B" (zai-org's README): castcore builds 106.85B, the figure rounded down
    "glm-4.6": (355, 3),  # "355B-A32B", a round figure: castcore builds 352.8B, without the MTP layer's ~4B
    "qwen3-next-80b-a3b": (80, 0.5),  # "80B total parameters, only 3B active" (transformers' qwen3_next page)
    # "This model has 56B model parameters." (nvidia/Nemotron-H-56B-Base-8K's model card): castcore builds 56.32B
    "nemotron-h-56b": (56, 0.5),
    # "48B" total (MoonshotAI/Kimi-Linear's README): castcore builds 49.12B, 48.37B without the untied embedding
    # and LM head (0.38B each), so the published figure leaves those out
    "kimi-linear-48b-a3b": (48, 1.2),
    "gpt-oss-20b": (20.9, 0.05),
    "gpt-oss-120b": (116.8, 0.05),  # the model card's totals
    "llama-4-scout": (
        109,
        1.5,
    ),  # "109B total" counts its vision tower, which the preset (the language model) leaves out
}


def test_presets_are_the_published_models():
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    assert set(preset_names()) == set(PRESET_PARAMS)
    for name, (billions, within) in PRESET_PARAMS.items():
        if (
            load_model_config(name)["model_type"] not in CONFIG_MAPPING
        ):  # newer than the installed transformers
            with pytest.raises(
                ModelError, match=r"a newer transformers may know it: pip install -U transformers"
            ):
                build(build_workload(name, seq=8))
            continue
        try:
            model = build(build_workload(name, seq=8)).model
        except (
            ModelError
        ) as exc:  # an older transformers knows the type but not every field (nemotron-h's "-")
            assert older_than_tested("transformers") and str(exc).endswith(
                "a newer transformers may read it: pip install -U transformers)"
            ), exc
            continue
        count = sum(p.numel() for p in model.parameters())
        assert count / 1e9 == pytest.approx(billions, abs=within), name
        assert load_model_config(name)["_source"].startswith(
            (
                "ai-dynamo/aiconfigurator",
                "meta-llama/",
                "mistralai/",
                "Qwen/",
                "openai/",
                "zai-org/",
                "moonshotai/",
            )
        ), name
        assert {p.device.type for p in model.parameters()} == {"meta"}


@pytest.mark.parametrize(
    "name, llama_3",
    [("llama-3.1-8b", "llama-3-8b"), ("llama-3.1-70b", "llama-3-70b"), ("llama-3.3-70b", "llama-3-70b")],
)
def test_llama_3_1_and_3_3_are_llama_3_shapes_with_a_128k_context(name, llama_3):
    config, shapes = load_model_config(name), load_model_config(llama_3)
    assert {k: v for k, v in config.items() if k in shapes and k != "_source"} == {
        **{k: v for k, v in shapes.items() if k != "_source"},
        "max_position_embeddings": 131072,
    }
    rotary = build(build_workload(name, seq=8)).model.model.rotary_emb  # transformers' own, from the config
    assert rotary.rope_type == "llama3" and rotary.max_seq_len_cached == 131072
    assert config["rope_scaling"] == {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    }


def test_qwen3_dense_presets_norm_their_queries_and_keys():
    for name in ("qwen3-8b", "qwen3-32b"):
        attention = build(build_workload(name, seq=8)).model.model.layers[0].self_attn
        assert attention.q_norm.weight.shape == attention.k_norm.weight.shape == (128,), name
        assert load_model_config(name)["max_position_embeddings"] == 40960


def test_decode_reads_the_whole_cache_and_writes_one_token(session, tiny_llama):
    kv_len = 96
    report = session.estimate(build_workload(str(tiny_llama), batch=2, phase="decode", kv_len=kv_len))
    attention = [r for r in report.records if r.invoke.name == "castcore::attention"]
    assert len(attention) == 2
    q, k, _ = attention[0].invoke.args[:3]
    assert q.shape[0] == 2 and q.shape[2] == 1  # one new token per sequence
    assert k.shape[2] == kv_len + 1  # the cached tokens and the new one
    # K and V of each layer written in place, by one kernel (deployed) or two (eager)
    writes = [r for r in report.records if r.invoke.name == "castcore::kv_cache_write"]
    assert len(writes) == 2
    _, _, position, key, value = writes[0].invoke.args[:5]
    assert key.shape[2] == value.shape[2] == 1  # the new token's
    assert writes[0].bytes == position.nbytes + 2 * (key.nbytes + value.nbytes)
    eager = session.estimate(
        build_workload(str(tiny_llama), batch=2, phase="decode", kv_len=kv_len, fuse=False)
    )
    assert len([r for r in eager.records if r.invoke.name == "aten::index_copy_"]) == 4
    cfg = load_model_config(str(tiny_llama))
    assert report.memory.kv_cache_bytes >= kv_cache_bytes(cfg, 2, kv_len + 1, torch.bfloat16)


def test_training_step_records_the_backward(session, tiny_llama):
    # Training computes logits at every position: compare with a forward that does too.
    every = build_preset(
        str(tiny_llama),
        batch=1,
        seq=16,
        dtype="bf16",
        phase="prefill",
        kv_len=16,
        train=False,
        all_logits=True,
    )
    forward = session.estimate(every.model, kwargs=every.kwargs)
    train = session.estimate(build_workload(str(tiny_llama), seq=16, train=True))
    mm_forward = sum(r.flops for r in forward.records if r.invoke.name == "aten::mm")
    mm_train = sum(r.flops for r in train.records if r.invoke.name == "aten::mm")
    # Backward of each matmul is two matmuls of the same size (input and weight gradients).
    assert mm_train == pytest.approx(3 * mm_forward, rel=0.02)


def test_mixture_of_experts_captures_with_balanced_routing(session):
    report = session.estimate(build_workload("tests/data/tiny-mixtral.json", seq=16))
    grouped = [r for r in report.records if r.invoke.name == "aten::_grouped_mm"]
    assert len(grouped) == 4  # up and down projection per layer
    tokens, top_k, hidden, inter = 16, 2, 64, 96
    # Every token goes to top_k experts: S = tokens * top_k rows, however they are routed.
    up = 2 * tokens * top_k * hidden * 2 * inter
    down = 2 * tokens * top_k * inter * hidden
    assert sum(r.flops for r in grouped) == pytest.approx(2 * (up + down))


def test_factory_model_with_example_inputs(session):
    report = session.estimate(build_workload("tests.factories.tiny_mlp:make", batch=4, dtype="fp32"))
    assert report.flops >= 2 * 4 * (32 * 64 + 64 * 8)
    assert [r.invoke.module for r in report.records if r.invoke.name == "aten::addmm"] == [
        "Sequential.0",
        "Sequential.2",
    ]


@pytest.mark.parametrize(
    "spec, message",
    [
        ("tests.factories.tiny_mlp:not_a_model", "returned int"),
        ("tests.factories.nowhere:make", "cannot load model factory"),
        ("no-such-preset", "unknown model 'no-such-preset'"),
        ("missing.json", "missing.json: no such model config"),
    ],
)
def test_bad_model_specs_say_what_is_accepted(spec, message):
    with pytest.raises(ModelError, match=message):
        build(build_workload(spec))


def test_decode_and_train_do_not_mix():
    with pytest.raises(ModelError, match="train=True goes with phase='prefill'"):
        build(build_workload("llama-3-8b", phase="decode", train=True))


def test_factory_module_in_the_working_directory_is_found(tmp_path, monkeypatch):
    (tmp_path / "castcore_test_cwd_models.py").write_text(
        "import torch\n"
        "def make(batch=1):\n"
        "    return torch.nn.Linear(4, 4), (torch.empty(batch, 4, device='meta'),)\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.path", [p for p in __import__("sys").path if p not in ("", str(tmp_path))])
    workload = build(build_workload("castcore_test_cwd_models:make", batch=3))
    assert workload.args[0].shape == (3, 4)


def test_softcapped_attention_matches_transformers_eager_attention():
    from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward

    from castcore.hf.attention import castcore_attention as _attention

    torch.manual_seed(0)
    module = torch.nn.Module()
    module.num_key_value_groups, module.head_dim, module.training, module.is_causal = 2, 16, False, True
    q, k, v = torch.randn(1, 4, 6, 16), torch.randn(1, 2, 6, 16), torch.randn(1, 2, 6, 16)
    # castcore's mask function hands over no mask for a plain causal prefill; transformers' eager
    # attention needs the causal mask spelled out.
    causal = torch.full((6, 6), float("-inf")).triu(1)
    ours, _ = _attention(module, q, k, v, None, scaling=0.25, softcap=20.0)
    theirs, _ = eager_attention_forward(module, q, k, v, causal, scaling=0.25, softcap=20.0)
    torch.testing.assert_close(ours, theirs)
    window = torch.ones(6, 6, dtype=torch.bool).tril().triu(-2)  # a boolean sliding-window mask
    ours, _ = _attention(module, q, k, v, window, scaling=0.25, softcap=20.0)
    theirs, _ = eager_attention_forward(
        module, q, k, v, torch.zeros(6, 6).masked_fill(~window, float("-inf")), scaling=0.25, softcap=20.0
    )
    torch.testing.assert_close(ours, theirs)


def test_gemma2_counts_its_softcapped_attention_in_full(session):
    workload = build(build_workload("tests/data/tiny-gemma2.json", seq=12))
    report = session.estimate(workload.model, kwargs=workload.kwargs)
    scores = [
        r for r in report.records if r.invoke.name == "aten::bmm" and r.invoke.module.endswith("self_attn")
    ]
    # Per layer: QK^T and PV over every query-key pair, 4 heads of 16 over 12 tokens (eager attention
    # computes the masked half too).
    assert len(scores) == 4
    assert sum(r.flops for r in scores) == 2 * 2 * (2 * 4 * 12 * 12 * 16)
    tanh_shapes = {r.invoke.args[0].shape for r in report.records if r.invoke.name == "aten::tanh"}
    assert (1, 4, 12, 12) in tanh_shapes and (1, 1, 256) in tanh_shapes  # attention and last-token logit caps


def test_a_model_without_the_attention_interface_runs_with_a_note(session):
    workload = build(build_workload("tests/data/tiny-falcon.json", seq=8))
    assert (
        len(workload.notes) == 1 and "FalconForCausalLM" in workload.notes[0] and "sdpa" in workload.notes[0]
    )
    report = session.estimate(workload.model, kwargs=workload.kwargs)
    assert report.flops > 0 and report.time_s > 0


def test_a_factory_may_return_a_workload(session):
    plain = session.estimate(build_workload("tests.factories.tiny_mlp:make", batch=4, dtype="fp32"))
    as_workload = session.estimate(build_workload("tests.factories.tiny_mlp:make_workload", batch=4))
    assert as_workload.totals() == plain.totals()
