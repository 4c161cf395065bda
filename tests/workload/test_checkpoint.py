"""A checkpoint's own quantization (config.json's quantization_config, or ModelOpt's hf_quant_config.json beside
it) is priced with no flags; a flag against it, or a method castcore does not price, is one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import castcore
from castcore.cli.main import main
from castcore.sweeps.plan import plan
from castcore.workload.spec import ModelError

DATA = Path(__file__).parents[1] / "data"
H100 = str(DATA / "h100-sxm.toml")
BLOCK = {
    "quant_method": "fp8",
    "fmt": "e4m3",
    "activation_scheme": "dynamic",
    "weight_block_size": [128, 128],
}


def _compressed(weights: dict, activations: dict | None = None, **fields) -> dict:
    """A compressed-tensors quantization_config with one group over every Linear, as llm-compressor writes it."""
    group = {"targets": ["Linear"], "weights": weights, "input_activations": activations}
    return {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "config_groups": {"group_0": group},
        **fields,
    }


INT4_GROUP_32 = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 32}
INT8_CHANNEL = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel"}
INT8_PER_TOKEN = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token", "dynamic": True}
FP8_CHANNEL = {"num_bits": 8, "type": "float", "strategy": "channel"}
FP8_PER_TOKEN = {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True}


def _config(tmp_path: Path, quantization: dict | None = None, name: str = "config.json") -> str:
    fields = json.loads((DATA / "tiny-llama.json").read_text())
    if quantization is not None:
        fields["quantization_config"] = quantization
    folder = tmp_path / name.removesuffix(".json")
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(fields))
    return str(folder / "config.json")


@pytest.mark.parametrize(
    "quantization, options",
    [
        (BLOCK, {"weights": "fp8-block", "activations": None}),
        ({"quant_method": "fp8", "activation_scheme": "dynamic"}, {"weights": "fp8", "activations": "fp8"}),
        ({"quant_method": "gptq", "bits": 4, "group_size": 128}, {"weights": "int4", "activations": None}),
        ({"quant_method": "awq", "bits": 8}, {"weights": "int8", "activations": None}),
        ({"quant_method": "mxfp4"}, {"weights": "mxfp4", "activations": None}),
        ({"quant_method": "modelopt", "quant_algo": "W4A8_AWQ"}, {"weights": "int4", "activations": "fp8"}),
        (_compressed(INT4_GROUP_32), {"weights": "int4", "activations": None}),
        (_compressed(INT8_CHANNEL, INT8_PER_TOKEN), {"weights": "int8", "activations": "int8"}),
        (_compressed(FP8_CHANNEL, FP8_PER_TOKEN), {"weights": "fp8", "activations": "fp8"}),
        (_compressed(INT4_GROUP_32, FP8_PER_TOKEN), {"weights": "int4", "activations": "fp8"}),
        (
            _compressed({"num_bits": 8, "type": "float", "strategy": "block", "block_structure": [128, 128]}),
            {"weights": "fp8-block", "activations": None},
        ),
    ],
)
def test_a_quantized_checkpoint_is_priced_as_it_ships(tmp_path, session, quantization, options):
    model = _config(tmp_path, quantization)
    work = castcore.build_workload(model, seq=16)
    assert {name: getattr(work, name) for name in options} == options
    report = session.estimate(work)
    assert report.workload["weights"] == options["weights"]
    assert any(note.startswith(f"--weights {options['weights']}") for note in report.notes)
    # Saying the same again changes nothing.
    assert castcore.build_workload(model, seq=16, weights=options["weights"]) == work


def test_compressed_tensors_leaves_its_ignore_list_unquantized_and_reads_its_kv_cache_scheme(
    tmp_path, session
):
    """Kimi K2 Thinking's way: int4 weights on every Linear but attention (a re: expression) and the LM head (a
    name); the attention's projections in each of tiny-llama's two layers (deployed: the merged q/k/v and o) stay
    bf16."""
    quantization = _compressed(
        INT4_GROUP_32,
        ignore=["lm_head", "re:.*self_attn.*"],
        kv_cache_scheme={"num_bits": 8, "type": "float"},
    )
    work = castcore.build_workload(_config(tmp_path, quantization), seq=16)
    assert (work.weights, work.activations, work.kv_cache) == ("int4", None, "fp8")
    everything = castcore.build_workload(_config(tmp_path, _compressed(INT4_GROUP_32), name="all"), seq=16)
    ignored, whole = session.estimate(work), session.estimate(everything)
    assert any(
        "4 more linear layers stay bfloat16, as the checkpoint leaves them unquantized" in n
        for n in ignored.notes
    )
    assert not any("more linear layers stay" in n for n in whole.notes)
    assert ignored.memory.weight_bytes > whole.memory.weight_bytes


def test_int4_keeps_the_checkpoints_group_of_columns_per_scale(tmp_path, session):
    """A scale per 32 columns (Kimi K2 Thinking's) against one per 128 (GPTQ's usual): each of tiny-llama's
    linear layers [out, in] holds out * ceil(in / group) bf16 scales of 2 bytes, the weights the same."""
    by_group = {}
    for size in (32, 128):
        weights = {**INT4_GROUP_32, "group_size": size}
        report = session.estimate(
            castcore.build_workload(_config(tmp_path, _compressed(weights), name=f"g{size}"))
        )
        assert any(f"with a scale per {size} input columns" in n for n in report.notes)
        by_group[size] = report.memory.weight_bytes
    layer = [(64, 64), (32, 64), (32, 64), (64, 64), (160, 64), (160, 64), (64, 160)]  # q k v o gate up down
    scales = {
        g: 2 * sum(out * -(-columns // g) for out, columns in layer) for g in (32, 128)
    }  # bytes a layer
    assert by_group[32] - by_group[128] == 2 * (scales[32] - scales[128]) == 2816
    gptq = castcore.build_workload(
        _config(tmp_path, {"quant_method": "gptq", "bits": 4, "group_size": 64}, "gptq")
    )
    assert any("with a scale per 64 input columns" in n for n in session.estimate(gptq).notes)


def test_the_kimi_k2_thinking_preset_ships_int4_routed_experts_only():
    """As Moonshot ships it (W4A16): routed experts int4 in groups of 32; attention, the shared expert, the dense
    first layer's MLP and the LM head bf16."""
    from castcore.workload.checkpoint import listed, unquantized, weight_group
    from castcore.workload.spec import load_model_config

    work = castcore.build_workload("kimi-k2-thinking")
    assert (work.weights, work.activations, work.kv_cache) == ("int4", None, None)
    config = load_model_config("kimi-k2-thinking")
    assert weight_group("kimi-k2-thinking", config) == 32
    left = unquantized("kimi-k2-thinking", config)
    for kept in (
        "model.layers.5.self_attn.kv_b_proj",
        "model.layers.5.mlp.shared_experts.down_proj",
        "lm_head",
    ):
        assert listed(kept, left), kept
    for stored in ("model.layers.0.mlp.gate_up_proj", "model.layers.0.mlp.down_proj"):
        assert listed(stored, left), stored
    assert not listed("model.layers.5.mlp.experts", left)


def test_msmodelslims_description_beside_the_config_says_w8a8_and_which_layers_stay_float(tmp_path, session):
    """An Ascend checkpoint as msModelSlim writes it (vllm-ascend and MindIE read the same file): W8A8_DYNAMIC,
    every tensor named; the weights it stores FLOAT (here layer 0's query projection, the norms, the LM head) stay
    in the model dtype."""
    model = _config(tmp_path)
    described = {"version": "1.0.0", "model_quant_type": "W8A8_DYNAMIC"}
    for layer in range(2):
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            described[f"model.layers.{layer}.self_attn.{name}.weight"] = "W8A8_DYNAMIC"
        for name in ("gate_proj", "up_proj", "down_proj"):
            described[f"model.layers.{layer}.mlp.{name}.weight"] = "W8A8_DYNAMIC"
            described[f"model.layers.{layer}.mlp.{name}.weight_scale"] = "W8A8_DYNAMIC"
        described[f"model.layers.{layer}.input_layernorm.weight"] = "FLOAT"
    described["model.layers.0.self_attn.q_proj.weight"] = "FLOAT"
    described["lm_head.weight"] = "FLOAT"
    Path(model).with_name("quant_model_description.json").write_text(json.dumps(described))
    work = castcore.build_workload(model, seq=16)
    assert (work.weights, work.activations) == ("int8", "int8")
    note = next(n for n in session.estimate(work).notes if n.startswith("--weights int8 --activations int8"))
    assert "1 more linear layers stay bfloat16, as the checkpoint leaves them unquantized" in note
    described["model_quant_type"] = "W4A8_DYNAMIC"
    Path(model).with_name("quant_model_description.json").write_text(json.dumps(described))
    with pytest.raises(
        ModelError,
        match=r"model_quant_type 'W4A8_DYNAMIC' is not one castcore prices; castcore "
        r"prices W8A8_DYNAMIC, W8A8",
    ):
        castcore.build_workload(model, seq=16)


def test_modelopts_file_beside_the_config_says_fp8_weights_activations_and_cache(tmp_path):
    model = _config(tmp_path)
    Path(model).with_name("hf_quant_config.json").write_text(
        json.dumps(
            {
                "producer": {"name": "modelopt"},
                "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"},
            }
        )
    )
    work = castcore.build_workload(model)
    assert (work.weights, work.activations, work.kv_cache) == ("fp8", "fp8", "fp8")


@pytest.mark.parametrize(
    "quantization, argv, said",
    [
        (
            BLOCK,
            ["--weights", "int8"],
            "--weights int8 contradicts {model}'s own quantization (its quantization_config: "
            "--weights fp8-block); drop --weights to price the checkpoint as it ships",
        ),
        (
            {"quant_method": "bitsandbytes"},
            [],
            "{model}: its quantization_config's quant_method 'bitsandbytes' is not "
            "one castcore prices; castcore prices fp8",
        ),
        (
            {"quant_method": "fp8", "weight_block_size": [64, 64]},
            [],
            "weight_block_size [64, 64] is not one castcore prices",
        ),
        (
            {"quant_method": "gptq", "bits": 3},
            [],
            "gptq with 3 bits is not one castcore prices (4 or 8 bits)",
        ),
        (
            _compressed(INT4_GROUP_32, INT8_PER_TOKEN),
            [],
            "config group 'group_0' stores 4-bit int weights with 8-bit int activations, not a scheme castcore prices",
        ),
        (
            {
                **_compressed(INT4_GROUP_32),
                "config_groups": {"a": {"targets": ["re:.*experts.*"], "weights": INT4_GROUP_32}},
            },
            [],
            "config group 'a' targets ['re:.*experts.*']; castcore prices groups that target [\"Linear\"]",
        ),
        (
            {
                **_compressed(INT4_GROUP_32),
                "config_groups": {
                    "a": {"targets": ["Linear"], "weights": INT4_GROUP_32},
                    "b": {"targets": ["Linear"], "weights": INT8_CHANNEL},
                },
            },
            [],
            "its compressed-tensors config_groups quantize with 2 different schemes",
        ),
        (
            _compressed(INT8_CHANNEL, INT8_PER_TOKEN),
            ["--activations", "fp8"],
            "--activations fp8 contradicts {model}'s own quantization (its quantization_config: --weights int8, "
            "--activations int8)",
        ),
    ],
)
def test_a_flag_against_the_checkpoint_or_an_unpriced_method_is_one_line(
    tmp_path, capsys, quantization, argv, said
):
    model = _config(tmp_path, quantization)
    assert main(["estimate", "--model", model, "--no-packs", "--device-file", H100, *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and said.format(model=model) in err[0], err


def test_the_deepseek_preset_ships_fp8_in_blocks():
    assert castcore.build_workload("deepseek-v3").weights == "fp8-block"
    with pytest.raises(ModelError, match=r"weights='bf16' contradicts deepseek-v3's own quantization"):
        castcore.build_workload("deepseek-v3", weights="bf16")


def test_plan_searches_a_quantized_checkpoint_in_its_own_quantization(tmp_path):
    model = _config(tmp_path, BLOCK)
    result = plan(
        model,
        input_tokens=64,
        output_tokens=8,
        devices=["h100-sxm"],
        max_devices=2,
        plugins=castcore.PluginOptions(device_file=[H100], no_packs=True),
        workers=1,
    )
    assert result.rows and {row["weights"] for row in result.rows} == {"fp8-block"}
