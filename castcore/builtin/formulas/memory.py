"""Data movement, indexing, fills and random numbers: bytes of what is actually touched.

Gathers read the rows they gather, not the whole table; scatters write the elements they scatter
(an out-of-place scatter first copies ``self``); in-place ops do not read what they overwrite.
"""

from __future__ import annotations

import math

import torch

from castcore.builtin.formulas.pointwise import DIV, RANDOM, base_name
from castcore.devices.costs import PerformanceProperties
from castcore.plugins.claims import register_op_properties
from castcore.recording.invoke import OpInvoke, TensorMeta

aten = torch.ops.aten


def _memory_only(invoke: OpInvoke, device) -> PerformanceProperties:
    return invoke.memory_access_properties()


# Pure data movement: memory-only is the formula, not a fallback.
for _op in (
    aten._to_copy.default,
    aten.clone.default,
    aten.cat.default,
    aten.stack.default,
    aten.contiguous.default,
    aten.lift_fresh_copy.default,
    aten.constant_pad_nd.default,
    aten.repeat.default,
    aten.roll.default,
    aten.flip.default,
    aten.tril.default,
    aten.triu.default,
    aten.slice_backward.default,
    aten.select_backward.default,
    aten.diagonal_backward.default,
    aten.unfold_backward.default,
    aten.slice_scatter.default,
    aten.select_scatter.default,
    aten.as_strided_scatter.default,
    aten._local_scalar_dense.default,
):
    register_op_properties(_op)(_memory_only)


@register_op_properties(aten.copy_.default)
@register_op_properties(aten.copy.default)
def _copy_(invoke: OpInvoke, device) -> PerformanceProperties:
    # dst.copy_(src) and its functional form: reads src (broadcast if smaller), writes all of dst; dst is
    # not read.
    dst, src = invoke.args[:2]
    return PerformanceProperties(memory_read_bytes=src.nbytes, memory_write_bytes=dst.nbytes)


@register_op_properties(aten._copy_from.default)
@register_op_properties(aten._copy_from_and_resize.default)
def _copy_from(invoke: OpInvoke, device) -> PerformanceProperties:
    # A backend's copy of self into dst (resized to self's shape first): reads self, writes the result.
    return PerformanceProperties(
        memory_read_bytes=invoke.args[0].nbytes, memory_write_bytes=sum(t.nbytes for t in invoke.outputs())
    )


@register_op_properties(aten.resize.default)
@register_op_properties(aten.resize_as.default)
def _resized_copy(invoke: OpInvoke, device) -> PerformanceProperties:
    # The functional resize_: a clone of self, then resized (growing it allocates, writes nothing).
    return PerformanceProperties(
        memory_read_bytes=invoke.args[0].nbytes, memory_write_bytes=invoke.args[0].nbytes
    )


# The copying forms of view ops (what functionalization emits): each reads what its view would select,
# at most all of self (an expand or unfold reads an element more than once, from cache), and writes it.
VIEW_COPIES = (
    aten.expand_copy.default,
    aten.permute_copy.default,
    aten.view_copy.default,
    aten.view_copy.dtype,
    aten.alias_copy.default,
    aten._reshape_copy.default,
    aten._reshape_alias_copy.default,
    aten.as_strided_copy.default,
    aten.diagonal_copy.default,
    aten.narrow_copy.default,
    aten.select_copy.int,
    aten.slice_copy.Tensor,
    aten.split_copy.Tensor,
    aten.split_with_sizes_copy.default,
    aten.squeeze_copy.default,
    aten.squeeze_copy.dim,
    aten.squeeze_copy.dims,
    aten.unsqueeze_copy.default,
    aten.t_copy.default,
    aten.transpose_copy.int,
    aten.unbind_copy.int,
    aten.unfold_copy.default,
    aten.detach_copy.default,
    aten.view_as_real_copy.default,
    aten.view_as_complex_copy.default,
)


def _view_copy(invoke: OpInvoke, device) -> PerformanceProperties:
    written = sum(t.nbytes for t in invoke.outputs())
    return PerformanceProperties(
        memory_read_bytes=min(invoke.args[0].nbytes, written), memory_write_bytes=written
    )


for _op in VIEW_COPIES:
    register_op_properties(_op)(_view_copy)


# Nearest-neighbour resampling is a gather: each output element is one input element copied. Its backward
# adds each output gradient into the input element it came from.
NEAREST = (
    "upsample_nearest1d",
    "upsample_nearest2d",
    "upsample_nearest3d",
    "_upsample_nearest_exact1d",
    "_upsample_nearest_exact2d",
    "_upsample_nearest_exact3d",
)


def _nearest_backward(invoke: OpInvoke, device) -> PerformanceProperties:
    grad_output, grad_input = invoke.args[0], invoke.outputs()[0]
    props = PerformanceProperties(memory_read_bytes=grad_output.nbytes, memory_write_bytes=grad_input.nbytes)
    return props.add(grad_input.dtype, gp=grad_output.numel())


for _name in NEAREST:
    register_op_properties(getattr(aten, _name).default)(_memory_only)
    register_op_properties(getattr(aten, _name).vec)(_memory_only)
    register_op_properties(getattr(aten, f"{_name}_backward").default)(_nearest_backward)


def gathered(invoke: OpInvoke) -> PerformanceProperties:
    """A gather: reads the index tensors and as many source elements as it writes."""
    indices = invoke.inputs()[1:]
    out = invoke.outputs()[0]
    return PerformanceProperties(
        memory_read_bytes=sum(t.nbytes for t in indices) + out.nbytes, memory_write_bytes=out.nbytes
    )


@register_op_properties(aten.embedding.default)
@register_op_properties(aten.index_select.default)
@register_op_properties(aten.gather.default)
@register_op_properties(aten.index.Tensor)
@register_op_properties(aten._unsafe_index.Tensor)
def _gather(invoke: OpInvoke, device) -> PerformanceProperties:
    return gathered(invoke)


def _is_inplace(invoke: OpInvoke) -> bool:
    return invoke.op._schema.name.endswith("_")


def scattered(
    invoke: OpInvoke,
    target: TensorMeta,
    indices: list[TensorMeta],
    count: int,
    source: TensorMeta | None,
    accumulate: bool,
) -> PerformanceProperties:
    """Writes ``count`` elements of ``target`` from ``source`` (read-modify-write when accumulating),
    reading the index tensors whole; out of place, ``target`` is first copied to the output."""
    touched = count * target.element_size()
    # may broadcast
    source_bytes = min(count, source.numel()) * source.element_size() if source is not None else 0
    read = sum(t.nbytes for t in indices) + source_bytes + accumulate * touched
    write = touched
    if not _is_inplace(invoke):
        read, write = read + target.nbytes, write + target.nbytes
    props = PerformanceProperties(memory_read_bytes=read, memory_write_bytes=write)
    return props.add(target.dtype, gp=accumulate * count)


def _tensor(value) -> TensorMeta | None:
    return value if isinstance(value, TensorMeta) else None


@register_op_properties(aten.scatter.src)
@register_op_properties(aten.scatter.value)
@register_op_properties(aten.scatter.reduce)
@register_op_properties(aten.scatter.value_reduce)
@register_op_properties(aten.scatter_.src)
@register_op_properties(aten.scatter_.value)
@register_op_properties(aten.scatter_add.default)
@register_op_properties(aten.scatter_add_.default)
@register_op_properties(aten.scatter_reduce.two)
@register_op_properties(aten.scatter_reduce_.two)
def _scatter(invoke: OpInvoke, device) -> PerformanceProperties:
    # One element written per index element.
    index = invoke.argument("index")
    accumulate = "add" in invoke.op._schema.name or invoke.argument("reduce") is not None
    return scattered(
        invoke, invoke.args[0], [index], index.numel(), _tensor(invoke.argument("src")), accumulate
    )


@register_op_properties(aten.index_add.default)
@register_op_properties(aten.index_add_.default)
@register_op_properties(aten.index_copy.default)
@register_op_properties(aten.index_copy_.default)
def _index_add(invoke: OpInvoke, device) -> PerformanceProperties:
    # Every element of source lands in one indexed slice.
    index, source = invoke.argument("index"), invoke.argument("source")
    accumulate = "add" in invoke.op._schema.name
    return scattered(invoke, invoke.args[0], [index], source.numel(), source, accumulate)


def indexed_count(shape: tuple[int, ...], indices: tuple) -> int:
    """Elements ``x[indices]`` selects: the index tensors' broadcast shape times the dims they leave
    whole. A bool mask counts as if every element were set (its count is data, unknown here)."""
    index_shapes, kept, dim = [], 1, 0
    for index in indices:
        if index is None:
            kept *= shape[dim]
            dim += 1
        elif index.dtype == torch.bool:
            index_shapes.append((index.numel(),))
            dim += index.dim()
        else:
            index_shapes.append(index.shape)
            dim += 1
    return math.prod(_broadcast(index_shapes)) * kept * math.prod(shape[dim:])


def _broadcast(shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
    """torch.broadcast_shapes for shapes that broadcast (the capture ran them), without its first call's imports
    (a third of a second)."""
    rank = max(map(len, shapes), default=0)
    padded = [(1,) * (rank - len(s)) + tuple(s) for s in shapes]
    return tuple(max(sizes) if 0 not in sizes else 0 for sizes in zip(*padded))


@register_op_properties(aten.index_put.default)
@register_op_properties(aten.index_put_.default)
@register_op_properties(aten._index_put_impl_.default)
def _index_put(invoke: OpInvoke, device) -> PerformanceProperties:
    x, indices, values = invoke.args[:3]
    index_tensors = [t for t in indices if t is not None]
    count = indexed_count(x.shape, indices)
    return scattered(invoke, x, index_tensors, count, values, bool(invoke.argument("accumulate")))


@register_op_properties(aten.embedding_dense_backward.default)
def _embedding_backward(invoke: OpInvoke, device) -> PerformanceProperties:
    # A zeroed (num_weights, dim) gradient, then each grad_output row added into its token's row.
    grad_output, indices = invoke.args[:2]
    grad_weight = invoke.outputs()[0]
    rows = grad_output.numel() * grad_weight.element_size()  # read-modify-write of the touched rows
    props = PerformanceProperties(
        memory_read_bytes=grad_output.nbytes + indices.nbytes + rows,
        memory_write_bytes=grad_weight.nbytes + rows,
    )
    return props.add(grad_weight.dtype, gp=grad_output.numel())


# EmbeddingBag's modes: sum, mean, max.
BAG_MEAN, BAG_MAX = 1, 2


@register_op_properties(aten._embedding_bag.default)
@register_op_properties(aten._embedding_bag_forward_only.default)
def _embedding_bag(invoke: OpInvoke, device) -> PerformanceProperties:
    # Gathers one weight row per index and folds it into its bag (an add, or a compare for max), after
    # scaling it by its per-sample weight if given; mean divides each bag's result by its size.
    weight, indices = invoke.args[:2]
    weights = _tensor(invoke.argument("per_sample_weights"))
    gathered = indices.numel() * weight.shape[-1]
    out = invoke.outputs()[0]
    reads = sum(t.nbytes for t in invoke.inputs()[1:]) + gathered * weight.element_size()
    props = PerformanceProperties(
        memory_read_bytes=reads, memory_write_bytes=sum(t.nbytes for t in invoke.outputs())
    )
    mean = invoke.argument("mode") == BAG_MEAN
    return props.add(weight.dtype, gp=gathered * (1 + (weights is not None)) + mean * DIV * out.numel())


@register_op_properties(aten._embedding_bag_backward.default)
@register_op_properties(aten._embedding_bag_dense_backward.default)
def _embedding_bag_backward(invoke: OpInvoke, device) -> PerformanceProperties:
    # As embedding's backward: a zeroed (num_weights, dim) gradient, then each index's bag gradient row
    # added into its weight row (for max, each bag element goes to the one index that won it).
    grad, indices = invoke.args[:2]
    grad_weight = invoke.outputs()[0]
    added = grad.numel() if invoke.argument("mode") == BAG_MAX else indices.numel() * grad.shape[-1]
    rows = added * grad_weight.element_size()  # read-modify-write of the touched rows
    props = PerformanceProperties(
        memory_read_bytes=sum(t.nbytes for t in invoke.inputs()) + rows,
        memory_write_bytes=grad_weight.nbytes + rows,
    )
    return props.add(grad_weight.dtype, gp=added)


# Random numbers: a generator draw per element written; bernoulli compares it with p, dropout also
# multiplies by the mask and the scale.
RANDOM_OPS = {"bernoulli": RANDOM + 1, "native_dropout": RANDOM + 2}


@register_op_properties(aten.rand.default)
@register_op_properties(aten.randn.default)
@register_op_properties(aten.rand_like.default)
@register_op_properties(aten.randn_like.default)
@register_op_properties(aten.randint.low)
@register_op_properties(aten.randint.default)
@register_op_properties(aten.uniform_.default)
@register_op_properties(aten.normal_.default)
@register_op_properties(aten.bernoulli.p)
@register_op_properties(aten.bernoulli_.float)
@register_op_properties(aten.bernoulli_.Tensor)
@register_op_properties(aten.native_dropout.default)
def _random(invoke: OpInvoke, device) -> PerformanceProperties:
    out = invoke.outputs()[0]
    per_element = RANDOM_OPS.get(base_name(invoke.op), RANDOM)
    if _is_inplace(invoke):  # fills self: reads only a tensor of probabilities, if any
        reads = sum(t.nbytes for t in invoke.inputs()[1:])
        props = PerformanceProperties(memory_read_bytes=reads, memory_write_bytes=out.nbytes)
    else:
        props = invoke.memory_access_properties()
    return props.add(out.dtype, gp=per_element * out.numel())


# Allocation without initialisation, bookkeeping, and views torch does not tag as views (in-place ones change
# self's shape, set_ points self at other storage, the unsafe splits are views without alias marks): no work.
FREE = {
    aten.empty.memory_format,
    aten.empty_strided.default,
    aten.empty_permuted.default,
    aten.new_empty.default,
    aten.new_empty_strided.default,
    aten.empty_like.default,
    aten._unsafe_view.default,
    aten.resize_.default,
    aten.resize_as_.default,
    aten._resize_output_.default,
    aten._assert_tensor_metadata.default,
    torch.ops.prim.device.default,
    aten.lift.default,
    aten.set_.default,
    aten.set_.source_Tensor,
    aten.set_.source_Tensor_storage_offset,
    aten.set_.source_Storage,
    aten.set_.source_Storage_storage_offset,
    aten.as_strided_.default,
    aten.detach_.default,
    aten.t_.default,
    aten.transpose_.default,
    aten.swapaxes_.default,
    aten.swapdims_.default,
    aten.squeeze_.default,
    aten.squeeze_.dim,
    aten.squeeze_.dims,
    aten.unsqueeze_.default,
    aten.unsafe_split.Tensor,
    aten.unsafe_split_with_sizes.default,
    aten.unsafe_chunk.default,
}
# Fills: write the output, read nothing.
FILLS = {
    aten.zeros.default,
    aten.ones.default,
    aten.full.default,
    aten.arange.default,
    aten.arange.start,
    aten.arange.start_step,
    aten.scalar_tensor.default,
    aten.new_ones.default,
    aten.new_zeros.default,
    aten.new_full.default,
    aten.zeros_like.default,
    aten.ones_like.default,
    aten.full_like.default,
    aten.fill_.Scalar,
    aten.fill_.Tensor,
    aten.zero_.default,
    aten.linspace.default,
    aten.eye.default,
}
