"""4-bit floating-point weights (--weights nvfp4, mxfp4) and W4A8 (--weights int4 --activations fp8) on real
captures of tiny Hugging Face models: the ops they run, the rate each product is priced at on the H100 test profile
and castpack-nvidia's B200 profile, the bytes of packed weights and their scales, gpt-oss's and ModelOpt's
checkpoints as shipped, the refusals; and the reference kernels' numerics on real tensors (models themselves are
only captured on fake tensors: their quantized weights hold no values)."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import castcore
from castcore.builtin import quantized_ops
from castcore.builtin.formulas.quantized import DEQUANTIZE
from castcore.cli.main import main
from castcore.workload.spec import ModelError

DATA = Path(__file__).parents[1] / "data"
B200_FILE = Path(__file__).parents[2] / "packs/castpack-nvidia/castpack_nvidia/profiles/b200.toml"
LLAMA, MIXTRAL, GPT_OSS = DATA / "tiny-llama.json", DATA / "tiny-mixtral.json", DATA / "tiny-gpt-oss.json"
CONFIG = json.loads(LLAMA.read_text())  # hidden 64, ffn 160, 2 layers, 4 heads, 2 KV heads of 16
LAYERS, SEQ = CONFIG["num_hidden_layers"], 16
H, I, KV = CONFIG["hidden_size"], CONFIG["intermediate_size"], 32
ELEMENTS = LAYERS * (H * H + 2 * KV * H + H * H + 2 * I * H + H * I)  # q, k, v, o, gate/up, down
LINEARS = LAYERS * 4  # the merged q/k/v, o, the merged gate/up, down
FP4, FP8 = torch.float4_e2m1fn_x2, torch.float8_e4m3fn
ops = torch.ops.castcore


@pytest.fixture(scope="module")
def b200() -> castcore.DeviceProfile:
    return castcore.load_device_file(B200_FILE)  # mma_flops.float4_e2m1fn_x2 = 9.0e15, its source in the file


def _estimate(session, device=None, model=LLAMA, **options) -> castcore.Report:
    return session.estimate(castcore.build_workload(str(model), seq=SEQ, **options), device=device)


def _records(report: castcore.Report, name: str) -> list:
    return [r for r in report.records if r.invoke.name == name]


def _mma(report: castcore.Report, name: str | None = None) -> dict[torch.dtype, float]:
    found: dict[torch.dtype, float] = defaultdict(float)
    for record in report.records:
        if record.properties and (name is None or record.invoke.name == name):
            for dtype, counted in record.properties.compute_ops.items():
                found[dtype] += counted.mma_ops
    return {dtype: n for dtype, n in found.items() if n}


def _faster(profile: castcore.DeviceProfile, rate: str) -> castcore.DeviceProfile:
    """The profile with its ``rate`` doubled (and another name: estimates are cached by name)."""
    return replace(
        profile,
        name=f"{profile.name}-{rate}-x2",
        mma_flops={**profile.mma_flops, rate: 2 * profile.mma_flops[rate]},
    )


def test_nvfp4_runs_w4a4_products_at_the_fp4_rate(session, b200):
    base = _estimate(session, b200)
    report = _estimate(session, b200, weights="nvfp4")
    products, quantized = (
        _records(report, "castcore::block_scaled_mm"),
        _records(report, "castcore::quantize_blocks"),
    )
    assert len(products) == len(quantized) == LINEARS
    for product in products:  # NVFP4 activations [16, in / 2] with e4m3 scales per 16, by NVFP4 weights
        a, b, scale_a, scale_b = product.invoke.args[:4]
        assert a.dtype == b.dtype == FP4 and scale_a.dtype == scale_b.dtype == FP8
        assert scale_a.shape == (SEQ, 2 * a.shape[1] // 16) and scale_b.shape == (
            b.shape[0],
            2 * b.shape[1] // 16,
        )
        assert product.estimate.detail["rates"][f"mma:{FP4}"] == "float4_e2m1fn_x2"
    mma = _mma(report)
    assert mma[FP4] == 2 * SEQ * ELEMENTS  # K counts fp4 values, two per stored element
    assert mma[FP4] + mma[torch.bfloat16] == _mma(base)[torch.bfloat16]  # attention and the LM head stay bf16
    # Half a byte a weight, an e4m3 scale per 16, and two fp32 per-tensor scales (input_scale, alpha) per layer.
    assert (
        report.memory.weight_bytes
        == base.memory.weight_bytes - 2 * ELEMENTS + ELEMENTS // 2 + ELEMENTS // 16 + 8 * LINEARS
    )
    compute = [
        sum(r.estimate.compute_s for r in _records(rep, "castcore::block_scaled_mm"))
        for rep in (
            report,
            _estimate(session, _faster(b200, "float4_e2m1fn_x2"), weights="nvfp4"),
            _estimate(session, _faster(b200, "float8_e4m3fn"), weights="nvfp4"),
        )
    ]
    assert compute[1] < compute[0] == compute[2]  # the fp4 rate, and no other


def test_nvfp4_on_a_device_without_an_fp4_rate_is_refused_in_one_line(capsys):
    argv = [
        "estimate",
        "--model",
        str(LLAMA),
        "--seq",
        "16",
        "--no-packs",
        "--device-file",
        str(DATA / "h100-sxm.toml"),
    ]
    assert main([*argv, "--weights", "nvfp4"]) == 2
    # past the progress
    err = [line for line in capsys.readouterr().err.strip().splitlines() if "error" in line]
    assert len(err) == 1 and err[0].startswith(
        "castcore: error: --weights nvfp4: h100-sxm has no FP4 matrix rate"
    )
    assert "b200" in err[0] and "--weights fp8" in err[0] and "--weights mxfp4" in err[0]


def test_mxfp4_is_weight_only_without_an_fp4_rate(session):
    base = _estimate(session)
    report = _estimate(session, weights="mxfp4")
    linear = _records(report, "castcore::weight_only_linear")
    assert len(linear) == LINEARS and not _records(report, "castcore::block_scaled_mm")
    assert all(
        r.invoke.args[1].dtype == FP4 and r.invoke.args[2].dtype == torch.float8_e8m0fnu for r in linear
    )
    assert _mma(report) == _mma(base)  # products in bf16, the weights dequantized in registers
    gp = sum(r.properties.compute_ops[torch.bfloat16].gp_ops for r in linear)
    assert gp >= DEQUANTIZE * ELEMENTS
    assert (
        report.memory.weight_bytes == base.memory.weight_bytes - 2 * ELEMENTS + ELEMENTS // 2 + ELEMENTS // 32
    )
    assert any("W4A16: the device has no FP4 matrix rate" in note for note in report.notes)


def test_mxfp4_with_an_fp4_rate_is_mxfp8_by_mxfp4_at_the_fp8_rate(session, b200):
    report = _estimate(session, b200, weights="mxfp4")
    products = _records(report, "castcore::block_scaled_mm")
    assert len(products) == LINEARS and not _records(report, "castcore::weight_only_linear")
    for product in products:
        a, b, scale_a, scale_b = product.invoke.args[:4]
        assert (a.dtype, b.dtype, scale_a.dtype, scale_b.dtype) == (
            FP8,
            FP4,
            torch.float8_e8m0fnu,
            torch.float8_e8m0fnu,
        )
        assert product.estimate.detail["rates"][f"mma:{FP8}"] == "float8_e4m3fn"
    assert _mma(report, "castcore::block_scaled_mm") == {FP8: 2 * SEQ * ELEMENTS}


def test_mxfp4_with_mxfp4_activations_is_w4a4_at_the_fp4_rate(session, b200):
    """AMD's Quark MXFP4 checkpoints (vLLM's QuarkW4A4MXFP4 on MI355X): activations quantized per 32 columns to
    fp4 with e8m0 scales, the product at the FP4 rate; refused where the device has none, naming the rate."""
    report = _estimate(session, b200, weights="mxfp4", activations="mxfp4")
    products = _records(report, "castcore::block_scaled_mm")
    assert len(products) == len(_records(report, "castcore::quantize_blocks")) == LINEARS
    for product in products:
        a, b, scale_a, scale_b = product.invoke.args[:4]
        assert (a.dtype, b.dtype, scale_a.dtype, scale_b.dtype) == (FP4, FP4, *(torch.float8_e8m0fnu,) * 2)
        assert scale_a.shape[-1] == a.shape[-1] * 2 // 32  # one scale per 32 columns (two codes a byte)
        assert product.estimate.detail["rates"][f"mma:{FP4}"] == "float4_e2m1fn_x2"
    assert _mma(report, "castcore::block_scaled_mm") == {FP4: 2 * SEQ * ELEMENTS}
    assert any(n.startswith("--weights mxfp4 --activations mxfp4: 8 linear layers") for n in report.notes)
    w4a8 = _estimate(session, b200, weights="mxfp4")
    assert report.memory.weight_bytes == w4a8.memory.weight_bytes  # the same weights, other activations
    with pytest.raises(ModelError, match=r"activations='mxfp4'.*no float4_e2m1fn_x2 matrix rate"):
        _estimate(session, weights="mxfp4", activations="mxfp4")  # the H100 test profile
    with pytest.raises(ModelError, match=r"add weights='mxfp4' \(W4A4\)"):
        castcore.build_workload(str(LLAMA), weights="int8", activations="mxfp4")


def test_int4_weights_with_fp8_activations_are_w4a8_at_the_fp8_rate(session):
    base = _estimate(session)
    report = _estimate(session, weights="int4", activations="fp8")
    products = _records(report, "castcore::block_scaled_mm")
    assert len(products) == len(_records(report, "castcore::quantize_per_token")) == LINEARS
    assert all(r.invoke.args[0].dtype == FP8 and r.invoke.args[1].dtype == torch.uint8 for r in products)
    assert _mma(report, "castcore::block_scaled_mm") == {FP8: 2 * SEQ * ELEMENTS}
    # The int4 codes are converted to fp8 in registers: the dequantizing work of weight-only int4, per call.
    assert sum(r.properties.compute_ops[torch.bfloat16].gp_ops for r in products) == DEQUANTIZE * ELEMENTS
    int4 = _estimate(session, weights="int4")
    assert report.memory.weight_bytes == int4.memory.weight_bytes < base.memory.weight_bytes
    assert any(n.startswith("--weights int4 --activations fp8: 8 linear layers") for n in report.notes)
    with pytest.raises(
        ModelError, match=r"activations='fp8' multiplies fp8 activations by fp8 weights \(or int4"
    ):
        castcore.build_workload(str(LLAMA), weights="int8", activations="fp8")
    with pytest.raises(ModelError, match=r"^weights='nvfp4' quantizes its activations .*: drop activations$"):
        castcore.build_workload(str(LLAMA), weights="nvfp4", activations="fp8")


@pytest.mark.parametrize("kind, dtype", [("nvfp4", FP4), ("mxfp4", FP8)])
def test_mixture_of_experts_weights_take_the_fp4_formats(session, b200, kind, dtype):
    config = json.loads(MIXTRAL.read_text())
    h, i, experts = config["hidden_size"], config["intermediate_size"], config["num_local_experts"]
    base = _estimate(session, b200, model=MIXTRAL)
    report = _estimate(session, b200, model=MIXTRAL, weights=kind)
    grouped = _records(report, "castcore::block_scaled_grouped_mm")
    assert len(grouped) == 2 * LAYERS and not _records(report, "aten::_grouped_mm")
    assert all(r.invoke.args[1].dtype == FP4 and r.invoke.args[1].shape[0] == experts for r in grouped)
    assert _mma(report, "castcore::block_scaled_grouped_mm") == {
        dtype: _mma(base, "aten::_grouped_mm")[torch.bfloat16]
    }
    block = 16 if kind == "nvfp4" else 32
    expert_elements = LAYERS * experts * 3 * h * i
    packed = [r for r in report.records if r.invoke.name == "castcore::block_scaled_grouped_mm"]
    assert sum(r.invoke.args[1].numel() for r in packed) == expert_elements // 2
    assert sum(r.invoke.args[3].numel() for r in packed) == expert_elements // block


def test_a_linear_layers_memory_is_its_packed_codes_and_scales(session, b200):
    out_features, in_features = 96, 128
    elements = out_features * in_features
    for kind, scale_bytes in (("nvfp4", elements // 16 + 8), ("mxfp4", elements // 32)):  # + nvfp4's 2 fp32
        model = torch.nn.Sequential(torch.nn.Linear(in_features, out_features, bias=False)).to(
            device="meta", dtype=torch.bfloat16
        )
        work = castcore.build_workload(
            model, torch.empty(4, in_features, device="meta", dtype=torch.bfloat16), weights=kind
        )
        report = session.estimate(work, device=b200)
        assert report.memory.weight_bytes == elements // 2 + scale_bytes


def _checkpoint(tmp_path: Path, base: Path, quantization: dict | None = None) -> str:
    fields = json.loads(base.read_text())
    if quantization is not None:
        fields["quantization_config"] = quantization
    (tmp_path / "config.json").write_text(json.dumps(fields))
    return str(tmp_path / "config.json")


def test_gpt_oss_checkpoint_quantizes_its_experts_only(tmp_path, session, b200):
    left = ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]
    model = _checkpoint(tmp_path, GPT_OSS, {"quant_method": "mxfp4", "modules_to_not_convert": left})
    config = json.loads(GPT_OSS.read_text())
    h, i, experts = config["hidden_size"], config["intermediate_size"], config["num_local_experts"]
    work = castcore.build_workload(model, seq=SEQ)
    assert (work.weights, work.activations) == ("mxfp4", None)
    base = _estimate(session, model=GPT_OSS)
    for device, product in (
        (None, "castcore::weight_only_grouped_mm"),
        (b200, "castcore::block_scaled_grouped_mm"),
    ):
        report = session.estimate(work, device=device)
        assert len(_records(report, product)) == 2 * LAYERS
        assert not _records(report, "castcore::weight_only_linear")
        assert not _records(report, "castcore::block_scaled_mm")
        elements = LAYERS * experts * 3 * h * i  # gate/up and down of every expert; attention stays bf16
        assert (
            report.memory.weight_bytes
            == base.memory.weight_bytes - 2 * elements + elements // 2 + elements // 32
        )
        assert any(
            "4 more linear layers stay bfloat16, as the checkpoint leaves them unquantized" in note
            for note in report.notes
        )


@pytest.mark.parametrize(
    "algo, options", [("NVFP4", ("nvfp4", None, "fp8")), ("W4A8_AWQ", ("int4", "fp8", "fp8"))]
)
def test_modelopts_nvfp4_and_w4a8_checkpoints_are_priced_as_shipped(tmp_path, algo, options):
    model = _checkpoint(tmp_path, LLAMA)
    (tmp_path / "hf_quant_config.json").write_text(
        json.dumps(
            {
                "producer": {"name": "modelopt"},
                "quantization": {
                    "quant_algo": algo,
                    "kv_cache_quant_algo": "FP8",
                    "exclude_modules": ["lm_head"],
                },
            }
        )
    )
    work = castcore.build_workload(model)
    assert (work.weights, work.activations, work.kv_cache) == options


# --- the reference kernels compute what the real ones do ----------------------------------------------------


def test_e2m1_codes_decode_to_their_values():
    nibbles = torch.arange(16, dtype=torch.uint8)
    packed = (nibbles[0::2] | nibbles[1::2] << 4).view(FP4).reshape(1, 8)
    values = quantized_ops.dequantize(packed, torch.ones(1, 1), 16, torch.float32)
    assert values.flatten().tolist() == list(quantized_ops.E2M1)


@pytest.mark.parametrize(
    "a_dtype, block, scale_dtype, global_scale, tolerance",
    [
        (FP4, 16, FP8, torch.tensor(0.004), 0.15),  # NVFP4 x NVFP4
        (FP8, 32, torch.float8_e8m0fnu, None, 0.2),  # MXFP8 x MXFP4
    ],
)
def test_block_scaled_products_approximate_the_float_product(
    a_dtype, block, scale_dtype, global_scale, tolerance
):
    torch.manual_seed(0)
    x, w = torch.randn(6, 128), torch.randn(40, 128)
    qx, sx = ops.quantize_blocks(x, a_dtype, block, scale_dtype, global_scale)
    qw, sw = ops.quantize_blocks(w, FP4, block, scale_dtype, global_scale)
    assert qw.shape == (40, 64) and sw.shape == (40, 128 // block) and sw.dtype == scale_dtype
    alpha = None if global_scale is None else global_scale * global_scale
    bias = torch.randn(40)
    out = ops.block_scaled_mm(qx, qw, sx, sw, block, alpha, bias, torch.bfloat16)
    exact = x @ w.T + bias
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    assert (out.float() - exact).norm() / exact.norm() < tolerance
    offs = torch.tensor([2, 6], dtype=torch.int32)  # two experts: the same weight, and its rows reversed
    grouped = ops.block_scaled_grouped_mm(
        qx,
        torch.stack([qw, qw.flip(0)]),
        sx,
        torch.stack([sw, sw.flip(0)]),
        block,
        None if alpha is None else alpha.repeat(2),
        offs,
        torch.float32,
    )
    plain = ops.block_scaled_mm(qx, qw, sx, sw, block, alpha, None, torch.float32)
    torch.testing.assert_close(grouped, torch.cat([plain[:2], plain[2:].flip(-1)]))


def test_w4a8_product_matches_int4_weight_only():
    torch.manual_seed(0)
    x = torch.randn(5, 256)
    codes = torch.randint(-8, 8, (24, 256))
    scales = torch.rand(24, 2) + 0.5
    stored = (codes + quantized_ops.INT4_OFFSET).to(torch.uint8)
    packed = stored[:, 0::2] | stored[:, 1::2] << 4
    qx, sx = ops.quantize_per_token(x, FP8)
    w4a8 = ops.block_scaled_mm(qx, packed, sx, scales, 128, None, None, torch.float32)
    w4a16 = ops.weight_only_linear(x, packed, scales, 128, None)
    assert (w4a8 - w4a16).norm() / w4a16.norm() < 0.05  # only the activations' fp8 rounding differs


def test_mxfp4_weight_only_dequantizes_with_power_of_two_scales():
    torch.manual_seed(0)
    w, x = torch.randn(16, 64), torch.randn(3, 64)
    qw, sw = ops.quantize_blocks(w, FP4, 32, torch.float8_e8m0fnu, None)
    assert torch.equal(torch.log2(sw.float()), torch.log2(sw.float()).round())  # powers of two
    out = ops.weight_only_linear(x, qw, sw, 32, None)
    torch.testing.assert_close(out, x @ quantized_ops.dequantize(qw, sw, 32, torch.float32).T)
    assert (out - x @ w.T).norm() / (x @ w.T).norm() < 0.2
