"""Deployed kernels: the core's fused rewrites compute what the eager model does, capture as fused ops, keep the
model's FLOPs, and leave what a pack fused alone; --eager prices the Hugging Face graph."""

from __future__ import annotations

import json

import pytest
import torch

import castcore
from castcore.builtin.attention_ops import kept_keys
from castcore.cli.main import main
from castcore.deploy.kernels.fusing import rewrite
from castcore.hf.attention import (
    ATTENTION,
    castcore_attention,
    castcore_mask,
    register_attention,
    supports_attention_backend,
)
from castcore.hf.cache import cache_argument
from castcore.hf.configs import configs
from castcore.workload.models import BuiltModel

DATA = __import__("pathlib").Path(__file__).parents[1] / "data"


def real_model(name: str) -> torch.nn.Module:
    """A tiny transformers model with random weights (norm weights too, so Gemma's 1 + weight matters)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    register_attention(ATTENTION, castcore_attention, castcore_mask)
    fields = json.loads((DATA / name).read_text())
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    # A model written before transformers' attention interface (GPT-J) runs its own eager attention.
    own = not supports_attention_backend(MODEL_FOR_CAUSAL_LM_MAPPING[type(config)])
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(
        config, dtype=torch.float32, attn_implementation="eager" if own else ATTENTION
    ).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0, 0.2)
    return model


def logits_eager_and_rewritten(name: str, prompt: int, steps: int = 3) -> tuple[list, list, list[str]]:
    """``real_model(name)``'s logits over a prompt of ``prompt`` tokens and ``steps`` decode steps (batch 2, one
    transformers cache carried through), eager and after the core's rewrites, and the rewrites' lines."""
    from transformers import DynamicCache

    model = real_model(name)
    tokens = [torch.randint(3, 200, (2, prompt)), *(torch.randint(3, 200, (2, 1)) for _ in range(steps))]

    def run():
        cache = {cache_argument(model): DynamicCache(config=model.config)}
        with torch.no_grad():
            return [model(x, **cache, use_cache=True).logits for x in tokens]

    eager = run()
    built = BuiltModel(model=model)
    done, _ = rewrite(built)
    with built.while_capturing():
        return eager, run(), done


@pytest.mark.parametrize(
    "name",
    [
        "tiny-llama.json",
        "tiny-mixtral.json",
        "tiny-gemma2.json",
        "tiny-gemma3.json",
        "tiny-gptj.json",
        "tiny-deepseek-v3.json",
        "tiny-llama4.json",
        "tiny-gpt-oss.json",
        "tiny-qwen3-moe.json",
        "tiny-glm4-moe.json",
        "tiny-qwen3.json",
    ],
)
def test_the_fused_model_computes_what_the_eager_one_does(name):
    from transformers import DynamicCache

    model = real_model(name)
    # past gpt-oss's 16-token window
    prompt, step = (
        torch.randint(3, 200, (2, 20)),
        torch.randint(3, 200, (2, 1)),
    )

    def run():
        cache = {cache_argument(model): DynamicCache(config=model.config)}
        with torch.no_grad():
            first = model(prompt, **cache, use_cache=True).logits
            return first, model(step, **cache, use_cache=True).logits

    eager = run()
    built = BuiltModel(model=model)
    done, _ = rewrite(built)
    assert done, "nothing was fused"
    with built.while_capturing():
        fused = run()
    for want, got in zip(eager, fused):  # the prefill, then a decode step over its cache
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_llama_captures_only_fused_kernels_around_its_matmuls_with_the_same_flops(session, tiny_llama):
    workloads = {fuse: castcore.build_workload(str(tiny_llama), seq=32, fuse=fuse) for fuse in (True, False)}
    fused, eager = (session.estimate(workloads[fuse]) for fuse in (True, False))
    names = {r.invoke.name for r in fused.records}
    assert {
        "castcore::rms_norm",
        "castcore::add_rms_norm",
        "castcore::silu_and_mul",
        "castcore::attention",
        "castcore::rotary_embedding",
    } <= names
    assert not names & {"aten::pow.Tensor_Scalar", "aten::rsqrt", "aten::silu", "aten::neg"}
    assert fused.totals()["flops"] == pytest.approx(eager.totals()["flops"], rel=0.02)
    assert fused.totals()["bytes"] < 0.8 * eager.totals()["bytes"]
    assert fused.time_s < eager.time_s
    assert "deployed kernels" in fused.description and "eager" in eager.description
    assert any(n.startswith("deployed kernels by castcore: ") for n in fused.notes)


def test_decode_and_tensor_parallel_run_fused(session, tiny_llama):
    report = session.estimate(
        castcore.build_workload(str(tiny_llama), batch=2, seq=16, phase="decode", kv_len=40, tp=2)
    )
    calls = [r for r in report.records if r.invoke.name == "castcore::attention"]
    q, k = calls[0].invoke.args[:2]
    assert (q.shape[1], k.shape[1], k.shape[2]) == (2, 1, 41)  # 4 heads / 2, 2 KV heads / 2, 40 cached + 1
    # One token attends to all 41 keys: 2 products of head_dim 16 per pair.
    assert sum(c.mma_ops for c in calls[0].properties.compute_ops.values()) == 2 * 2 * 2 * 41 * (16 + 16)


def test_q_k_and_v_run_as_one_gemm_split_by_heads(session, tiny_llama):
    """Deployed, an attention's three projections are one GEMM over the same hidden states, as engines merge them;
    under --tp 2 each device's holds its 2 query heads and its KV head of 16 (tiny-llama: 4 heads, 2 KV heads)."""
    eager, whole, split = (
        session.estimate(castcore.build_workload(str(tiny_llama), seq=16, tp=tp, fuse=fuse))
        for tp, fuse in ((1, False), (1, True), (2, True))
    )

    def projections(report):
        return [
            (r.invoke.module.rsplit(".", 1)[-1], tuple(r.invoke.args[1].shape))
            for r in report.records
            if r.invoke.name == "aten::mm" and ".layers.0.self_attn." in r.invoke.module
        ]

    assert projections(eager) == [
        ("q_proj", (64, 64)),
        ("k_proj", (64, 32)),
        ("v_proj", (64, 32)),
        ("o_proj", (64, 64)),
    ]
    assert projections(whole) == [("qkv_proj", (64, 64 + 32 + 32)), ("o_proj", (64, 64))]
    assert projections(split) == [("qkv_proj", (64, 32 + 16 + 16)), ("o_proj", (32, 64))]
    assert any("2 q/k/v projections -> one merged qkv_proj" in n for n in whole.notes)


def test_each_layers_closing_residual_add_runs_in_the_next_norm(session, tiny_llama, tmp_path):
    """vLLM's layers hand their residual to the next fused_add_rms_norm: 5 layers run one plain RMSNorm (the first
    layer's input) and 2 x 5 fused add + norm kernels (the last the final norm's), no residual add of their own.
    Layer reuse captures the first layer apart from the rest and prices as many kernels; its replayed last layer
    leaves the final norm a plain one, a residual's read and write less."""
    config = {**json.loads(tiny_llama.read_text()), "num_hidden_layers": 5}
    path = tmp_path / "five.json"
    path.write_text(json.dumps(config))
    reused, whole = (
        session.estimate(castcore.build_workload(str(path), seq=64, reuse=reuse)) for reuse in (True, False)
    )

    def count(report, name):
        return sum(r.invoke.name == name for r in report.records)

    assert (count(whole, "castcore::rms_norm"), count(whole, "castcore::add_rms_norm")) == (1, 10)
    assert (count(reused, "castcore::rms_norm"), count(reused, "castcore::add_rms_norm")) == (2, 9)
    floats = [
        r
        for r in whole.records
        if r.invoke.name == "aten::add.Tensor" and r.invoke.outputs()[0].dtype.is_floating_point
    ]
    assert not floats
    hidden = 64 * 64 * 2  # a residual's bf16 [64 tokens, 64]: read and written once more by the fused norm
    assert whole.totals()["bytes"] - reused.totals()["bytes"] == pytest.approx(2 * hidden)
    assert any("5 decoder layer closing residual add + the next RMSNorm" in n for n in whole.notes)


def test_qwen3s_head_norms_run_in_the_rotary_kernel(session):
    """Qwen3 norms each query and key head before rotating it: deployed, the rotary kernel does both, as
    TensorRT-LLM's fusedQKNormRope does; the norms' records stay (the same values) at no time of their own."""
    qwen3 = str(DATA / "tiny-qwen3.json")
    deployed, eager = (
        session.estimate(castcore.build_workload(qwen3, phase="decode", kv_len=16, fuse=fuse))
        for fuse in (True, False)
    )
    in_rotary = [r for r in deployed.records if r.invoke.name == "castcore::rotary_qk_norm"]
    assert sorted({r.invoke.module.rsplit(".", 1)[-1] for r in in_rotary}) == ["k_norm", "q_norm"]
    assert len(in_rotary) == 2 * 2
    assert all(r.estimate.time_s == 0 and r.estimate.source.step == "hoisted" for r in in_rotary)
    head_norms = [r for r in deployed.records if r.invoke.module.endswith(("q_norm", "k_norm"))]
    assert {r.invoke.name for r in head_norms} == {"castcore::rotary_qk_norm"}
    assert len([r for r in deployed.records if r.invoke.name == "castcore::rotary_embedding"]) == 2
    assert not [r for r in eager.records if r.invoke.name == "castcore::rotary_qk_norm"]
    assert any(
        "2 attention layers' per-head q and k RMSNorms -> computed by the rotary" in n for n in deployed.notes
    )


def test_moe_router_is_one_op(session):
    report = session.estimate(castcore.build_workload(str(DATA / "tiny-mixtral.json"), seq=16))
    names = [r.invoke.name for r in report.records]
    assert names.count("castcore::topk_softmax") == 2 and "aten::topk" not in names


@pytest.mark.parametrize(
    "q_len,kv_len,window", [(5, 5, 0), (1, 9, 0), (4, 9, 0), (12, 12, 4), (3, 10, 4), (6, 6, 10), (1, 30, 8)]
)
def test_kept_keys_counts_the_mask(q_len, kv_len, window):
    rows = torch.arange(kv_len - q_len, kv_len).unsqueeze(1)
    cols = torch.arange(kv_len).unsqueeze(0)
    keep = (cols <= rows) & ((cols > rows - window) if window else True)
    assert kept_keys(q_len, kv_len, True, window) == int(keep.sum())


@pytest.mark.parametrize(
    "q_len,kv_len,chunk", [(100, 100, 64), (1, 100, 64), (30, 100, 8), (64, 64, 64), (5, 9, 16)]
)
def test_kept_keys_counts_a_chunked_mask(q_len, kv_len, chunk):
    rows = torch.arange(kv_len - q_len, kv_len).unsqueeze(1)
    cols = torch.arange(kv_len).unsqueeze(0)
    keep = (cols <= rows) & (cols // chunk == rows // chunk)
    assert kept_keys(q_len, kv_len, True, 0, chunk) == int(keep.sum())


@pytest.mark.parametrize(
    "q_len,kv_len,window,chunk",
    [
        (1, 1000, 100, 0),
        (4, 1000, 100, 0),
        (1, 1000, 0, 256),
        (1, 50, 100, 0),
        (1000, 1000, 100, 0),
        (1, 1000, 0, 0),
    ],
)
def test_attention_reads_only_the_keys_its_queries_can_see(session, q_len, kv_len, window, chunk):
    """A decode step over a long cache with a sliding window (or Llama 4's chunks) reads the keys its queries
    reach, not the whole cache; a prompt's queries reach every key."""
    q = torch.empty(2, 8, q_len, 64, dtype=torch.bfloat16)
    k = torch.empty(2, 2, kv_len, 64, dtype=torch.bfloat16)

    def attend(q, k, v):
        return torch.ops.castcore.attention(q, k, v, 0.125, True, window, 0.0, chunk=chunk)

    (record,) = session.estimate(attend, q, k, k).records
    first = kv_len - q_len
    start = max(0, first - window + 1) if window else (first // chunk * chunk if chunk else 0)
    reached = kv_len - start
    out = 2 * q_len * 8 * 64 * 2
    assert record.properties.memory_read_bytes == pytest.approx(q.nbytes + 2 * k.nbytes * reached / kv_len)
    assert record.properties.memory_write_bytes == out
    assert (
        reached
        == {
            (1, 1000, 100, 0): 100,
            (4, 1000, 100, 0): 103,
            (1, 1000, 0, 256): 1000 - 768,
            (1, 50, 100, 0): 50,
            (1000, 1000, 100, 0): 1000,
            (1, 1000, 0, 0): 1000,
        }[(q_len, kv_len, window, chunk)]
    )


def test_llama4_chunked_layers_attend_within_their_chunk():
    """A 100-token prompt over 64-token chunks: the fused prefill gives transformers' own eager logits, and the
    chunked layer's attention is priced on the pairs its mask keeps (64 x 65 / 2 + 36 x 37 / 2 per head)."""
    model = real_model("tiny-llama4.json")
    prompt = torch.randint(3, 200, (1, 100))
    for config in configs(model):
        config._attn_implementation = "eager"
    with torch.no_grad():
        want = model(prompt).logits
    for config in configs(model):
        config._attn_implementation = ATTENTION
    built = BuiltModel(model=model)
    rewrite(built)
    with built.while_capturing(), torch.no_grad():
        got = model(prompt).logits
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    session = castcore.Session(load_packs=[], device_files=[DATA / "h100-sxm.toml"])
    report = session.estimate(castcore.build_workload(str(DATA / "tiny-llama4.json"), seq=100))
    attention = [r for r in report.records if r.invoke.name == "castcore::attention"]
    assert [r.invoke.argument("chunk") for r in attention] == [64, 0]  # no_rope_layers: [1, 0]
    flops = [sum(o.mma_ops for o in r.properties.compute_ops.values()) for r in attention]
    assert flops[0] / flops[1] == pytest.approx((64 * 65 / 2 + 36 * 37 / 2) / (100 * 101 / 2))


def test_eager_flag_prices_the_hugging_face_graph(tiny_llama, h100_file, capsys):
    argv = [
        "estimate",
        "--model",
        str(tiny_llama),
        "--seq",
        "16",
        "--no-packs",
        "--device-file",
        str(h100_file),
        "--json",
    ]
    assert main(argv + ["--eager"]) == 0
    eager = json.loads(capsys.readouterr().out)
    assert main(argv) == 0
    fused = json.loads(capsys.readouterr().out)
    assert eager["workload"]["fuse"] is False and fused["workload"]["fuse"] is True
    assert "aten::silu" in {row["op"] for row in eager["ops"]}
    assert "castcore::silu_and_mul" in {row["op"] for row in fused["ops"]}


def test_a_users_own_module_is_not_rewritten(session, tiny_llama):
    built = session.build(castcore.build_workload(str(tiny_llama), seq=8))
    model = built.model
    before = {name: type(m) for name, m in model.named_modules()}
    session.estimate(model, *built.args, kwargs=built.kwargs)
    assert {name: type(m) for name, m in model.named_modules()} == before


def test_kv_reads_head_reads_grouped_kv_once_per_query_head(session, tiny_llama):
    """A kernel without grouped-KV sharing (TensorRT-LLM's masked MHA before 0.7) reads each K/V head once per
    query head: the same work and the same result, the K/V bytes times the group; by default once per group."""
    step = dict(batch=2, seq=16, phase="decode", kv_len=40)
    grouped, per_head = (
        session.estimate(castcore.build_workload(str(tiny_llama), kv_reads=reads, **step))
        for reads in ("group", "head")
    )
    g, h = (
        [r for r in report.records if r.invoke.name == "castcore::attention"][0]
        for report in (grouped, per_head)
    )
    q, k, v = g.invoke.args[:3]
    assert (q.shape[1], k.shape[1]) == (4, 2)  # a group of two query heads per K/V head
    assert g.invoke.argument("kv_per_query_head") is False and h.invoke.argument("kv_per_query_head") is True
    assert h.properties.memory_read_bytes - g.properties.memory_read_bytes == k.nbytes + v.nbytes
    assert h.properties.flops == g.properties.flops
    assert per_head.time_s > grouped.time_s
    assert "K/V read once per query head" in " ".join(per_head.notes)
    q, k, v = torch.randn(2, 4, 3, 8), torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8)
    args = (q, k, v, 8**-0.5, True, 0, 0.0)
    torch.testing.assert_close(torch.ops.castcore.attention(*args, True), torch.ops.castcore.attention(*args))


def test_kv_reads_head_needs_the_fused_kernel(tiny_llama, h100_file, capsys):
    with pytest.raises(
        castcore.ModelError,
        match="kv_reads='head' describes castcore's fused attention kernel: drop fuse=False",
    ):
        castcore.build_workload(str(tiny_llama), fuse=False, kv_reads="head")
    argv = [
        "estimate",
        "--model",
        str(tiny_llama),
        "--seq",
        "16",
        "--no-packs",
        "--device-file",
        str(h100_file),
    ]
    assert main(argv + ["--kv-reads", "head", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["workload"]["kv_reads"] == "head"
    assert main(argv + ["--kv-reads", "head", "--eager"]) == 2
    assert "drop --eager" in capsys.readouterr().err


def test_gptj_own_attention_and_gelu_new_run_as_single_kernels(session):
    """GPT-J keeps its own attention (no attention interface) and spells gelu_new out op by op; deployed, both are
    one kernel each, and the build's note about its eager attention goes, since that no longer runs."""
    gptj = str(DATA / "tiny-gptj.json")
    fused, eager = (
        session.estimate(castcore.build_workload(gptj, seq=32, fuse=fuse)) for fuse in (True, False)
    )
    names = [r.invoke.name for r in fused.records]
    assert names.count("castcore::attention") == 2 and names.count("aten::gelu") == 2
    assert not {"aten::tanh", "aten::pow.Tensor_Scalar", "aten::_softmax"} & set(names)
    assert "aten::tanh" in {r.invoke.name for r in eager.records}
    assert not any("cannot take castcore's attention path" in n for n in fused.notes)
    # GPT-J calls transformers' attention interface from 5.24 on; before, its own _attn (then the note says so).
    from transformers import GPTJForCausalLM

    own = not supports_attention_backend(GPTJForCausalLM)
    assert any("cannot take castcore's attention path" in n for n in eager.notes) == own
    assert any("the model's own _attn" in n for n in fused.notes) == own
    assert fused.time_s < eager.time_s
    # The causal kernel counts the kept half of the query-key pairs; the eager graph all of them.
    call = next(r for r in fused.records if r.invoke.name == "castcore::attention")
    q = call.invoke.args[0]
    assert (
        sum(c.mma_ops for c in call.properties.compute_ops.values()) == 2 * 4 * 32 * 33 // 2 * 2 * q.shape[-1]
    )
    decode = session.estimate(castcore.build_workload(gptj, batch=2, seq=16, phase="decode", kv_len=40))
    assert [r.invoke.name for r in decode.records].count("castcore::attention") == 2


class _OwnNorms(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.RMSNorm(64, eps=1e-6)
        self.weight = torch.nn.Parameter(torch.ones(64))

    def forward(self, x):
        return torch.nn.functional.rms_norm(self.norm(x), (64,), self.weight, 1e-6)


def test_torchs_own_rms_norm_in_your_module_is_one_kernel_when_deployed(session):
    x = torch.randn(8, 128, 64, dtype=torch.bfloat16)
    model = _OwnNorms().to(torch.bfloat16)
    deployed = session.estimate(castcore.build_workload(model, x))
    eager = session.estimate(castcore.build_workload(model, x, fuse=False))
    assert [r.invoke.name for r in deployed.records] == ["aten::rms_norm", "aten::rms_norm"]
    for record in deployed.records:
        assert record.properties.memory_read_bytes == x.nbytes + 64 * 2  # the input and the weight, once
        assert record.properties.memory_write_bytes == x.nbytes
    assert len(eager.records) > 2 and "aten::rms_norm" not in {r.invoke.name for r in eager.records}
    assert deployed.time_s < eager.time_s
    assert any("composite norms" in note for note in deployed.notes)


def test_one_kernel_writes_a_static_layers_keys_and_values_as_transformers_writes_them():
    from transformers.cache_utils import StaticLayer, StaticSlidingWindowLayer

    from castcore.deploy.kernels.cache_writes import written_once

    prompt = torch.randn(2, 2, 3, 4), torch.randn(2, 2, 3, 4)
    step = torch.randn(2, 2, 1, 4), torch.randn(2, 2, 1, 4)
    caches = []
    for layer in (StaticLayer(max_cache_len=8), written_once(StaticLayer)(max_cache_len=8)):
        layer.update(*prompt)
        caches.append(layer.update(*step))
    for want, got in zip(*caches):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert written_once(StaticLayer) is written_once(
        written_once(StaticLayer)
    )  # made once, not wrapped again
    assert written_once(StaticSlidingWindowLayer) is StaticSlidingWindowLayer  # it rolls its own window
