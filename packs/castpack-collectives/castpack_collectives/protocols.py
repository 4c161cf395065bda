"""A collective library's protocols, as NCCL picks among them: LL, LL128 and Simple.

NCCL moves data in one of three protocols (Hu et al., "Demystifying NCCL: An In-depth Analysis of GPU
Communication Protocols and Algorithms", arXiv 2507.04786, 2025, section 3; NVIDIA/nccl src/graph/tuning.cc):

- LL (low latency): 8-byte stores of 4 bytes of data and a 4-byte flag, so a receiver polls its own memory and
  needs no fence; the cheapest step, but at most half the wire, and NCCL's tuning model counts it at a quarter of
  the bus bandwidth for an all-reduce and a third for the others, capped at 87.7 GB/s on one node.
- LL128: 128-byte lines with an 8-byte flag (120/128 of the wire), counted at 0.92 of the bus bandwidth; NCCL runs
  it by default only where GPUs talk over NVLink.
- Simple: plain copies with memory fences between chunks: the whole bandwidth, the dearest step.

For each call NCCL's tuner takes the (algorithm, protocol) with the least ``base latency + steps x step latency +
bytes / bandwidth``. Here the step latencies belong to the hardware, so they sit on the level
(``Interconnect.protocol_latency_s``, LL, LL128, Simple; 0 where the library does not run that protocol there),
and the base latencies and bandwidth fractions belong to the library, so they sit here. The base latency is paid
once a call (a hierarchical collective's phases share one), so it is kept apart from each phase's time.

Constants: NVIDIA/nccl src/graph/tuning.cc at commit b6475625fbcaa2c3c0e50eed2fa1255d7514d4a2 (NCCL 2.19-2.20),
read 2026-11-27: ``baseLat`` Ring row {LL 6.6, LL128 14.0, Simple 8.4} us; the model refinements ``busBw * 1/4``
(LL, all-reduce or more than one node), ``* 1/3`` (LL, other collectives), ``* 0.92`` (LL128) and ``llMaxBws``
87.7 GB/s (one node, Ampere and Hopper); NVLS has no base latency (``latencies = intraLat``). All-to-all is NCCL's
grouped point-to-point send and receive, which runs LL below NCCL_P2P_LL_THRESHOLD (16 KiB) and Simple above, never
LL128 (NCCL environment-variable documentation, docs.nvidia.com/deeplearning/nccl, read 2026-11-27). A single send
(castcore::send, ``p2p``) takes the protocol by that rule, not by the tuner: NVIDIA/nccl src/enqueue.cc
``addP2pToPlan`` at commit 5d3ab08b69754cb863ab1bf6e3fb6f7612bb725b sets ``info.protocol = (LL buffers present &&
bytes <= ncclParamP2pLLThreshold()) ? NCCL_PROTO_LL : NCCL_PROTO_SIMPLE`` with ``NCCL_PARAM(P2pLLThreshold,
"P2P_LL_THRESHOLD", 16384)``, read 2026-11-28.
"""

from __future__ import annotations

from castcore.pack import Interconnect

PROTOCOLS = ("LL", "LL128", "Simple")
BASE_LATENCY_S = {"LL": 6.6e-6, "LL128": 14.0e-6, "Simple": 8.4e-6}  # tuning.cc baseLat, Ring row
LL_MAX_BUS_BANDWIDTH = 87.7e9  # tuning.cc llMaxBws, one node, Ampere and Hopper (B/s)
LL128_FRACTION = 0.92
# Across nodes (tuning.cc at commit 5067397c2676d5aed50042fc39e5c8ee96eb0027, read 2026-11-28): LL's cap is the host's
# llMaxBws, Intel x86: 39.0 GB/s over two nodes, 20.4 over more; the tree's base latency a call, and its share of
# the bus bandwidth: 0.92 for an all-reduce, LL a further 1/3.8, LL128 120/128; half of that is its algorithm
# bandwidth (it sends the buffer up the tree and back down).
LL_MAX_BUS_BANDWIDTH_NODES = {2: 39.0e9}  # more nodes: LL_MAX_BUS_BANDWIDTH_MANY
LL_MAX_BUS_BANDWIDTH_MANY = 20.4e9
TREE_BASE_LATENCY_S = {"LL": 6.8e-6, "LL128": 14.0e-6, "Simple": 8.4e-6}
TREE_FRACTION = {"LL": 0.92 / 3.8, "LL128": 0.92 * 120 / 128, "Simple": 0.92}
# tuning.cc treeCorrectionFactor: the tree all-reduce's bandwidth at floor(log2(bytes / 64)) = 0, 1, ... 22
TREE_CORRECTION = {
    "LL": (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0),
    "LL128": (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0),
    "Simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9),
}
# RCCL, NCCL's fork for AMD GPUs (Interconnect.library "rccl"), fitted on rccl-tests all_reduce_perf over 8x MI300X
# under HIP graphs (ROCm blogs "Understanding RCCL Bandwidth and xGMI Performance on AMD Instinct MI300X",
# 2025-03-02, RCCL 2.22.3, ROCm 6.3, 25 sizes 1 KiB-16 GiB): below about 8 MiB RCCL runs at about half the
# bandwidth it reaches on large buffers (LL: 8-byte stores of 4 bytes of data), above it at all of it after a
# start-up about 49 us dearer. With the mesh's two direct steps of 3.875 us (castpack-amd's mi300x profile) that
# prices the 25 sizes at 2.4% median |error| (15% at most, 8 MiB), where one protocol gave 12% (46% at most).
# Fitted on all-reduce; the other collectives are assumed to run the same way. No LL cap: the fit holds it.
RCCL_BASE_LATENCY_S = {"LL": 0.0, "LL128": 0.0, "Simple": 49.25e-6}
RCCL_LL_FRACTION = 0.52
P2P_LL_THRESHOLD = 16384  # enqueue.cc NCCL_P2P_LL_THRESHOLD default: a send of at most this many bytes runs LL
POINT_TO_POINT = ("all_to_all", "send")  # NCCL's send/receive: LL or Simple, never LL128


def fraction(protocol: str, collective: str, library: str = "nccl") -> float:
    """The share of the level's bus bandwidth (``bandwidth x efficiency``, what Simple reaches) a protocol gets."""
    if protocol == "LL" and library == "rccl":
        return RCCL_LL_FRACTION
    if protocol == "LL":
        return 1 / 4 if collective == "all_reduce" else 1 / 3
    if protocol == "LL128":
        return LL128_FRACTION
    return 1.0


def offered(level: Interconnect, collective: str) -> tuple[str, ...]:
    """The protocols the library runs for ``collective`` on ``level``: those with a step latency, less LL128 for
    all-to-all and a send (point-to-point sends run LL or Simple)."""
    names = tuple(p for p, step in zip(PROTOCOLS, level.protocol_latency_s) if step > 0)
    return tuple(p for p in names if not (collective in POINT_TO_POINT and p == "LL128"))


def cheapest(level: Interconnect, collective: str, steps: int, moved: float,
             rate: float) -> tuple[str, float, float] | None:
    """(protocol, time without the base latency, base latency) of the protocol with the least total time for
    ``steps`` steps moving ``moved`` bytes a rank at ``rate`` B/s (what Simple gets); None if none is offered."""
    return cheapest_over(((level, steps, 0.0),), collective, moved, rate)


def ll_cap(nodes: int, library: str = "nccl") -> float:
    """LL's most bus bandwidth: NCCL's one-node figure on one node, the host's over several; none for RCCL."""
    if library == "rccl":
        return float("inf")
    return LL_MAX_BUS_BANDWIDTH if nodes <= 1 else LL_MAX_BUS_BANDWIDTH_NODES.get(nodes, LL_MAX_BUS_BANDWIDTH_MANY)


def base_latency(protocol: str, library: str = "nccl") -> float:
    """The library's cost a call of ``protocol``, paid once (NCCL's ring baseLat; RCCL's fitted)."""
    return (RCCL_BASE_LATENCY_S if library == "rccl" else BASE_LATENCY_S)[protocol]


def cheapest_over(legs: tuple[tuple[Interconnect, int, float], ...], collective: str, moved: float,
                  rate: float, nodes: int = 1) -> tuple[str, float, float] | None:
    """``cheapest`` for steps taken on several levels, each leg ``(level, steps, floor)``: a step on that level costs
    its protocol's step latency, at least ``floor`` (x 3 in Simple, as NCCL's net overhead is); the protocols are
    those every leg's level offers; LL capped as over ``nodes`` nodes."""
    names = [p for p in PROTOCOLS if all(p in offered(level, collective) for level, _, _ in legs)]
    library = legs[0][0].library  # one call runs one library
    best = None
    for protocol in names:
        bandwidth = rate * fraction(protocol, collective, library)
        if protocol == "LL":
            bandwidth = min(bandwidth, ll_cap(nodes, library))
        k = PROTOCOLS.index(protocol)
        time = moved / bandwidth + sum(
            steps * max(level.protocol_latency_s[k], floor * (3 if protocol == "Simple" else 1))
            for level, steps, floor in legs
        )
        base = base_latency(protocol, library)
        if best is None or time + base < best[1] + best[2]:
            best = (protocol, time, base)
    return best


def tree(inner: Interconnect, outer: Interconnect, per_node: int, nodes: int, nbytes: float,
         rate: float) -> tuple[str, float, float] | None:
    """(protocol, time without the base latency, base latency) of NCCL's tree all-reduce over ``nodes`` nodes of
    ``per_node`` ranks at ``rate`` B/s (what Simple gets): a chain inside each node, a tree across, up and down,
    ``2 ((per_node - 1) x inner step + floor(log2 nodes) x outer step)``, its bandwidth scaled by NCCL's correction
    for the size (``TREE_CORRECTION``); the cheapest protocol both levels run the tree in. None where either level
    gives no tree latencies."""
    if not (inner.tree_latency_s and outer.tree_latency_s):
        return None
    best = None
    hops = nodes.bit_length() - 1  # floor(log2 nodes), NCCL's log2i
    size = int(nbytes) // 64
    log_size = size.bit_length() - 1 if size else -1
    for k, protocol in enumerate(PROTOCOLS):
        if not (inner.tree_latency_s[k] > 0 and outer.tree_latency_s[k] > 0):
            continue
        bus = rate * TREE_FRACTION[protocol]
        if protocol == "LL":
            bus = min(bus, ll_cap(nodes))
        if 0 <= log_size < len(TREE_CORRECTION[protocol]):
            bus *= TREE_CORRECTION[protocol][log_size]
        time = 2 * ((per_node - 1) * inner.tree_latency_s[k] + hops * outer.tree_latency_s[k]) + nbytes / (bus / 2)
        base = TREE_BASE_LATENCY_S[protocol]
        if best is None or time + base < best[1] + best[2]:
            best = (protocol, time, base)
    return best


def p2p(level: Interconnect, nbytes: float, rate: float) -> tuple[str, float, float] | None:
    """(protocol, time without the base latency, base latency) of one send of ``nbytes`` at ``rate`` B/s (what Simple
    gets) on ``level``, in the protocol NCCL runs it in: LL up to ``P2P_LL_THRESHOLD`` bytes, Simple above (or the
    one of the two the level offers); one step of that protocol's latency. None where the level gives no protocol
    latencies."""
    names = offered(level, "send")
    if not names:
        return None
    protocol = "LL" if "LL" in names and (nbytes <= P2P_LL_THRESHOLD or "Simple" not in names) else "Simple"
    bandwidth = rate * fraction(protocol, "send", level.library)
    if protocol == "LL":
        bandwidth = min(bandwidth, ll_cap(1, level.library))
    step = level.protocol_latency_s[PROTOCOLS.index(protocol)]
    return protocol, step + nbytes / bandwidth, base_latency(protocol, level.library)
