"""The core's point-to-point send: one device's tensor sent to one peer, an operator plugins answer.

``castcore::send(Tensor x, int devices, bool outermost=False) -> Tensor`` is a ``torch.library`` custom op in the
``castcore`` namespace, like the fused ones (castcore.builtin.fused_ops): its fake implementation returns a tensor
like ``x``, and run eagerly it returns a copy (what the peer receives). ``devices`` is how many devices the sender and
its peer sit among (the interconnect level spanning them is the innermost with at least that many); ``outermost``
sends over the profile's outermost level whatever the count (another node, or another device type).

castcore prices its own point-to-point transfers through it: a pipeline stage's activations sent to the next stage
(castcore.deploy.parallel.pipeline_stages) and a prompt's KV cache sent from a prefill to a decode instance
(castcore.serving.disaggregated) each resolve a synthetic call of it (``send_call``), so a pack that claims it
(castpack-collectives) answers and the core's default (castcore.builtin.formulas.comm) answers otherwise.
"""

from __future__ import annotations

import math

import torch

from castcore.recording.invoke import OpInvoke, TensorMeta

SEND_NAME = "castcore::send"


@torch.library.custom_op(SEND_NAME, mutates_args=())
def send(x: torch.Tensor, devices: int, outermost: bool = False) -> torch.Tensor:
    """``x`` as the peer receives it: a copy (nothing is communicated)."""
    torch._check(devices >= 1, lambda: f"devices must be >= 1, not {devices}")
    return x.clone()


@send.register_fake
def _(x, devices, outermost=False):
    return torch.empty_like(x)


SEND = torch.ops.castcore.send.default


def send_call(nbytes: float, devices: int, outermost: bool = False, module: str = "") -> OpInvoke:
    """A synthetic call of castcore::send moving ``nbytes`` (rounded up to whole bytes, as one uint8 tensor) between
    two of ``devices``; ``module`` says whose transfer it is (not part of the call's identity)."""
    if nbytes < 0:
        raise ValueError(f"a send moves >= 0 bytes, not {nbytes}")
    x = TensorMeta(shape=(math.ceil(nbytes),), dtype=torch.uint8, stride=(1,))
    return OpInvoke(op=SEND, args=(x, int(devices), bool(outermost)), out=x, module=module)
