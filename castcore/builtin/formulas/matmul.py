"""Matrix products, convolutions and LSTM layers: 2 operations per multiply-add on the matrix unit."""

from __future__ import annotations

import math

import torch

from castcore.builtin.formulas.pointwise import SIGMOID, TANH
from castcore.devices.costs import PerformanceProperties
from castcore.plugins.claims import register_op_properties
from castcore.recording import routing
from castcore.recording.invoke import OpInvoke

aten = torch.ops.aten


def matmul_properties(invoke: OpInvoke, a, extra_gp_per_output: int = 0) -> PerformanceProperties:
    """2*M*N*K per (broadcast) batch: the output's element count times the shared dim K = a.shape[-1]. The
    product's shape rides along for tiled timing: a 2-D weight makes one GEMM of every leading row."""
    out = invoke.outputs()[0]
    props = invoke.memory_access_properties()
    # fp4 packs two values per element: K counts values, not storage.
    n, k = (out.shape[-1] if out.dim() else 1), a.shape[-1] * (2 if str(a.dtype).endswith("_x2") else 1)
    b = invoke.args[1] if len(invoke.args) > 1 and a is invoke.args[0] else invoke.args[-1]
    batched = getattr(b, "dim", lambda: 2)() > 2 and out.dim() > 2
    m = out.shape[-2] if batched else out.numel() // max(n, 1)
    props.matmuls.append((out.numel() // max(m * n, 1) if batched else 1, m, n, k))
    return props.add(
        product_dtype(invoke, a.dtype), mma=2 * out.numel() * k, gp=extra_gp_per_output * out.numel()
    )


def product_dtype(invoke: OpInvoke, dtype: torch.dtype) -> torch.dtype | str:
    """The dtype a product runs at: "tf32" for float32 inputs captured while torch allowed TF32 (a profile without
    a tf32 rate prices it as float32)."""
    if dtype == torch.float32 and invoke.attrs.get("float32_matmul_precision", "highest") != "highest":
        return "tf32"
    return dtype


@register_op_properties(aten.mm.default)
@register_op_properties(aten.bmm.default)
@register_op_properties(aten.matmul.default)
@register_op_properties(aten._int_mm.default)
def _matmul(invoke: OpInvoke, device) -> PerformanceProperties:
    return matmul_properties(invoke, invoke.args[0])


@register_op_properties(aten.addmm.default)
@register_op_properties(aten.baddbmm.default)
def _addmm(invoke: OpInvoke, device) -> PerformanceProperties:
    # out = beta * self + alpha * (a @ b): one add per output element, a multiply more for each scale
    # that is not 1; beta = 0 (a common way to get a plain bmm) neither reads nor adds self.
    beta, alpha = invoke.argument("beta", 1), invoke.argument("alpha", 1)
    scaling = (beta != 0) + (beta not in (0, 1)) + (alpha != 1)
    props = matmul_properties(invoke, invoke.args[1], extra_gp_per_output=scaling)
    if beta == 0:
        props.memory_read_bytes -= invoke.args[0].nbytes
    return props


@register_op_properties(aten.linear.default)
def _linear(invoke: OpInvoke, device) -> PerformanceProperties:
    has_bias = invoke.argument("bias") is not None
    return matmul_properties(invoke, invoke.args[0], extra_gp_per_output=int(has_bias))


@register_op_properties(aten._scaled_mm.default)
@register_op_properties(aten._scaled_mm_v2.default)
def _scaled_mm(invoke: OpInvoke, device) -> PerformanceProperties:
    return scaled_mm_properties(invoke)


def scaled_mm_properties(invoke: OpInvoke) -> PerformanceProperties:
    """fp8 (or int8) inputs run at the matrix unit's rate for them: counted in the inputs' dtype. The epilogue
    scales each fp32 accumulator once (scale_a * scale_b folded) and adds the bias, in fp32 before the cast."""
    has_bias = invoke.argument("bias") is not None
    props = matmul_properties(invoke, invoke.args[0])
    return props.add(torch.float32, gp=(1 + has_bias) * invoke.outputs()[0].numel())


@register_op_properties(aten._grouped_mm.default)
@register_op_properties(aten._scaled_grouped_mm.default)
def _grouped_mm(invoke: OpInvoke, device) -> PerformanceProperties:
    scale_b = invoke.argument("scale_b")  # per expert and channel, [experts, N], for a scaled product
    return grouped_mm_properties(invoke, (scale_b,) if scale_b is not None and scale_b.dim() == 2 else ())


def grouped_mm_properties(invoke: OpInvoke, weights: tuple = ()) -> PerformanceProperties:
    """One product per group (mixture-of-experts). Each output element takes K = self.shape[-1] multiply-adds,
    except 2-D x 2-D (a weight gradient): there the groups split K, and the output holds one (M, N) result per
    group. Rows grouped by expert against 3-D [experts, ...] weights read only the experts they are expected to
    touch, of ``b`` and of ``weights`` (per-expert scales). A scaled product's epilogue (the scale, and the
    bias) runs on the fp32 accumulators."""
    a, b = invoke.args[:2]
    out = invoke.outputs()[0]
    outputs = out.numel() // max(1, out.shape[0]) if a.dim() == b.dim() == 2 else out.numel()
    has_bias, scaled = invoke.argument("bias") is not None, invoke.argument("scale_a") is not None
    props = invoke.memory_access_properties()
    if a.dim() == 2 and b.dim() == 3:  # rows grouped by expert against [experts, K, N] weights
        untouched = 1 - routed_experts(invoke, b.shape[0], a.shape[0]) / max(1, b.shape[0])
        props.memory_read_bytes -= sum(w.nbytes for w in (b, *weights)) * untouched
    props.add(product_dtype(invoke, a.dtype), mma=2 * outputs * a.shape[-1])
    props.kernel = GROUPED
    return props.add(torch.float32 if scaled else a.dtype, gp=(has_bias + scaled) * out.numel())


GROUPED = (
    "grouped_mm"  # the kernel family of every grouped (mixture-of-experts) product: grouped_mm_efficiency
)


def routed_experts(invoke: OpInvoke, experts: int, rows: int) -> float:
    """How many experts' weights a grouped product over ``rows`` routed rows reads: under --ep and a routing skew,
    the busiest rank's experts that its forward recorded; under a skew alone, those the experts' loads reach
    (castcore.recording.routing); else ``touched_experts``."""
    popularity = invoke.attrs.get("adapter_skew")
    if popularity:  # multi-LoRA adapters, one a row's request picks by popularity (castcore.deploy.lora)
        return routing.popular_touched(experts, rows, popularity)
    busiest = invoke.attrs.get("experts_touched")
    if busiest:
        return min(experts, busiest)
    skew, top_k = invoke.attrs.get("expert_skew"), invoke.attrs.get("top_k")
    if skew and top_k:
        return min(experts, routing.touched(experts, rows / top_k, top_k, skew))
    return touched_experts(experts, rows)


def touched_experts(experts: int, rows: int) -> float:
    """The expected number of distinct experts ``rows`` routed rows reach, so how many experts' weights a grouped
    matmul reads: E * (1 - (1 - 1/E)^rows). Rows are tokens x top-k; top-k is not in the op, so this assumes every
    row picks its expert uniformly and independently, E * (1 - (1 - k/E)^T) in the limit of many experts (a
    top-k picks k distinct experts, so at one token this is a little under k: 1.75 for E = 4, k = 2)."""
    if experts <= 1:
        return float(experts)
    return experts * (1 - (1 - 1 / experts) ** rows)


@register_op_properties(aten.mv.default)
@register_op_properties(aten.addmv.default)
@register_op_properties(aten.dot.default)
@register_op_properties(aten.vdot.default)
def _matrix_vector(invoke: OpInvoke, device) -> PerformanceProperties:
    # A matrix-vector product uses one column of a matrix unit; BLAS runs it on the vector units.
    a = invoke.argument("mat", invoke.args[0])
    out = invoke.outputs()[0]
    extra = invoke.argument("beta", 0) != 0  # addmv adds self
    return invoke.memory_access_properties().add(a.dtype, gp=2 * a.numel() + extra * out.numel())


def conv_mma(input, weight, out, transposed: bool) -> int:
    """2 * N * C_out * prod(out spatial) * (C_in / groups) * prod(kernel): one multiply-add per weight tap.

    weight is (C_out, C_in/groups, *kernel); a transposed conv's weight is (C_in, C_out/groups, *kernel)
    and it is the input-gradient of a plain conv, so its work runs over its input positions instead.
    """
    taps = weight.shape[1] * math.prod(weight.shape[2:])
    positions = input.numel() if transposed else out.numel()
    return 2 * positions * taps


@register_op_properties(aten.convolution.default)
@register_op_properties(aten._convolution.default)
def _convolution(invoke: OpInvoke, device) -> PerformanceProperties:
    input, weight = invoke.args[:2]
    out = invoke.outputs()[0]
    has_bias = invoke.argument("bias") is not None
    mma = conv_mma(input, weight, out, bool(invoke.argument("transposed")))
    return invoke.memory_access_properties().add(input.dtype, mma=mma, gp=has_bias * out.numel())


@register_op_properties(aten.convolution_backward.default)
def _convolution_backward(invoke: OpInvoke, device) -> PerformanceProperties:
    # grad_input is a transposed conv of grad_output with the weight, grad_weight a conv of the input
    # with grad_output: each is exactly the forward's work. grad_bias sums grad_output.
    grad_output, input, weight = invoke.args[:3]
    want_input, want_weight, want_bias = invoke.argument("output_mask")
    transposed = bool(invoke.argument("transposed"))
    forward = conv_mma(input, weight, grad_output, transposed)
    read = grad_output.nbytes + want_input * weight.nbytes + want_weight * input.nbytes
    props = PerformanceProperties(
        memory_read_bytes=read, memory_write_bytes=sum(t.nbytes for t in invoke.outputs())
    )
    return props.add(
        grad_output.dtype, mma=(want_input + want_weight) * forward, gp=want_bias * grad_output.numel()
    )


# One LSTM cell per step and hidden unit, past the gate products: sigmoid on three gates, tanh on the
# fourth and on the new cell state, c = f*c + i*g (3), h = o*tanh(c) (1). Its backward: the derivative of
# each activation and of each product (dc, do, di, df, dg, dc_prev): 22 operations.
LSTM_CELL = 3 * SIGMOID + 2 * TANH + 4
LSTM_CELL_BACKWARD = 22


def _lstm_sizes(invoke: OpInvoke) -> tuple[int, int, int, int]:
    """(steps x batch, gates x hidden, input size, hidden size) of one LSTM layer and direction."""
    input, w_ih, w_hh = invoke.args[:3]
    return input.numel() // w_ih.shape[1], w_ih.shape[0], w_ih.shape[1], w_hh.shape[1]


@register_op_properties(aten.mkldnn_rnn_layer.default)
def _lstm_layer(invoke: OpInvoke, device) -> PerformanceProperties:
    # The CPU's fused LSTM layer (what nn.LSTM runs on fake CPU tensors): at every step the gates are
    # x W_ih^T + h W_hh^T, each gate value then gets its two biases (3 adds, 1 without biases).
    rows, gates, inputs, hidden = _lstm_sizes(invoke)
    adds = 3 if invoke.argument("has_biases") else 1
    return invoke.memory_access_properties().add(
        invoke.args[0].dtype,
        mma=2 * rows * gates * (inputs + hidden),
        gp=rows * (adds * gates + LSTM_CELL * hidden),
    )


@register_op_properties(aten.mkldnn_rnn_layer_backward.default)
def _lstm_layer_backward(invoke: OpInvoke, device) -> PerformanceProperties:
    # Per weight matrix, one product for the input's (or previous step's) gradient and one for the
    # weight's: twice the forward's matrix work. The bias gradient sums the gate gradients.
    rows, gates, inputs, hidden = _lstm_sizes(invoke)
    return invoke.memory_access_properties().add(
        invoke.args[0].dtype,
        mma=4 * rows * gates * (inputs + hidden),
        gp=rows * (gates + LSTM_CELL_BACKWARD * hidden),
    )
