"""A step as a serving engine runs it: the glue on ids and positions it never launches.

Position ids, cache positions, slot indices and the bookkeeping of routed token and expert ids are built by an
engine on the host (vLLM's input preparation) or inside its routing and attention kernels. A Hugging Face forward
computes them with small aten ops over integer tensors, so a deployed step prices those at nothing (``hoisted``),
as it does an op whose data tensors hold no element (the empty value slot of a latent-attention cache written
beside its entry: nothing to launch) and the latent entry's concatenation, which the cache write reads from its
two parts (vLLM's concat_and_cache_mla, one kernel), and a per-head query or key norm the rotary kernel after it
computes (``castcore::rotary_qk_norm``); the eager graph (``--eager``) keeps them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from castcore.devices.costs import Estimate, PerformanceProperties, Source

if TYPE_CHECKING:
    from castcore.recording.invoke import OpInvoke

# ids, positions and masks; int8/uint8 stay kernels (quantized activations, packed fp4 weights)
ID_DTYPES = frozenset({torch.int64, torch.int32, torch.bool})
HOISTED = Source("core", "hoisted")  # how the per-op table names who priced it
# castcore ops whose work the next kernel does as it reads their input: the latent cache entry (the cache write's,
# vLLM's concat_and_cache_mla) and a per-head q/k norm (the rotary's, TensorRT-LLM's fusedQKNormRope)
IN_NEXT_KERNEL = ("castcore::latent_entry", "castcore::rotary_qk_norm")


def hoisted(invoke: OpInvoke) -> bool:
    """An aten op whose every tensor, in and out, holds ids, positions or masks, or no element at all: no
    activation or weight to move; and a castcore op the next kernel computes (IN_NEXT_KERNEL)."""
    if invoke.name in IN_NEXT_KERNEL:
        return True
    if not invoke.name.startswith("aten::"):
        return False  # a plugin's or user's op keeps its own estimate
    tensors = [*invoke.inputs(), *invoke.outputs()]
    return bool(tensors) and all(t.dtype in ID_DTYPES or t.numel() == 0 for t in tensors)


def nothing() -> tuple[Estimate, PerformanceProperties]:
    """A hoisted op's estimate and properties: no time, no work, no bytes."""
    return Estimate(time_s=0.0, bound="none", source=HOISTED), PerformanceProperties()
