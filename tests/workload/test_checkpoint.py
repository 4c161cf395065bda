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
