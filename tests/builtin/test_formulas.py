"""The core's built-in formulas: matrix work checked against torch's FlopCounterMode, causal attention
against an exact pair count, everything else against hand-computed operations and bytes."""

from __future__ import annotations

import math
from typing import NamedTuple

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

import castcore
import castcore.pack
from castcore.builtin.formulas import causal_pairs
from castcore.recording.recorder import capture
from castcore.plugins.claims import claims_of
from castcore.recording.invoke import OpInvoke, TensorMeta
from castcore.deploy.pipeline import build

aten = torch.ops.aten
PROPERTIES = castcore.pack.Source("core", "properties")


class Call(NamedTuple):
    invoke: OpInvoke
    estimate: castcore.Estimate
    props: castcore.PerformanceProperties | None


def run(session, fn, *args) -> list[Call]:
    """Every call ``fn`` makes on fake tensors with the core's answer on the H100 profile (straight
    from the session's resolver, so these tests depend on the formulas and nothing else)."""
    device = session.device("h100-sxm")
    return [
        Call(i, session.resolver.estimate(i, device), session.resolver.properties(i, device)[0])
        for i in capture(fn, *args).invokes
    ]


def the(calls: list[Call], name: str) -> Call:
    """The one call to ``name`` (``aten::mm``, ``aten::add.Tensor``)."""
    found = [c for c in calls if c.invoke.name == name]
    assert len(found) == 1, f"{name}: {[c.invoke.name for c in calls]}"
    assert found[0].estimate.source == PROPERTIES, found[0].estimate.source
    return found[0]


def meta(*shape, dtype=torch.float32):
    return torch.empty(*shape, dtype=dtype, device="meta")


def mma(calls: list[Call]) -> float:
    return sum(ops.mma_ops for c in calls if c.props for ops in c.props.compute_ops.values())


def gp(call: Call, dtype=torch.float32) -> float:
    ops = call.props.compute_ops.get(dtype)
    return ops.gp_ops if ops else 0


def counted(fn, *shapes, backend=None) -> int:
    """torch's own FlopCounterMode total for fn on real small tensors of these shapes."""
    torch.manual_seed(0)
    real = [torch.randn(*s) for s in shapes]
    with FlopCounterMode(display=False) as counter:
        if backend is None:
            fn(*real)
        else:
            with sdpa_kernel(backend):
                fn(*real)
    return counter.get_total_flops()


# ---- matrix products and convolutions: castcore's mma ops == FlopCounterMode's FLOPs ----

MATRIX_CASES = {
    "mm": (torch.mm, [(32, 48), (48, 24)]),
    "bmm": (torch.bmm, [(4, 8, 16), (4, 16, 12)]),
    "addmm": (torch.addmm, [(24,), (32, 48), (48, 24)]),
    "baddbmm": (torch.baddbmm, [(4, 8, 12), (4, 8, 16), (4, 16, 12)]),
    "linear": (F.linear, [(2, 5, 16), (24, 16), (24,)]),
    "linear-no-bias": (F.linear, [(2, 5, 16), (24, 16)]),
    "matmul-broadcast": (torch.matmul, [(2, 3, 8, 16), (16, 4)]),
    "conv1d": (lambda x, w: F.conv1d(x, w, stride=2, padding=1), [(2, 4, 32), (6, 4, 5)]),
    "conv2d": (
        lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1, dilation=2, groups=2),
        [(2, 4, 17, 15), (6, 2, 3, 3), (6,)],
    ),
    "conv2d-depthwise": (lambda x, w: F.conv2d(x, w, padding=1, groups=8), [(1, 8, 10, 10), (8, 1, 3, 3)]),
    "conv-transpose2d": (lambda x, w: F.conv_transpose2d(x, w, stride=2), [(2, 4, 8, 8), (4, 3, 3, 3)]),
    "conv3d": (F.conv3d, [(1, 2, 6, 6, 6), (4, 2, 3, 3, 3)]),
}


@pytest.mark.parametrize("case", MATRIX_CASES)
def test_matrix_work_matches_flop_counter(session, case):
    fn, shapes = MATRIX_CASES[case]
    calls = run(session, fn, *(meta(*s) for s in shapes))
    assert mma(calls) == counted(fn, *shapes) > 0


def test_convolution_backward_is_twice_the_forward_and_matches_flop_counter(session):
    def train_step(x, w):
        with torch.enable_grad():
            x, w = x.requires_grad_(), w.requires_grad_()
            F.conv2d(x, w, padding=1).sum().backward()

    shapes = [(2, 4, 8, 8), (6, 4, 3, 3)]
    calls = run(session, train_step, *(meta(*s) for s in shapes))
    forward = mma([the(calls, "aten::convolution")])
    assert mma([the(calls, "aten::convolution_backward")]) == 2 * forward
    assert mma(calls) == counted(train_step, *shapes) == 3 * forward


def test_scaled_mm_counts_in_the_fp8_input_dtype(session):
    a, b = meta(64, 32, dtype=torch.float8_e4m3fn), meta(48, 32, dtype=torch.float8_e4m3fn)
    scale = meta(1)
    call = the(
        run(session, lambda a, b, s: aten._scaled_mm(a, b.t(), s, s, out_dtype=torch.bfloat16), a, b, scale),
        "aten::_scaled_mm",
    )
    assert call.props.compute_ops[torch.float8_e4m3fn].mma_ops == 2 * 64 * 48 * 32
    assert call.props.memory_read_bytes == 64 * 32 + 48 * 32 + 2 * 4
    assert call.props.memory_write_bytes == 64 * 48 * 2


@pytest.mark.parametrize(
    "a, b, groups",
    [
        ((32, 16), (4, 16, 24), 4),  # 2-D x 3-D: ragged token groups, one expert weight each
        ((4, 8, 16), (4, 16, 24), None),  # 3-D x 3-D: batched
        ((8, 16), (16, 24), 4),  # 2-D x 2-D: groups split K (a weight gradient)
    ],
)
def test_grouped_mm_counts_each_group_once(session, a, b, groups):
    offs = None if groups is None else torch.empty(groups, dtype=torch.int32, device="meta")
    call = the(
        run(
            session,
            lambda a, b, o: aten._grouped_mm(a, b, o),
            meta(*a, dtype=torch.bfloat16),
            meta(*b, dtype=torch.bfloat16),
            offs,
        ),
        "aten::_grouped_mm",
    )
    m = a[-2] if len(a) == 2 else a[0] * a[1]
    assert call.props.compute_ops[torch.bfloat16].mma_ops == 2 * m * a[-1] * b[-1]


# ---- attention ----

B, H, S, D = 2, 4, 16, 8
SDPA_CASES = {
    "self": ([(B, H, S, D)] * 3, {}),
    "cross": ([(B, H, 12, D), (B, H, 20, D), (B, H, 20, D)], {}),
    "gqa": ([(B, 8, S, D), (B, 2, S, D), (B, 2, S, D)], {"enable_gqa": True}),
}


@pytest.mark.parametrize("case", SDPA_CASES)
def test_non_causal_attention_matches_flop_counter(session, case):
    shapes, kwargs = SDPA_CASES[case]

    def attention(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, **kwargs)

    calls = run(session, attention, *(meta(*s) for s in shapes))
    assert any("scaled_dot_product" in c.invoke.name for c in calls)
    assert mma(calls) == counted(attention, *shapes, backend=SDPBackend.MATH) > 0


@pytest.mark.parametrize("q_len, kv_len", [(16, 16), (7, 16), (16, 7), (1, 9), (33, 33)])
def test_causal_attention_counts_exactly_the_unmasked_pairs(session, q_len, kv_len):
    q, k = meta(B, H, q_len, D), meta(B, H, kv_len, D)
    calls = run(session, lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), q, k, k)
    kept = int(torch.ones(q_len, kv_len).tril().sum())  # torch's is_causal mask: upper-left aligned
    assert mma(calls) == 2 * B * H * kept * (D + D)
    full = run(session, F.scaled_dot_product_attention, q, k, k)
    if q_len == kv_len:
        assert mma(calls) / mma(full) == pytest.approx(0.5, abs=0.5 / q_len + 1e-9)


def test_causal_gqa_follows_query_heads_and_reads_kv_at_its_own_size(session):
    def attention(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    gqa = run(session, attention, meta(B, 8, S, D), meta(B, 2, S, D), meta(B, 2, S, D))
    mha = run(session, attention, meta(B, 8, S, D), meta(B, 8, S, D), meta(B, 8, S, D))
    assert mma(gqa) == mma(mha) == 2 * B * 8 * (S * (S + 1) // 2) * 2 * D
    (g,), (m,) = [[c for c in calls if c.props.flops] for calls in (gqa, mha)]
    assert m.props.memory_read_bytes - g.props.memory_read_bytes == 2 * B * 6 * S * D * 4


def _cpu_attention_step(causal):
    def step(q, k, v):
        with torch.enable_grad():
            q, k, v = (t.requires_grad_() for t in (q, k, v))
            F.scaled_dot_product_attention(q, k, v, is_causal=causal).sum().backward()

    return step


@pytest.mark.parametrize("causal", [False, True])
def test_attention_backward_is_five_products_over_the_kept_pairs(session, causal):
    calls = run(session, _cpu_attention_step(causal), *[meta(B, H, S, D)] * 3)
    forward = mma([the(calls, "aten::_scaled_dot_product_flash_attention_for_cpu")])
    backward = the(calls, "aten::_scaled_dot_product_flash_attention_for_cpu_backward")
    pairs = S * (S + 1) // 2 if causal else S * S
    assert forward == 2 * B * H * pairs * 2 * D
    assert mma([backward]) == 2.5 * forward  # recompute QK^T, dV, dP, dQ, dK
    assert gp(backward) > 0


def _sdpa_kernels():
    """The CUDA SDPA kernels' forward and backward, run straight on their aten ops (meta kernels exist)."""

    def flash(q, k, v):
        out, lse, cq, ck, mq, mk, seed, offset, _ = aten._scaled_dot_product_flash_attention(q, k, v)
        aten._scaled_dot_product_flash_attention_backward(
            out, q, k, v, out, lse, cq, ck, mq, mk, 0.0, False, seed, offset
        )

    def efficient(q, k, v):
        out, lse, seed, offset = aten._scaled_dot_product_efficient_attention(q, k, v, None, True)
        aten._scaled_dot_product_efficient_attention_backward(
            out, q, k, v, None, out, lse, seed, offset, 0.0, [True, True, True, False]
        )

    def cudnn(q, k, v):
        out, lse, cq, ck, mq, mk, seed, offset, _ = aten._scaled_dot_product_cudnn_attention(
            q, k, v, None, True
        )
        aten._scaled_dot_product_cudnn_attention_backward(
            out, q, k, v, out, lse, seed, offset, None, cq, ck, mq, mk, 0.0, False
        )

    return {"flash": flash, "efficient": efficient, "cudnn": cudnn}


@pytest.mark.parametrize("kernel", ["flash", "efficient", "cudnn"])
def test_cuda_attention_kernels_forward_and_backward_match_flop_counter(session, kernel):
    fn = _sdpa_kernels()[kernel]
    q = meta(B, H, S, D, dtype=torch.float16)
    calls = run(session, fn, q, q, q)
    assert len([c for c in calls if c.props and c.props.flops]) == 2
    with FlopCounterMode(display=False) as counter:
        fn(q, q, q)  # the counter has formulas for these ops and runs them on meta tensors
    assert mma(calls) == counter.get_total_flops() == 3.5 * 2 * B * H * S * S * 2 * D


@pytest.mark.parametrize("mask_type, bottom_right", [(0, None), (1, False), (2, True)])
def test_kernel_layout_attention_reads_batch_seq_heads_and_xformers_mask_types(
    session, mask_type, bottom_right
):
    q_len, kv_len = 6, 10
    q, k = meta(B, q_len, H, D, dtype=torch.float16), meta(B, kv_len, H, D, dtype=torch.float16)

    def xformers(q, k, v):
        aten._efficient_attention_forward(q, k, v, None, None, None, q_len, kv_len, 0.0, mask_type, True)

    pairs = (
        q_len * kv_len
        if bottom_right is None
        else int(torch.ones(q_len, kv_len).tril(kv_len - q_len if bottom_right else 0).sum())
    )
    assert mma(run(session, xformers, q, k, k)) == 2 * B * H * pairs * 2 * D


def test_flash_kernel_forward_and_backward_in_batch_seq_heads_layout(session):
    def flash(q, k, v):
        out, lse, rng, unused, _ = aten._flash_attention_forward(q, k, v, None, None, S, S, 0.0, True, False)
        aten._flash_attention_backward(out, q, k, v, out, lse, None, None, S, S, 0.0, True, rng, unused)

    q = meta(B, S, H, D, dtype=torch.float16)
    forward = 2 * B * H * (S * (S + 1) // 2) * 2 * D
    assert mma(run(session, flash, q, q, q)) == forward + 2.5 * forward


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 40), st.integers(0, 40), st.booleans())
def test_causal_pairs_equals_the_mask_count(q_len, kv_len, bottom_right):
    mask = torch.ones(q_len, kv_len).tril(kv_len - q_len if bottom_right else 0)
    assert causal_pairs(q_len, kv_len, bottom_right) == int(mask.sum())


# ---- pointwise: vector ops per element from the documented table ----

POINTWISE = [
    ("add", lambda x: x + x, 1),
    ("relu", torch.relu, 1),
    ("div", lambda x: x / (x + 1), 2),
    ("rsqrt", torch.rsqrt, 2),
    ("sqrt", torch.sqrt, 2),
    ("exp", torch.exp, 4),
    ("log", torch.log, 4),
    ("erf", torch.erf, 4),
    ("sin", torch.sin, 4),
    ("cos", torch.cos, 4),
    ("sigmoid", torch.sigmoid, 7),
    ("tanh", torch.tanh, 8),
    ("silu", F.silu, 8),
    ("gelu", F.gelu, 8),
    ("gelu-tanh", lambda x: F.gelu(x, approximate="tanh"), 15),
    ("square", lambda x: x**2, 1),
    ("cube", lambda x: x**3, 2),
    ("root", lambda x: x**0.5, 2),
    ("pow-general", lambda x: x**1.7, 9),
    ("pow-tensor", lambda x: x**x, 9),
]


@pytest.mark.parametrize("name, fn, per_element", POINTWISE, ids=[p[0] for p in POINTWISE])
def test_pointwise_ops_per_element(session, name, fn, per_element):
    calls = [c for c in run(session, fn, meta(8, 32, dtype=torch.bfloat16)) if c.props.flops]
    last = calls[-1]
    assert last.estimate.source == PROPERTIES
    assert gp(last, torch.bfloat16) == per_element * 8 * 32


def test_pointwise_broadcast_bytes_and_comparison_dtype(session):
    add = the(run(session, torch.add, meta(4, 1, 8), meta(1, 3, 8)), "aten::add.Tensor")
    assert gp(add) == 4 * 3 * 8
    assert (add.props.memory_read_bytes, add.props.memory_write_bytes) == ((32 + 24) * 4, 96 * 4)
    gt = the(
        run(session, torch.gt, meta(64, dtype=torch.bfloat16), meta(64, dtype=torch.bfloat16)),
        "aten::gt.Tensor",
    )
    assert set(gt.props.compute_ops) == {torch.bfloat16}  # the work is on bf16, not on the bool result
    assert gt.props.memory_write_bytes == 64


@pytest.mark.parametrize(
    "fn",
    [
        lambda x, m: x.masked_fill(m, 0.0),
        lambda x, m: x.masked_fill_(m, 0.0),
        lambda x, m: x.masked_fill(m, torch.tensor(1.0)),
        lambda x, m: x.gt_(0.5),
    ],
    ids=["masked_fill.Scalar (tagged)", "masked_fill_", "masked_fill.Tensor", "gt_"],
)
def test_untagged_overloads_of_pointwise_families_are_pointwise(session, fn):
    calls = run(session, fn, meta(16, 16), meta(16, 16, dtype=torch.bool))
    last = calls[-1]
    assert last.estimate.source == PROPERTIES and gp(last) == 256


# ---- reductions, softmax, normalisation ----


def test_reductions(session):
    x = meta(8, 32)
    total = the(run(session, lambda x: x.sum(-1), x), "aten::sum.dim_IntList")
    assert gp(total) == 256 and total.props.memory_read_bytes == 1024 and total.props.memory_write_bytes == 32
    assert gp(the(run(session, lambda x: x.mean(-1), x), "aten::mean.dim")) == 256 + 8
    assert (
        gp(the(run(session, lambda x: torch.var_mean(x, -1), x), "aten::var_mean.correction"))
        == 4 * 256 + 2 * 8
    )
    argmax = the(run(session, lambda x: x.argmax(-1), x), "aten::argmax")
    assert gp(argmax) == 256 and argmax.props.memory_write_bytes == 8 * 8
    largest = the(run(session, lambda x: x.max(-1), x), "aten::max.dim")
    assert largest.props.memory_write_bytes == 8 * 4 + 8 * 8  # values and int64 indices
    assert gp(the(run(session, torch.amax, x), "aten::amax")) == 256


def test_softmax_and_its_backward(session):
    def step(x):
        with torch.enable_grad():
            x = x.requires_grad_()
            (x.softmax(-1).sum() + x.log_softmax(-1).sum()).backward()

    calls = run(session, step, meta(8, 32))
    for name, per_element in [
        ("aten::_softmax", 8),
        ("aten::_log_softmax", 8),
        ("aten::_softmax_backward_data", 4),
        ("aten::_log_softmax_backward_data", 7),
    ]:
        call = the(calls, name)
        assert gp(call) == per_element * 256, name
        assert call.props.memory_write_bytes == 1024


def test_layer_group_and_batch_norm(session):
    x, w = meta(4, 16, 32), meta(32)
    ln = the(run(session, lambda x, w, b: F.layer_norm(x, (32,), w, b), x, w, w), "aten::native_layer_norm")
    assert gp(ln) == (6 + 2) * x.numel()
    assert ln.props.memory_read_bytes == (x.numel() + 2 * 32) * 4
    assert ln.props.memory_write_bytes == (x.numel() + 2 * 64) * 4  # output, mean and rstd per row
    image, c = meta(2, 8, 4, 4), meta(8)
    gn = the(run(session, lambda x: F.group_norm(x, 2), image), "aten::native_group_norm")
    assert gp(gn) == 6 * image.numel()

    def batch_norm(training):
        calls = run(
            session, lambda x, w, b, m, v: F.batch_norm(x, m, v, w, b, training=training), image, c, c, c, c
        )
        return [gp(call) for call in calls if call.props.flops]

    train, infer = batch_norm(True), batch_norm(False)
    assert train == [(4 + 2 + 2) * image.numel()]
    assert infer == [(2 + 2) * image.numel()]


@pytest.mark.parametrize(
    "op, outputs",
    [
        (
            aten._fused_rms_norm.default,
            (TensorMeta((4, 32), torch.bfloat16), TensorMeta((4, 1), torch.float32)),
        ),
        (aten.rms_norm.default, TensorMeta((4, 32), torch.bfloat16)),
    ],
)
def test_rms_norm_ops_that_cpu_decomposes(session, op, outputs):
    # CPU decomposes these before dispatch; an accelerator's capture sees them whole.
    x, w = TensorMeta((4, 32), torch.bfloat16), TensorMeta((32,), torch.bfloat16)
    invoke = OpInvoke(op=op, args=(x, (32,), w, 1e-6), out=outputs)
    props, source = session.resolver.properties(invoke, session.device("h100-sxm"))
    assert source == PROPERTIES
    assert props.compute_ops[torch.bfloat16].gp_ops == (2 + 1 + 1) * 128
    assert props.memory_read_bytes == (128 + 32) * 2


# ---- gathers and scatters: bytes of what is touched ----


def test_gathers_read_only_the_gathered_rows(session):
    table, ids = meta(1000, 64), torch.zeros(2, 8, dtype=torch.long, device="meta")
    for name, fn in [
        ("aten::embedding", lambda t, i: F.embedding(i, t)),
        ("aten::index.Tensor", lambda t, i: t[i]),
    ]:
        call = the(run(session, fn, table, ids), name)
        assert call.props.memory_read_bytes == 16 * 8 + 16 * 64 * 4, name
        assert call.props.memory_write_bytes == 16 * 64 * 4
    flat = ids.view(16)
    pick = the(run(session, lambda t, i: t.index_select(0, i), table, flat), "aten::index_select")
    assert pick.props.memory_read_bytes == 16 * 8 + 16 * 64 * 4
    index = torch.zeros(1000, 3, dtype=torch.long, device="meta")
    picked = the(run(session, lambda t, i: t.gather(1, i), table, index), "aten::gather")
    assert picked.props.memory_read_bytes == 3000 * 8 + 3000 * 4


def test_scatters_write_what_they_touch(session):
    x, index, src = meta(4, 32), torch.zeros(4, 5, dtype=torch.long, device="meta"), meta(4, 5)
    add = the(run(session, lambda x, i, s: x.scatter_add(1, i, s), x, index, src), "aten::scatter_add")
    # copy self (512 B), read the index (160 B), the source (80 B) and the 20 targets it adds to (80 B)
    assert (add.props.memory_read_bytes, add.props.memory_write_bytes) == (512 + 160 + 80 + 80, 512 + 80)
    assert gp(add) == 20
    rows = torch.zeros(3, dtype=torch.long, device="meta")

    def put(x, i, v):
        x[i] = v

    call = the(run(session, put, meta(10, 16), rows, meta(3, 16)), "aten::index_put_")
    assert (call.props.memory_read_bytes, call.props.memory_write_bytes) == (3 * 8 + 48 * 4, 48 * 4)


def test_embedding_backward_writes_the_table_once_and_touched_rows(session):
    def step(table, ids):
        with torch.enable_grad():
            F.embedding(ids, table.requires_grad_()).sum().backward()

    call = the(
        run(session, step, meta(1000, 64), torch.zeros(16, dtype=torch.long, device="meta")),
        "aten::embedding_dense_backward",
    )
    rows = 16 * 64 * 4
    assert (call.props.memory_read_bytes, call.props.memory_write_bytes) == (
        rows + 16 * 8 + rows,
        1000 * 64 * 4 + rows,
    )
    assert gp(call) == 16 * 64


# ---- data movement, scans, sorting, factories ----


def test_data_movement_is_memory_only(session):
    a, b = meta(8, 16), meta(8, 16)
    cat = the(run(session, lambda a, b: torch.cat([a, b]), a, b), "aten::cat")
    assert (cat.props.flops, cat.props.memory_read_bytes, cat.props.memory_write_bytes) == (0, 1024, 1024)
    cast = the(run(session, lambda a: a.to(torch.bfloat16), a), "aten::_to_copy")
    assert (cast.props.memory_read_bytes, cast.props.memory_write_bytes) == (512, 256)
    copy = the(run(session, lambda a, b: a.copy_(b[0]), a, b), "aten::copy_")
    assert (copy.props.memory_read_bytes, copy.props.memory_write_bytes) == (64, 512)  # dst is not read


def test_set_and_in_place_view_changes_move_nothing(session):
    def rebind(x):
        y = torch.empty(0)
        y.set_(x), y.set_(x.untyped_storage()), y.set_(x.untyped_storage(), 0, (4, 4), (4, 1)), y.set_()
        x.t_(), x.transpose_(0, 1), x.unsqueeze_(0), x.squeeze_(0), x.squeeze_(), aten.squeeze_.dims(x, [0])
        x.as_strided_((2, 2), (1, 2)), aten.unsafe_split.Tensor(x, 1), aten.lift(x)

    calls = [c for c in run(session, rebind, meta(4, 4)) if c.invoke.name != "aten::empty.memory_format"]
    assert {c.invoke.name for c in calls} == {
        "aten::set_.source_Tensor",
        "aten::set_.source_Storage",
        "aten::set_.source_Storage_storage_offset",
        "aten::set_",
        "aten::t_",
        "aten::transpose_",
        "aten::unsqueeze_",
        "aten::squeeze_.dim",
        "aten::squeeze_",
        "aten::squeeze_.dims",
        "aten::as_strided_",
        "aten::unsafe_split.Tensor",
        "aten::lift",
    }
    for call in calls:
        assert call.estimate.source == PROPERTIES, call.invoke.name
        assert (call.props.memory_bytes, call.props.flops, call.estimate.time_s) == (0, 0, 0), (
            call.invoke.name
        )


def answered(session, op, args, out) -> Call:
    """The core's answer for one call of ``op`` built by hand: for ops eager code never dispatches on the CPU
    (a backend's _copy_from) or that fake tensors cannot run (.item())."""
    invoke = OpInvoke(op, tuple(args), {}, out)
    device = session.device("h100-sxm")
    call = Call(
        invoke, session.resolver.estimate(invoke, device), session.resolver.properties(invoke, device)[0]
    )
    assert call.estimate.source == PROPERTIES, call.estimate.source
    return call


def test_copies_read_their_source_and_write_their_result(session):
    big, row = TensorMeta((8, 16), torch.float32), TensorMeta((16,), torch.float32)
    # self's shape, filled from src
    copied = the(run(session, aten.copy, meta(8, 16), meta(16)), "aten::copy")
    assert (copied.props.memory_read_bytes, copied.props.memory_write_bytes) == (64, 512)
    moved = answered(session, aten._copy_from.default, (row, big), big)  # self copied into dst
    assert (moved.props.memory_read_bytes, moved.props.memory_write_bytes) == (64, 512)
    empty = TensorMeta((0,), torch.float32)
    grown = answered(session, aten._copy_from_and_resize.default, (big, empty), big)
    assert (grown.props.memory_read_bytes, grown.props.memory_write_bytes) == (512, 512)
    item = answered(session, aten._local_scalar_dense.default, (TensorMeta((), torch.float32),), 1.0)
    assert (item.props.memory_read_bytes, item.props.memory_write_bytes) == (4, 0)
    # The functional resize clones self (then resizes the clone's metadata).
    for name, fn, args in [
        ("aten::resize", lambda x: aten.resize(x, [4, 8]), (meta(8, 16),)),
        ("aten::resize_as", aten.resize_as, (meta(8, 16), meta(2, 2))),
    ]:
        call = the(run(session, fn, *args), name)
        assert (call.props.memory_read_bytes, call.props.memory_write_bytes, call.props.flops) == (
            512,
            512,
            0,
        ), name


VIEW_COPIES = [  # (op, call on an 8x8 float32, bytes read, bytes written)
    ("aten::select_copy.int", lambda x: aten.select_copy.int(x, 0, 1), 32, 32),
    ("aten::diagonal_copy", aten.diagonal_copy, 32, 32),
    ("aten::narrow_copy", lambda x: aten.narrow_copy(x, 1, 0, 3), 96, 96),
    ("aten::transpose_copy.int", lambda x: aten.transpose_copy.int(x, 0, 1), 256, 256),
    ("aten::unfold_copy", lambda x: aten.unfold_copy(x, 1, 4, 1), 256, 8 * 5 * 4 * 4),  # windows overlap
    ("aten::split_copy.Tensor", lambda x: aten.split_copy.Tensor(x, 3), 256, 256),
    ("aten::unbind_copy.int", aten.unbind_copy.int, 256, 256),
    ("aten::view_copy.dtype", lambda x: aten.view_copy.dtype(x, torch.int32), 256, 256),
    ("aten::squeeze_copy.dim", lambda x: aten.squeeze_copy.dim(x[None], 0), 256, 256),
]


@pytest.mark.parametrize("name, fn, read, written", VIEW_COPIES, ids=[c[0] for c in VIEW_COPIES])
def test_view_copies_read_what_the_view_selects(session, name, fn, read, written):
    call = the(run(session, fn, meta(8, 8)), name)
    assert (call.props.memory_read_bytes, call.props.memory_write_bytes, call.props.flops) == (
        read,
        written,
        0,
    )


def test_nearest_upsampling_copies_and_its_backward_adds(session):
    def step(x):
        with torch.enable_grad():
            F.interpolate(x.requires_grad_(), scale_factor=2, mode="nearest").sum().backward()

    calls = run(session, step, meta(1, 2, 4, 4))
    up = the(calls, "aten::upsample_nearest2d")
    assert (up.props.memory_read_bytes, up.props.memory_write_bytes, up.props.flops) == (128, 512, 0)
    back = the(calls, "aten::upsample_nearest2d_backward")
    assert (back.props.memory_read_bytes, back.props.memory_write_bytes, gp(back)) == (512, 128, 128)


@pytest.mark.parametrize(
    "mode, gp_ops, written",
    [("sum", 80, 64 + 16 + 16), ("mean", 80 + 2 * 16, 64 + 80 + 16 + 16), ("max", 80, 64 + 80 + 16 + 128)],
)
def test_embedding_bag_gathers_its_rows_and_folds_them(session, mode, gp_ops, written):
    # 2 bags of 5 indices into a 100 x 8 float32 table: 10 rows of 32 B gathered; mean divides the 16 outputs.
    def step(table, ids, offsets):
        with torch.enable_grad():
            F.embedding_bag(ids, table.requires_grad_(), offsets, mode=mode).sum().backward()

    calls = run(session, step, meta(100, 8), _long(10), _long(2))
    bag = the(calls, "aten::_embedding_bag")
    assert (bag.props.memory_read_bytes, bag.props.memory_write_bytes, gp(bag)) == (
        80 + 16 + 320,
        written,
        gp_ops,
    )
    back = the(calls, "aten::_embedding_bag_backward")
    added = 16 if mode == "max" else 80  # max sends each output to the one row that won it
    assert back.props.memory_write_bytes == 100 * 8 * 4 + added * 4 and gp(back) == added
    assert back.props.memory_read_bytes == sum(t.nbytes for t in back.invoke.inputs()) + added * 4


def test_lstm_layer_is_its_gate_products_and_cells(session):
    # nn.LSTM(8, 16) over 5 steps of batch 3 runs one fused CPU layer: 15 rows of x W_ih^T (64 x 8) and
    # h W_hh^T (64 x 16); each of the 64 gate values gets two biases, each of the 16 units one cell.
    from castcore.builtin.formulas.matmul import LSTM_CELL, LSTM_CELL_BACKWARD

    lstm = torch.nn.LSTM(8, 16)

    def step(x):
        with torch.enable_grad():
            lstm(x.requires_grad_())[0].sum().backward()

    calls = run(session, step, meta(5, 3, 8))
    layer = the(calls, "aten::mkldnn_rnn_layer")
    assert mma([layer]) == 2 * 15 * 64 * (8 + 16)
    assert gp(layer) == 15 * (3 * 64 + LSTM_CELL * 16)
    back = the(calls, "aten::mkldnn_rnn_layer_backward")
    assert mma([back]) == 2 * mma([layer]) and gp(back) == 15 * (64 + LSTM_CELL_BACKWARD * 16)


def test_scans_sorts_and_selection(session):
    x = meta(4, 64)
    assert gp(the(run(session, lambda x: x.cumsum(-1), x), "aten::cumsum")) == 256
    ordered = the(run(session, lambda x: x.sort(-1), x), "aten::sort")
    assert gp(ordered) == 4 * 64 * 6  # n log2 n compares per row
    assert ordered.props.memory_write_bytes == 256 * 4 + 256 * 8
    assert gp(the(run(session, lambda x: x.topk(8), x), "aten::topk")) == 4 * 64 * 3  # n log2 k


def test_fills_write_only_and_empty_is_free(session):
    zeros = the(run(session, lambda: torch.zeros(64, 64)), "aten::zeros")
    assert (zeros.props.memory_read_bytes, zeros.props.memory_write_bytes, zeros.props.flops) == (
        0,
        64 * 64 * 4,
        0,
    )
    empty = the(run(session, lambda: torch.empty(64, 64)), "aten::empty.memory_format")
    assert empty.props.memory_bytes == 0 and empty.estimate.time_s == 0


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(0, 5), st.integers(0, 9), st.integers(0, 9))
def test_no_formula_answers_negative_or_nan_on_edge_shapes(session, rows, cols, k):
    x = meta(rows, cols)
    k = min(k, cols)

    def many(x):
        x.sort(-1), x.topk(k), x.cumsum(-1), x.softmax(-1), x.sum(-1), torch.var_mean(x, -1), torch.exp(x)
        F.scaled_dot_product_attention(x[None, None], x[None, None], x[None, None], is_causal=True)

    for call in run(session, many, x):  # the resolver refuses nonsense, so reaching here is the check
        assert call.props is not None and call.props.problems() == []


# ---- coverage: common aten ops are answered by a formula, not the fallback ----


def _long(*shape):
    return torch.zeros(*shape, dtype=torch.long, device="meta")


COMMON = [
    ("aten::mm", torch.mm, (meta(4, 8), meta(8, 4))),
    ("aten::bmm", torch.bmm, (meta(2, 4, 8), meta(2, 8, 4))),
    ("aten::addmm", torch.addmm, (meta(4), meta(4, 8), meta(8, 4))),
    ("aten::baddbmm", torch.baddbmm, (meta(2, 4, 4), meta(2, 4, 8), meta(2, 8, 4))),
    ("aten::convolution", F.conv2d, (meta(1, 2, 6, 6), meta(3, 2, 3, 3))),
    (
        "aten::_scaled_dot_product_flash_attention_for_cpu",
        F.scaled_dot_product_attention,
        (meta(1, 2, 4, 8),) * 3,
    ),
    ("aten::add.Tensor", torch.add, (meta(4), meta(4))),
    ("aten::mul.Tensor", torch.mul, (meta(4), meta(4))),
    ("aten::sub.Tensor", torch.sub, (meta(4), meta(4))),
    ("aten::div.Tensor", torch.div, (meta(4), meta(4))),
    ("aten::exp", torch.exp, (meta(4),)),
    ("aten::rsqrt", torch.rsqrt, (meta(4),)),
    ("aten::silu", F.silu, (meta(4),)),
    ("aten::gelu", F.gelu, (meta(4),)),
    ("aten::tanh", torch.tanh, (meta(4),)),
    ("aten::pow.Tensor_Scalar", lambda x: x.pow(2), (meta(4),)),
    ("aten::neg", torch.neg, (meta(4),)),
    ("aten::where.self", torch.where, (meta(4, dtype=torch.bool), meta(4), meta(4))),
    ("aten::masked_fill.Scalar", lambda x, m: x.masked_fill(m, 0), (meta(4), meta(4, dtype=torch.bool))),
    ("aten::sum.dim_IntList", lambda x: x.sum(-1), (meta(4, 4),)),
    ("aten::mean.dim", lambda x: x.mean(-1), (meta(4, 4),)),
    ("aten::amax", torch.amax, (meta(4, 4),)),
    ("aten::max.dim", lambda x: x.max(-1), (meta(4, 4),)),
    ("aten::argmax", torch.argmax, (meta(4, 4),)),
    ("aten::var_mean.correction", torch.var_mean, (meta(4, 4),)),
    ("aten::_softmax", lambda x: x.softmax(-1), (meta(4, 4),)),
    ("aten::_log_softmax", lambda x: x.log_softmax(-1), (meta(4, 4),)),
    ("aten::native_layer_norm", lambda x: F.layer_norm(x, (4,)), (meta(4, 4),)),
    ("aten::native_group_norm", lambda x: F.group_norm(x, 2), (meta(2, 4, 3),)),
    ("aten::embedding", F.embedding, (_long(3), meta(10, 4))),
    ("aten::index_select", lambda x, i: x.index_select(0, i), (meta(10, 4), _long(3))),
    ("aten::gather", lambda x, i: x.gather(1, i), (meta(4, 4), _long(4, 2))),
    ("aten::index.Tensor", lambda x, i: x[i], (meta(10, 4), _long(3))),
    ("aten::scatter.src", lambda x, i, s: x.scatter(1, i, s), (meta(4, 4), _long(4, 2), meta(4, 2))),
    ("aten::cat", lambda a, b: torch.cat([a, b]), (meta(4), meta(4))),
    ("aten::stack", lambda a, b: torch.stack([a, b]), (meta(4), meta(4))),
    ("aten::clone", torch.clone, (meta(4),)),
    ("aten::_to_copy", lambda x: x.half(), (meta(4),)),
    ("aten::cumsum", lambda x: x.cumsum(0), (meta(4),)),
    ("aten::sort", lambda x: x.sort(), (meta(4),)),
    ("aten::topk", lambda x: x.topk(2), (meta(4),)),
    ("aten::constant_pad_nd", lambda x: F.pad(x, (1, 1)), (meta(4),)),
    ("aten::max_pool2d_with_indices", lambda x: F.max_pool2d(x, 2), (meta(1, 1, 4, 4),)),
    ("aten::nll_loss_forward", F.nll_loss, (meta(4, 5), _long(4))),
    ("aten::tril", torch.tril, (meta(4, 4),)),
    ("aten::zeros", lambda: torch.zeros(4), ()),
    ("aten::floor_divide", lambda x: x // 2, (_long(4),)),
    ("aten::histc", lambda x: x.histc(4), (meta(8),)),
    ("aten::hardswish", F.hardswish, (meta(4),)),
]


@pytest.mark.parametrize("name, fn, args", COMMON, ids=[c[0] for c in COMMON])
def test_common_op_is_answered_by_a_formula(session, name, fn, args):
    assert the(run(session, fn, *args), name).estimate.source == PROPERTIES


@pytest.mark.parametrize("config", ["tiny-llama.json", "tiny-mixtral.json"])
def test_tiny_models_prefill_and_training_step_never_fall_back(session, tiny_llama, config):
    from castcore.workload.spec import build_workload

    workload = build(build_workload(str(tiny_llama.parent / config), batch=2, seq=16))
    model = workload.model

    class TrainStep(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids):
            with torch.enable_grad():
                logits = self.model(input_ids=input_ids, use_cache=False).logits
                F.cross_entropy(logits.flatten(0, 1).float(), input_ids.flatten()).backward()

    for target, args, kwargs in [
        (model, (), workload.kwargs),
        (TrainStep(), (workload.kwargs["input_ids"],), {}),
    ]:
        device = session.device("h100-sxm")
        invokes = capture(target, *args, **kwargs).invokes
        fallen = {i.name for i in invokes if session.resolver.estimate(i, device).source.step == "fallback"}
        assert fallen == set()


def test_the_core_claims_each_op_once():
    ops = [c.op for c in claims_of("castcore.builtin.formulas")]
    assert len(ops) > 100
    assert len(ops) == len(set(ops))


def test_conv_flops_formula_reads_like_the_brief():
    # 2 * N * C_out * prod(out spatial) * (C_in / groups) * prod(kernel), on a hand-sized case.
    from castcore.builtin.formulas.matmul import conv_mma

    x, w, out = (
        TensorMeta((2, 4, 9, 9), torch.float32),
        TensorMeta((6, 2, 3, 3), torch.float32),
        TensorMeta((2, 6, 7, 7), torch.float32),
    )
    assert conv_mma(x, w, out, transposed=False) == 2 * 2 * 6 * 49 * 2 * 9
    assert math.isfinite(conv_mma(x, w, out, transposed=True))
