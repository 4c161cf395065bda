"""The core's op_properties formulas for aten operators, one module per family.

Conventions: one multiply-add is 2 operations; matrix products count on the matrix unit
(``mma_ops``) in the dtype of their inputs (fp8 inputs count as fp8); everything else on the
vector unit (``gp_ops``) in the dtype of the data (of a comparison's inputs, not its bool result).
Memory is every input read once and every output written once unless a formula says otherwise
(gathers and scatters count what they touch). Per-op vector costs are in ``pointwise.py``.

Claims (``register_op_properties``) answer for single ops; ``by_tag`` answers for the families
torch's own op metadata names: views, allocations, fills, pointwise and reduction ops. One op is timed outright
(``register_op_estimator``): the point-to-point send (``comm.py``), whose cost is the interconnect's, not work.
"""

from __future__ import annotations

import torch

from castcore.builtin.formulas import attention, matmul, memory, pointwise, reductions  # noqa: F401  (their decorators declare the claims)
from castcore.builtin.formulas import fused  # noqa: F401  (the core's fused ops)
from castcore.builtin.formulas import quantized  # noqa: F401  (the core's quantized ops)
from castcore.builtin.formulas import recurrent  # noqa: F401  (the core's linear-attention ops)
from castcore.builtin.formulas import ssm  # noqa: F401  (the core's Mamba-2 ops)
from castcore.builtin.formulas import sparse_attention  # noqa: F401  (the core's sparse-attention ops)
from castcore.builtin.formulas import comm  # noqa: F401  (the core's point-to-point send, an estimator)
from castcore.builtin.formulas.attention import (
    SOFTMAX_OPS_PER_SCORE,
    attention_properties,
    causal_pairs,
)
from castcore.builtin.formulas.pointwise import OPS_PER_ELEMENT, is_pointwise
from castcore.devices.costs import PerformanceProperties
from castcore.recording.invoke import OpInvoke

__all__ = ["OPS_PER_ELEMENT", "SOFTMAX_OPS_PER_SCORE", "attention_properties", "by_tag", "causal_pairs"]


def by_tag(invoke: OpInvoke) -> PerformanceProperties | None:
    """Properties for whole families of ops, recognised from torch's own op metadata."""
    op = invoke.op
    if getattr(op, "is_view", False) or op in memory.FREE:
        return PerformanceProperties()
    if op in memory.FILLS:
        return PerformanceProperties(memory_write_bytes=sum(t.nbytes for t in invoke.outputs()))
    if is_pointwise(op):
        return pointwise.pointwise_properties(invoke)
    if torch.Tag.reduction in getattr(op, "tags", ()):
        return reductions.reduction_properties(invoke)
    return None
