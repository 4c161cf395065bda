"""A point-to-point send (castcore's ``castcore::send``) in the alpha-beta model, as NCCL runs ncclSend/ncclRecv.

Kept free of torch and of OpInvoke, as castpack_collectives.alphabeta is. A send of ``S`` bytes between two of
``devices`` packed devices goes over the innermost level spanning them (``pick_level``); ``outermost`` sends over
the profile's outermost level whatever the count (another node, or another device type). One transfer gets the
level's one-peer bandwidth ``b`` (``B = bandwidth x efficiency`` on a switch or clos, ``B / (devices - 1)`` on a
full mesh, as ``alphabeta`` gives it):

- a level with ``protocol_latency_s``: NCCL's send, in LL up to 16 KiB and Simple above
  (``castpack_collectives.protocols.p2p``, from NVIDIA/nccl src/enqueue.cc ``addP2pToPlan``): the protocol's
  base latency + one step of its latency + ``S / (b x share)`` (LL: a third of ``b``, at most 87.7 GB/s);
- otherwise ``latency_s + S / b``, the core's own default.

The estimator adds the profile's ``comm_op_cost_s`` to either, as it does to every collective.
"""

from __future__ import annotations

from collections.abc import Sequence

from castcore.pack import Interconnect

from . import protocols
from .alphabeta import Phase, _bandwidths, phases_time, pick_level


def send_level(levels: Sequence[Interconnect], devices: int, outermost: bool = False) -> Interconnect:
    """The level a send between two of ``devices`` packed devices goes over (see the module docstring)."""
    if not levels:
        raise ValueError("no interconnect levels to send over")
    return levels[-1] if outermost else pick_level(levels, devices)[0]


def send_cost(nbytes: float, levels: Sequence[Interconnect], devices: int, outermost: bool = False) -> Phase:
    """One send of ``nbytes`` as a Phase (algorithm ``direct``, 2 ranks, 1 step); its seconds are
    ``phases_time([phase])``: the phase's time plus the protocol's base latency, without ``comm_op_cost_s``."""
    if nbytes < 0:
        raise ValueError(f"a send moves >= 0 bytes, not {nbytes}")
    if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
        raise ValueError(f"devices must be a whole number >= 1, not {devices!r}")
    level = send_level(levels, devices, outermost)
    link = _bandwidths(level, 2)[0]
    s = float(nbytes)
    chosen = protocols.p2p(level, s, link)
    if chosen is None:
        return Phase("send", "direct", level, 2, s, 1, s, level.latency_s + s / link)
    protocol, time, base = chosen
    return Phase("send", "direct", level, 2, s, 1, s, time, protocol, base)


def send_seconds(nbytes: float, levels: Sequence[Interconnect], devices: int, outermost: bool = False) -> float:
    """``send_cost``'s seconds (without ``comm_op_cost_s``)."""
    return phases_time([send_cost(nbytes, levels, devices, outermost)])
