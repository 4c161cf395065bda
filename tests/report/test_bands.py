"""Error bands: a profile's held-out error per kernel family, carried to each op row of an estimate's JSON and CSV."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import castcore
from castcore.cli.main import main
from castcore.devices.profile import DeviceError

DATA = Path(__file__).parents[1] / "data"
BANDS = "\n[error_bands]\nattention_prefill = 0.2\nattention_decode = 0.15\ngemm_bf16 = 0.09\n"
SOURCE = '"error_bands" = "test value: a fidelity report\'s held-out medians"\n'


def _profile(tmp_path: Path, bands: str = BANDS, source: str = SOURCE) -> Path:
    text = (DATA / "h100-sxm.toml").read_text(encoding="utf-8")
    text = text.replace('name = "h100-sxm"', 'name = "banded"', 1)
    text = text.replace("\n[sources]\n", bands + "\n[sources]\n" + source)
    path = tmp_path / "banded.toml"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize(
    "phase, attention", [({}, "attention_prefill"), ({"phase": "decode", "kv_len": 32}, "attention_decode")]
)
def test_each_op_row_carries_its_familys_band(tmp_path, phase, attention):
    session = castcore.Session(load_packs=[], device_files=[_profile(tmp_path)])
    workload = castcore.build_workload(str(DATA / "tiny-llama.json"), seq=16, **phase)
    report = session.estimate(workload, device="banded")
    rows = {row["op"]: row["error_band"] for row in report.to_dict()["ops"]}
    band = 0.2 if attention == "attention_prefill" else 0.15
    assert rows["castcore::attention"] == {"family": attention, "held_out_median_abs_error": band}
    assert rows["aten::mm"] == {"family": "gemm_bf16", "held_out_median_abs_error": 0.09}
    assert rows["castcore::rms_norm"] is None  # its family has no band in this profile


def test_memory_bound_kernels_and_library_collectives_have_their_families(tmp_path):
    bands = "\n[error_bands]\nmemory_bound = 0.12\ncollective = 0.3\ngemm_bf16 = 0.09\n"
    session = castcore.Session(load_packs=[], device_files=[_profile(tmp_path, bands)])
    workload = castcore.build_workload(str(DATA / "tiny-llama.json"), seq=16, tp=2)
    rows = {
        row["op"]: row["error_band"] for row in session.estimate(workload, device="banded").to_dict()["ops"]
    }
    memory = {"family": "memory_bound", "held_out_median_abs_error": 0.12}
    assert rows["castcore::rms_norm"] == rows["castcore::silu_and_mul"] == memory
    assert rows["castcore::rotary_embedding"] == memory
    # without castpack-collectives the core prices the all_reduce: the library's own, not an engine kernel
    assert rows["_c10d_functional::all_reduce"] == {"family": "collective", "held_out_median_abs_error": 0.3}
    assert rows["castcore::attention"] is None  # attention_prefill: none given


def test_the_cli_prints_bands_in_json_and_csv(tmp_path, capsys):
    argv = [
        "estimate",
        "--model",
        str(DATA / "tiny-llama.json"),
        "--seq",
        "16",
        "--no-packs",
        "--device-file",
        str(_profile(tmp_path)),
        "--device",
        "banded",
    ]
    assert main([*argv, "--json"]) == 0
    ops = {row["op"]: row for row in json.loads(capsys.readouterr().out)["ops"]}
    assert ops["aten::mm"]["error_band"]["held_out_median_abs_error"] == 0.09
    assert main([*argv, "--csv"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith(",error_band,experts_run")  # experts_run: empty but for grouped products
    assert next(line for line in lines if line.startswith("aten::mm,")).endswith(",0.09,")


def test_block_scaled_products_and_experts_have_their_own_families(tmp_path):
    import torch

    bands = "\n[error_bands]\ngemm_fp8 = 0.2\ngemm_fp8_block = 0.15\nmoe = 0.12\n"
    session = castcore.Session(load_packs=[], device_files=[_profile(tmp_path, bands)])
    fp8 = torch.float8_e4m3fn
    x, w = torch.empty(64, 256, dtype=fp8), torch.empty(512, 256, dtype=fp8)

    def product(x, w, scale_a, scale_b):
        return torch._scaled_mm(x, w.t(), scale_a, scale_b, out_dtype=torch.bfloat16)

    def band(report):
        (row,) = [row for row in report.to_dict()["ops"] if row["op"] == "aten::_scaled_mm"]
        return row["error_band"]

    # Per token and channel: one scale a row; block-scaled: one per 128 columns of a row, one per 128 x 128 block.
    per_token = session.estimate(product, x, w, torch.empty(64, 1), torch.empty(1, 512), device="banded")
    blocks = session.estimate(product, x, w, torch.empty(64, 2), torch.empty(4, 2).t(), device="banded")
    assert band(per_token) == {"family": "gemm_fp8", "held_out_median_abs_error": 0.2}
    assert band(blocks) == {"family": "gemm_fp8_block", "held_out_median_abs_error": 0.15}
    experts = session.estimate(
        castcore.build_workload(str(DATA / "tiny-mixtral.json"), seq=16), device="banded"
    )
    rows = {row["op"]: row["error_band"] for row in experts.to_dict()["ops"]}
    assert rows["aten::_grouped_mm"] == {"family": "moe", "held_out_median_abs_error": 0.12}


def test_a_profile_without_bands_gives_none(session, tiny_llama):
    report = session.estimate(castcore.build_workload(str(tiny_llama), seq=16))
    assert all(row["error_band"] is None for row in report.to_dict()["ops"])


@pytest.mark.parametrize(
    "bands, source, message",
    [
        (
            "\n[error_bands]\nsoftmax = 0.1\n",
            SOURCE,
            "'error_bands' must be a table of family = held-out median",
        ),
        (BANDS, "", "no source for error_bands.attention_prefill"),
        ("\n[error_bands]\ngemm_bf16 = -0.1\n", SOURCE, "'error_bands.gemm_bf16' = -0.1"),
    ],
)
def test_bad_bands_name_the_field(tmp_path, bands, source, message):
    with pytest.raises(DeviceError, match=message.replace("(", r"\(").replace(".", r"\.")):
        castcore.load_device_file(_profile(tmp_path, bands, source))
