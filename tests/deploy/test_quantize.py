"""Quantized weights, activations and KV cache (--weights, --activations, --kv-cache) on real captures of tiny
Hugging Face models: bytes, FLOPs per dtype, the matrix rate used, memory, serving, and the refusals."""

from __future__ import annotations

import json
import math
import sys
from collections import defaultdict
from pathlib import Path

import pytest
import torch

import castcore
from castcore.builtin import quantized_ops
from castcore.builtin.formulas.quantized import DEQUANTIZE
from castcore.cli.main import main
from castcore.report.memory import kv_cache_bytes
from castcore.workload.spec import ModelError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

DATA = Path(__file__).parents[1] / "data"
LLAMA, MIXTRAL, A100 = DATA / "tiny-llama.json", DATA / "tiny-mixtral.json", DATA / "a100-sxm-80gb.toml"
CONFIG = json.loads(LLAMA.read_text())  # hidden 64, ffn 160, 2 layers, 4 heads, 2 KV heads of 16, vocab 500
LAYERS, SEQ, KV = CONFIG["num_hidden_layers"], 16, 32
ops = torch.ops.castcore


def _linears(config: dict) -> list[tuple[int, int]]:
    """(out, in) of one decoder layer's linear layers: q, k, v, o, gate, up, down."""
    h, i = config["hidden_size"], config["intermediate_size"]
    kv = config["num_key_value_heads"] * h // config["num_attention_heads"]
    return [(h, h), (kv, h), (kv, h), (h, h), (i, h), (i, h), (h, i)]


ELEMENTS = LAYERS * sum(o * i for o, i in _linears(CONFIG))  # quantized weight elements
CHANNEL_SCALES = LAYERS * sum(o for o, _ in _linears(CONFIG)) * 2  # one bf16 scale per output channel
INT4_SCALES = LAYERS * sum(o * math.ceil(i / 128) for o, i in _linears(CONFIG)) * 2  # one per 128 inputs


def _estimate(session, model=LLAMA, device=None, **options) -> castcore.Report:
    return session.estimate(castcore.build_workload(str(model), seq=SEQ, **options), device=device)


def _ops(report: castcore.Report, unit: str) -> dict[torch.dtype, float]:
    """mma_ops or gp_ops of a report, per dtype, outside the rotary tables (which transformers before 5.16 builds
    with a float32 product, later releases with a multiply)."""
    found: dict[torch.dtype, float] = defaultdict(float)
    for record in report.records:
        if record.invoke.module.endswith("rotary_emb"):
            continue
        for dtype, ops_ in (record.properties.compute_ops if record.properties else {}).items():
            found[dtype] += getattr(ops_, f"{unit}_ops")
    return {dtype: n for dtype, n in found.items() if n}


def _records(report: castcore.Report, name: str) -> list:
    return [r for r in report.records if r.invoke.name == name]


def _read(report: castcore.Report) -> float:
    return sum(r.properties.memory_read_bytes for r in report.records if r.properties)


def _borrowed(report: castcore.Report) -> set[str]:
    """Rates the roofline took from another dtype (DeviceProfile.rate's "X (no Y rate)"): the unquantized model
    has some (int64 position arithmetic), quantizing must add none."""
    return {
        used for r in report.records for used in r.estimate.detail.get("rates", {}).values() if "(no " in used
    }


def _profile(path: Path, **mma: float) -> castcore.DeviceProfile:
    """The profile in ``path`` with some matrix rates changed."""
    data = tomllib.loads(path.read_text())
    data["mma_flops"].update(mma)
    # estimates are cached by name
    data["name"] += "".join(f"-{dtype}-{rate:g}" for dtype, rate in mma.items())
    return castcore.device_from_dict(data, origin=str(path))


def test_int8_weight_only_halves_the_linear_weights_and_what_a_decode_step_reads(session):
    base = _estimate(session, phase="decode", kv_len=KV)
    int8 = _estimate(session, phase="decode", kv_len=KV, weights="int8")
    # One byte per weight instead of two, plus a bf16 scale per output channel; embedding and LM head stay bf16.
    assert int8.memory.weight_bytes == base.memory.weight_bytes - ELEMENTS + CHANNEL_SCALES
    assert 0.5 < (ELEMENTS + CHANNEL_SCALES) / (2 * ELEMENTS) < 0.52
    assert _read(base) - _read(int8) == ELEMENTS - CHANNEL_SCALES  # every weight read once, as int8
    linear = _records(int8, "castcore::weight_only_linear")
    # merged q/k/v, o, merged gate/up, down
    assert len(linear) == LAYERS * 4 and not _records(int8, "aten::_int_mm")
    assert all(r.invoke.args[1].dtype == torch.int8 for r in linear)
    # The products still run in bf16; dequantizing costs one multiply-add (2 ops) per weight element per call.
    assert _ops(int8, "mma") == _ops(base, "mma") == {torch.bfloat16: _ops(base, "mma")[torch.bfloat16]}
    gp, base_gp = _ops(int8, "gp"), _ops(base, "gp")
    assert gp[torch.bfloat16] - base_gp[torch.bfloat16] == DEQUANTIZE * ELEMENTS
    assert _borrowed(int8) == _borrowed(base)


def test_int4_weight_only_quarters_the_linear_weights(session):
    base = _estimate(session, phase="decode", kv_len=KV)
    int4 = _estimate(session, phase="decode", kv_len=KV, weights="int4")
    # Two weights per byte, a bf16 scale per 128 input columns (down_proj's 160 inputs make two groups).
    assert int4.memory.weight_bytes == base.memory.weight_bytes - 2 * ELEMENTS + ELEMENTS // 2 + INT4_SCALES
    assert 0.25 < (ELEMENTS // 2 + INT4_SCALES) / (2 * ELEMENTS) < 0.27
    assert _read(base) - _read(int4) == 2 * ELEMENTS - ELEMENTS // 2 - INT4_SCALES
    packed = [r.invoke.args[1] for r in _records(int4, "castcore::weight_only_linear")]
    assert all(w.dtype == torch.uint8 for w in packed)
    assert sum(w.numel() for w in packed) == ELEMENTS // 2


def test_weight_only_quantization_speeds_up_a_memory_bound_decode(session):
    # llama-3-8b, one sequence over 2048 cached tokens: reading the weights is most of the step.
    reports = {
        w: session.estimate(castcore.build_workload("llama-3-8b", phase="decode", kv_len=2048, weights=w))
        for w in (None, "int8", "int4")
    }
    weights = {w: r.memory.weight_bytes for w, r in reports.items()}
    assert weights[None] > weights["int8"] > weights["int4"]
    embed_and_head = 2 * 128256 * 4096 * 2  # stay bf16
    assert (weights["int8"] - embed_and_head) / (weights[None] - embed_and_head) == pytest.approx(
        0.5, abs=0.005
    )
    assert (weights["int4"] - embed_and_head) / (weights[None] - embed_and_head) == pytest.approx(
        0.25, abs=0.01
    )
    assert reports[None].time_s > reports["int8"].time_s > reports["int4"].time_s


@pytest.mark.parametrize(
    "kind, dtype, product",
    [("int8", torch.int8, "castcore::int8_scaled_mm"), ("fp8", torch.float8_e4m3fn, "aten::_scaled_mm")],
)
def test_w8a8_products_count_in_the_quantized_dtype_at_its_rate(session, h100_file, kind, dtype, product):
    base = _estimate(session)
    report = _estimate(session, weights=kind, activations=kind)
    products = _records(report, product)
    # merged q/k/v, o, merged gate/up, down
    assert len(products) == len(_records(report, "castcore::quantize_per_token")) == LAYERS * 4
    # Every decoder linear layer's product runs in int8 / fp8 on all 16 tokens; attention and the LM head stay bf16.
    mma = _ops(report, "mma")
    assert mma[dtype] == 2 * SEQ * ELEMENTS
    assert mma[dtype] + mma[torch.bfloat16] == _ops(base, "mma")[torch.bfloat16]
    assert all(r.estimate.detail["rates"][f"mma:{dtype}"] == dtype_name(dtype) for r in products)
    # The epilogue scales the fp32 accumulators: one op per output, counted in fp32 (a rate the device has).
    assert all(
        r.properties.compute_ops[torch.float32].gp_ops == r.invoke.outputs()[0].numel() for r in products
    )
    assert _borrowed(report) == _borrowed(base)
    # The time follows the quantized rate, and no other.
    rate = tomllib.loads(h100_file.read_text())["mma_flops"][dtype_name(dtype)]
    faster = _estimate(
        session, device=_profile(h100_file, **{dtype_name(dtype): 2 * rate}), weights=kind, activations=kind
    )
    other = _estimate(session, device=_profile(h100_file, bfloat16=1e12), weights=kind, activations=kind)
    compute = [sum(r.estimate.compute_s for r in _records(rep, product)) for rep in (report, faster, other)]
    assert compute[1] < compute[0] == compute[2]


def test_fp8_block_quantizes_activations_per_group_and_scales_products_per_block(session, h100_file):
    base = _estimate(session)
    report = _estimate(session, weights="fp8-block")
    products, groups = (
        _records(report, "aten::_scaled_mm"),
        _records(report, "castcore::quantize_per_token_group"),
    )
    assert len(products) == len(groups) == LAYERS * 4 and not _records(report, "castcore::quantize_per_token")
    for product in products:  # codes [16, in] by [in, out], scales per 1 x 128 group and per 128 x 128 block
        a, b, scale_a, scale_b = product.invoke.args[:4]
        assert tuple(scale_a.shape) == (SEQ, math.ceil(a.shape[1] / 128))
        assert tuple(scale_b.shape) == (math.ceil(b.shape[0] / 128), math.ceil(b.shape[1] / 128))
    assert _ops(report, "mma")[torch.float8_e4m3fn] == 2 * SEQ * ELEMENTS
    # merged q/k/v (128 x 64), o (64 x 64), merged gate/up (320 x 64), down (64 x 160)
    blocks = LAYERS * (1 + 1 + 3 * 1 + 1 * 2)
    fp8_block = report.memory.weight_bytes - base.memory.weight_bytes
    # one byte a weight instead of two, fp32 block scales
    assert fp8_block == ELEMENTS - 2 * ELEMENTS + blocks * 4
    with pytest.raises(ModelError, match=r"activations='int8' multiplies int8 activations by int8 weights"):
        _estimate(session, weights="fp8-block", activations="int8")
    a100 = castcore.load_device_file(A100)
    with pytest.raises(ModelError, match=r"a100-sxm-80gb has no float8_e4m3fn matrix rate"):
        _estimate(session, device=a100, weights="fp8-block")


def test_per_token_group_quantization_round_trips():
    x = torch.randn(3, 200) * torch.tensor([1.0] * 128 + [100.0] * 72)  # each group has its own range
    codes, scales = ops.quantize_per_token_group(x, 128, torch.float8_e4m3fn)
    assert codes.shape == x.shape and scales.shape == (3, 2)
    back = codes.float() * scales.repeat_interleave(128, dim=1)[:, :200]
    torch.testing.assert_close(back, x, rtol=0.07, atol=0.07 * 100)
    assert torch.all(scales[:, 1] > 50 * scales[:, 0])


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def test_eager_int8_w8a8_is_torchs_int_mm_and_a_separate_scaling(session):
    report = _estimate(session, weights="int8", activations="int8", fuse=False)
    products, epilogues = _records(report, "aten::_int_mm"), _records(report, "castcore::dequantize_int_mm")
    assert len(products) == len(epilogues) == LAYERS * 7  # gate and up stay separate in the eager graph
    assert _ops(report, "mma")[torch.int8] == 2 * SEQ * ELEMENTS
    # The int32 accumulators are written out, then read back and scaled to bf16.
    assert all(
        e.invoke.args[0].dtype == torch.int32 and e.invoke.outputs()[0].dtype == torch.bfloat16
        for e in epilogues
    )


def test_a100_has_int8_but_no_fp8_matrix_rate(session):
    a100 = castcore.load_device_file(A100)
    assert _ops(_estimate(session, device=a100, weights="int8", activations="int8"), "mma")[torch.int8] > 0
    # Weight-only fp8 multiplies in bf16 (Marlin's fp8 kernels run on Ampere): no fp8 rate needed.
    weight_only = _estimate(session, device=a100, weights="fp8")
    assert torch.float8_e4m3fn not in _ops(weight_only, "mma")
    assert _borrowed(weight_only) == _borrowed(_estimate(session, device=a100))
    with pytest.raises(
        ModelError, match=r"activations='fp8': a100-sxm-80gb has no float8_e4m3fn matrix rate"
    ):
        _estimate(session, device=a100, weights="fp8", activations="fp8")


def test_fp8_kv_cache_halves_the_cache_and_what_fused_attention_reads(session):
    config = json.loads(LLAMA.read_text())
    prefill = {kv: _estimate(session, kv_cache=kv).memory.kv_cache_bytes for kv in (None, "fp8")}
    assert prefill[None] == kv_cache_bytes(config, 1, SEQ, torch.bfloat16) == 2 * prefill["fp8"]
    base = _estimate(session, phase="decode", kv_len=KV)
    fp8 = _estimate(session, phase="decode", kv_len=KV, kv_cache="fp8")
    cache = kv_cache_bytes(config, 1, KV + 1, torch.bfloat16)  # the static cache holds the new token too
    counters = base.memory.kv_cache_bytes - cache  # each layer's int64 position counter
    assert fp8.memory.kv_cache_bytes == cache // 2 + counters
    attention = [sum(r.bytes for r in _records(rep, "castcore::attention")) for rep in (base, fp8)]
    assert attention[0] - attention[1] == cache // 2  # keys and values read as fp8
    writes = [
        r for r in _records(fp8, "aten::_to_copy") if r.invoke.outputs()[0].dtype == torch.float8_e4m3fn
    ]
    # the new token
    assert len(writes) == 2 * LAYERS and all(w.invoke.outputs()[0].shape[2] == 1 for w in writes)


def test_a_cache_another_step_cut_to_a_micro_batch_is_kept_in_the_kv_dtype(session):
    # --pp 2 decodes micro-batches: the pipeline re-makes the static cache for one, and quantize re-types it.
    base = _estimate(session, phase="decode", kv_len=KV, batch=2, pp=2)
    fp8 = _estimate(session, phase="decode", kv_len=KV, batch=2, pp=2, kv_cache="fp8")
    cache = kv_cache_bytes(CONFIG, 1, KV + 1, torch.bfloat16)  # the micro-batch of one sequence
    counters = base.memory.kv_cache_bytes - cache
    assert counters < 64 and fp8.memory.kv_cache_bytes == cache // 2 + counters


def test_eager_attention_dequantizes_the_cache_first(session):
    report = _estimate(session, phase="decode", kv_len=KV, kv_cache="int8", fuse=False)
    reads = [r for r in _records(report, "aten::_to_copy") if r.invoke.inputs()[0].dtype == torch.int8]
    kv_heads, head_dim = CONFIG["num_key_value_heads"], CONFIG["hidden_size"] // CONFIG["num_attention_heads"]
    assert len(reads) == 2 * LAYERS  # keys and values of each layer, the whole cache
    assert all(
        r.invoke.inputs()[0].shape == (1, kv_heads, KV + 1, head_dim)
        and r.invoke.outputs()[0].dtype == torch.bfloat16
        for r in reads
    )


@pytest.mark.parametrize("fuse", [True, False], ids=["deployed", "eager"])
def test_a_quantized_cache_under_attention_a_model_keeps_to_itself_is_one_line(session, fuse):
    """Falcon runs its own attention (SDPA on the cache as stored), which castcore's kernels do not stand in for: a
    decode step over an fp8 cache is refused naming the class, not left to fail inside transformers."""
    work = castcore.build_workload(
        str(DATA / "tiny-falcon.json"), phase="decode", kv_len=KV, kv_cache="fp8", fuse=fuse
    )
    with pytest.raises(ModelError) as refused:
        session.estimate(work)
    assert str(refused.value) == (
        "kv_cache='fp8': FalconAttention keeps its own attention implementation, which reads the cache as it is "
        "stored and takes no float8_e4m3fn keys; castcore prices a quantized KV cache in its attention kernels: "
        "drop kv_cache"
    )
    assert session.estimate(
        castcore.build_workload(str(DATA / "tiny-falcon.json"), phase="decode", kv_len=KV)
    )


def test_tensor_parallel_quantizes_each_devices_shard(session):
    whole = _estimate(session, weights="int8")
    shard = _estimate(session, weights="int8", tp=2)
    codes = [
        sum(r.invoke.args[1].nbytes for r in _records(rep, "castcore::weight_only_linear"))
        for rep in (whole, shard)
    ]
    assert codes == [ELEMENTS, ELEMENTS // 2]
    assert shard.memory.weight_bytes == pytest.approx(whole.memory.weight_bytes / 2, rel=0.02)
    assert _records(shard, "_c10d_functional::all_reduce")  # row-parallel outputs still summed across devices
    decode = _estimate(
        session, weights="fp8", activations="fp8", kv_cache="fp8", tp=2, phase="decode", kv_len=KV
    )
    assert sum(r.invoke.args[1].numel() for r in _records(decode, "aten::_scaled_mm")) == ELEMENTS // 2


def test_mixture_of_experts_weights_are_quantized_too(session):
    config = json.loads(MIXTRAL.read_text())
    h, i, experts = config["hidden_size"], config["intermediate_size"], config["num_local_experts"]
    expert_elements = LAYERS * experts * 3 * h * i
    base = _estimate(session, model=MIXTRAL)
    int8 = _estimate(session, model=MIXTRAL, weights="int8")
    attention = LAYERS * sum(o * n for o, n in _linears({**config, "intermediate_size": 0})[:4])
    scales = 2 * LAYERS * (experts * (2 * i + h) + 2 * h + 2 * (h // 2))
    assert int8.memory.weight_bytes == base.memory.weight_bytes - expert_elements - attention + scales
    assert not _records(int8, "aten::_grouped_mm")
    grouped = _records(int8, "castcore::weight_only_grouped_mm")
    assert len(grouped) == 2 * LAYERS and all(r.invoke.args[1].dtype == torch.int8 for r in grouped)
    assert _ops(int8, "mma") == _ops(base, "mma")  # dequantized into bf16 products
    for kind, dtype, product in (
        ("fp8", torch.float8_e4m3fn, "aten::_scaled_grouped_mm"),
        ("int8", torch.int8, "castcore::int8_scaled_grouped_mm"),
    ):
        w8a8 = _estimate(session, model=MIXTRAL, weights=kind, activations=kind)
        assert sum(r.properties.compute_ops[dtype].mma_ops for r in _records(w8a8, product)) == sum(
            r.properties.compute_ops[torch.bfloat16].mma_ops for r in _records(base, "aten::_grouped_mm")
        )
        assert _borrowed(w8a8) == _borrowed(base)
    # experts split over 2 devices
    parallel = _estimate(session, model=MIXTRAL, weights="int8", ep=2, batch=2)
    assert _records(parallel, "_c10d_functional::all_to_all_single")
    assert _records(parallel, "castcore::weight_only_grouped_mm")[0].invoke.args[1].shape[0] == experts // 2


def _cli(
    capsys, *argv: str, command: str = "estimate", model: Path = LLAMA, device: Path | None = None
) -> str:
    """Run the command with --json; its output."""
    assert (
        main(
            [
                command,
                "--model",
                str(model),
                "--no-packs",
                "--device-file",
                str(device or DATA / "h100-sxm.toml"),
                "--json",
                *argv,
            ]
        )
        == 0
    )
    return capsys.readouterr().out


def test_the_command_line_and_the_api_give_the_same_figures(session, capsys):
    options = {
        "phase": "decode",
        "kv_len": KV,
        "weights": "int8",
        "activations": "int8",
        "kv_cache": "fp8",
        "tp": 2,
    }
    cli = json.loads(
        _cli(
            capsys,
            "--seq",
            str(SEQ),
            "--phase",
            "decode",
            "--kv-len",
            str(KV),
            "--weights",
            "int8",
            "--activations",
            "int8",
            "--kv-cache",
            "fp8",
            "--tp",
            "2",
        )
    )
    api = json.loads(_estimate(session, **options).to_json())
    for key in ("description", "workload", "notes", "totals", "ops", "memory", "coverage"):
        assert cli[key] == api[key], key
    assert any(note.startswith("--weights int8 --activations int8: 8 linear layers") for note in cli["notes"])


def test_serve_with_int8_weights_holds_about_half_the_weights(session, tmp_path, capsys):
    # so the decoder's linear layers are nearly every weight
    small_vocab = tmp_path / "llama-small-vocab.json"
    small_vocab.write_text(json.dumps({**CONFIG, "vocab_size": 32}))
    request = ("--input", "16", "--output", "8", "--batch", "2")
    base = json.loads(_cli(capsys, *request, command="serve", model=small_vocab))
    int8 = json.loads(
        _cli(capsys, *request, "--weights", "int8", "--kv-cache", "fp8", command="serve", model=small_vocab)
    )
    assert int8["weights"] == "int8" and int8["kv_cache"] == "fp8"
    assert int8["weight_bytes"] == base["weight_bytes"] - ELEMENTS + CHANNEL_SCALES
    assert 0.5 < int8["weight_bytes"] / base["weight_bytes"] < 0.55
    counters = base["kv_cache_bytes"] - kv_cache_bytes(CONFIG, 2, 16 + 8, torch.bfloat16)
    assert int8["kv_cache_bytes"] == (base["kv_cache_bytes"] - counters) // 2 + counters
    api = session.serve(
        str(small_vocab), input_tokens=16, output_tokens=8, batch=2, weights="int8", kv_cache="fp8"
    )
    assert json.loads(api.to_json()) == int8


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["--weights", "fp8", "--activations", "fp8", "--device-file", str(A100)],
            "--activations fp8: a100-sxm-80gb has no float8_e4m3fn matrix rate",
        ),
        (["--weights", "fp16"], "--weights fp16 with --dtype bf16"),
        (
            ["--weights", "int8", "--train"],
            "--weights, --activations and --kv-cache price quantized inference",
        ),
        (["--activations", "int8"], "--activations int8 multiplies int8 activations by int8 weights"),
        (
            ["--kv-cache", "fp8", "--model", "tests.factories.tiny_mlp:make"],
            "--kv-cache fp8: castcore finds no KV cache",
        ),
    ],
)
def test_a_dtype_a_model_or_device_cannot_use_is_refused_in_one_line(argv, message, capsys):
    model = [] if "--model" in argv else ["--model", str(LLAMA)]
    device = [] if "--device-file" in argv else ["--device-file", str(DATA / "h100-sxm.toml")]
    assert main(["estimate", "--seq", str(SEQ), "--no-packs", *model, *device, *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert message in err[-1] and "Traceback" not in "\n".join(err)
    assert err[-1].startswith("castcore: error:")


def test_a_module_without_linear_layers_is_refused(session):
    model = torch.nn.Conv1d(8, 8, 3).to(device="meta")
    with pytest.raises(ModelError, match=r"^weights='int8': Conv1d has no linear layers .*; drop weights$"):
        session.estimate(castcore.build_workload(model, torch.empty(1, 8, 16, device="meta"), weights="int8"))


# --- the reference implementations compute what the kernels do ---------------------------------------------


def _int4_pack(codes: torch.Tensor) -> torch.Tensor:
    stored = (codes + quantized_ops.INT4_OFFSET).to(torch.uint8)
    return stored[..., 0::2] | (stored[..., 1::2] << 4)


def test_weight_only_linear_multiplies_by_the_dequantized_weight():
    torch.manual_seed(0)
    x = torch.randn(3, 5, 256)
    codes = torch.randint(-8, 8, (24, 256))
    scales = torch.rand(24, 2) + 0.5  # one per 128 input columns
    weight = codes.float() * scales.repeat_interleave(128, dim=1)
    torch.testing.assert_close(ops.weight_only_linear(x, _int4_pack(codes), scales, 128, None), x @ weight.T)
    int8 = torch.randint(-127, 128, (24, 256), dtype=torch.int8)
    channel = torch.rand(24, 1) + 0.5
    bias = torch.randn(24)
    torch.testing.assert_close(
        ops.weight_only_linear(x, int8, channel, 256, bias), x @ (int8 * channel).T + bias
    )
    fp8 = torch.randn(24, 256).to(torch.float8_e4m3fn)
    torch.testing.assert_close(
        ops.weight_only_linear(x, fp8, channel, 256, None), x @ (fp8.float() * channel).T
    )


def test_grouped_weight_only_runs_each_experts_rows_through_its_weight():
    torch.manual_seed(0)
    x, codes, scales = (
        torch.randn(7, 64),
        torch.randint(-127, 128, (3, 16, 64), dtype=torch.int8),
        torch.rand(3, 16, 1),
    )
    offs = torch.tensor([2, 2, 7], dtype=torch.int32)  # expert 1 gets no rows
    out = ops.weight_only_grouped_mm(x, codes, scales, offs, 64)
    expected = torch.cat([x[:2] @ (codes[0] * scales[0]).T, x[2:] @ (codes[2] * scales[2]).T])
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("dtype", [torch.int8, torch.float8_e4m3fn])
def test_per_token_quantization_round_trips(dtype):
    torch.manual_seed(0)
    x = torch.randn(6, 128) * torch.logspace(-2, 2, 6).unsqueeze(1)
    codes, scale = ops.quantize_per_token(x, dtype)
    assert codes.dtype == dtype and scale.shape == (6, 1)
    assert torch.equal(
        codes.float().abs().amax(-1), torch.full((6,), 127.0 if dtype == torch.int8 else 448.0)
    )
    error = (codes.float() * scale - x).abs() / x.abs().amax(-1, keepdim=True)
    assert error.max() < (0.5 / 127 * 1.001 if dtype == torch.int8 else 0.07)


def test_int8_products_and_their_scaling_match_the_float_product():
    torch.manual_seed(0)
    x, w = torch.randn(5, 64), torch.randn(32, 64)
    qx, sx = ops.quantize_per_token(x, torch.int8)
    qw, sw = ops.quantize_per_token(w, torch.int8)  # per output channel
    fused = ops.int8_scaled_mm(qx, qw.t(), sx, sw.t(), None, torch.float32)
    eager = ops.dequantize_int_mm(torch._int_mm(qx, qw.t()), sx, sw.t(), None, torch.float32)
    torch.testing.assert_close(fused, eager)
    exact = x @ w.T
    assert (fused - exact).abs().max() < 0.05 * exact.abs().max()  # per-token and per-channel int8 rounding
    offs = torch.tensor([2, 5], dtype=torch.int32)
    qe, se = torch.stack([qw, qw.flip(0)]), torch.stack([sw[:, 0], sw.flip(0)[:, 0]])
    grouped = ops.int8_scaled_grouped_mm(qx, qe.transpose(-2, -1), sx[:, 0], se, offs, torch.float32)
    torch.testing.assert_close(grouped, torch.cat([fused[:2], fused[2:].flip(-1)]))
