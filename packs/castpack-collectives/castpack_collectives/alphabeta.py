"""The alpha-beta (latency, bandwidth) model of collectives, as pure functions of bytes, ranks and levels.

Kept free of torch and of OpInvoke so every number can be checked by hand. ``S`` is always the
collective's full size, as nccl-tests counts it: the tensor for all_reduce and broadcast, the
gathered output for all_gather, the input before scattering for reduce_scatter, and one rank's
send buffer for all_to_all.

One level (an ``Interconnect``) gives ``alpha = latency_s`` per step and ``B = bandwidth *
efficiency`` per device one way. A ``full-mesh`` level has one link per peer, so one transfer
gets ``B / (devices - 1)`` and a device sending to k peers at once gets ``k`` such links; on a
``switch`` or ``clos`` any pair gets the whole ``B`` but a device sends one transfer at a time;
on a ``ring`` only neighbours are linked, so only the ring algorithm is offered there. A switch
with ``reduction_efficiency`` sums in the network (NVLink SHARP, NCCL's NVLS): an all-reduce
then sends and receives its buffer once per rank, ``in_switch``.

``low_latency`` is an all-to-all as DeepEP's low-latency kernels run an MoE dispatch or combine: every rank
writes each peer's share straight into it, all peers at once (GPU-initiated RDMA), so one latency of the level
spanning the group is paid, and the peers inside the innermost domain are reached over it while the others are
reached over the network, concurrently. It is offered only when the caller asks for it (``algorithms``): NCCL
does not run it.

``one_shot`` and ``two_shot`` are a serving engine's own all-reduce on a level whose profile gives their
constants (``engine_allreduce_max_bytes`` and the rest): one shot, every rank reads each peer's buffer and sums,
``one_shot_latency_s + (n - 1) S / one_shot_bandwidth``; two shots, a reduce-scatter then an all-gather,
``two_shot_latency_s + 2 (n - 1) / n S / two_shot_bandwidth``. The constants are per kernel call, launch
included, so ``comm_op_cost_s`` (a collective library's host-side cost) is not added to them. Offered only when
the caller says an engine runs the call (``ENGINE``).

A level that gives ``protocol_latency_s`` prices a collective library's algorithms in NCCL's protocols (LL,
LL128, Simple: castpack_collectives.protocols): each step costs that protocol's step latency instead of
``latency_s``, the bytes go at that protocol's share of the bandwidth, and the library's base latency for the
protocol is paid once a call; the cheapest protocol wins, as NCCL's tuner picks it. Small messages then pay a few
microseconds, not a fixed per-call cost, and recursive doubling, which NCCL does not run, is not offered there.
Across nodes such levels run NCCL's ring over the nodes (``_ring_across``), whose bytes pass through the node's NICs,
and an all-reduce may take NCCL's tree (``_tree_across``) where the levels give its step latencies.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from castcore.pack import Interconnect

from . import protocols

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")
ALGORITHMS = ("ring", "recursive_doubling", "direct", "in_switch", "hierarchical", "tree", "low_latency",
              "one_shot", "two_shot")
NCCL = ALGORITHMS[:6]  # what a collective library picks from by default
ENGINE_KERNELS = ("one_shot", "two_shot")  # a serving engine's own all-reduce, launched inside its CUDA graph
ENGINE = NCCL + ENGINE_KERNELS  # what a serving engine picks from
KERNELS = {"engine": ENGINE, "low-latency": ("low_latency",)}  # castcore.recording.hints' names
# NCCL selects NVLS for an all-reduce only above this many GPUs: measured on 8x H200 (nccl-tests, 8 GiB, Ring at 4
# GPUs and NVLS from 5; github.com/stas00/ml-engineering network/README.md 'SHARP', commit 744d01e); NVIDIA's GB200
# NVL Partition User Guide: partitions of four GPUs or fewer 'will not benefit from multicast'; read 2026-11-27.
NVLS_MIN_RANKS = 4
# NCCL's ring across nodes: each step inside a node costs at least the network's post overhead, 1 us (x 3 in Simple)
# on an Intel x86 host (NVIDIA/nccl src/graph/tuning.cc getNetOverhead, commit 5067397, read 2026-11-28).
NET_OVERHEAD_S = 1e-6


def bus_factor(collective: str, n: int) -> float:
    """nccl-tests' factor from algorithm bandwidth (S / time) to bus bandwidth (doc/PERFORMANCE.md):
    all-reduce 2(n-1)/n; all-gather, reduce-scatter and all-to-all (n-1)/n; broadcast 1."""
    _check(collective, n)
    if collective == "all_reduce":
        return 2 * (n - 1) / n
    if collective == "broadcast":
        return 1.0
    return (n - 1) / n


def bus_bandwidth(collective: str, nbytes: float, n: int, time_s: float) -> float:
    """busbw = algbw * bus_factor, algbw = S / time: comparable with a profile's bandwidth * efficiency."""
    return nbytes / time_s * bus_factor(collective, n) if time_s > 0 else 0.0


@dataclass(frozen=True, slots=True)
class Phase:
    """One flat collective on one level: what a hierarchical algorithm is made of."""

    collective: str
    algorithm: str
    level: Interconnect
    ranks: int
    nbytes: float
    steps: int
    bytes_moved: float  # per rank
    time_s: float  # without base_s
    protocol: str = ""  # the library's protocol (LL, LL128, Simple) where the level gives protocol latencies
    base_s: float = 0.0  # the library's fixed latency for that protocol, paid once a call


@dataclass(frozen=True)
class CollectiveCost:
    """The fastest algorithm for one call, its time and the alternatives' times."""

    collective: str
    nbytes: float
    ranks: int
    algorithm: str  # "none" for a group of one
    time_s: float
    comm_s: float
    overhead_s: float
    steps: int
    bytes_moved: float  # per rank, summed over phases
    phases: tuple[Phase, ...] = ()
    fits: bool = True  # False: the group is larger than every level; the outermost was used
    candidates: dict[str, float] = field(default_factory=dict)  # algorithm -> comm seconds

    @property
    def levels(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(p.level.name for p in self.phases))

    @property
    def protocols(self) -> tuple[str, ...]:
        """The library protocols the phases ran in (none where the levels give no protocol latencies)."""
        return tuple(dict.fromkeys(p.protocol for p in self.phases if p.protocol))


def pick_level(levels: Sequence[Interconnect], devices: int) -> tuple[Interconnect, bool]:
    """The innermost level spanning ``devices`` devices, else the outermost (second element False)."""
    if not levels:
        raise ValueError("no interconnect levels to choose from")
    for level in levels:
        if level.devices >= devices:
            return level, True
    return levels[-1], False


def _check(collective: str, n: int) -> None:
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}; known: {', '.join(COLLECTIVES)}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"group size must be a whole number >= 1, not {n!r}")


def _bandwidths(level: Interconnect, n: int) -> tuple[float, float, bool]:
    """(one transfer's B/s, B/s when sending to all n-1 peers at once, whether those run concurrently)."""
    full = level.bandwidth * level.efficiency
    if level.topology == "full-mesh" and level.devices > 1:
        link = full / (level.devices - 1)
        return link, link * min(n - 1, level.devices - 1), True
    return full, full, False


def flat(collective: str, algorithm: str, nbytes: float, n: int, level: Interconnect) -> Phase | None:
    """One algorithm on one level for ``n`` ranks, or None where the topology does not offer it.

    On a level with ``protocol_latency_s`` the library's algorithms run as NCCL runs them: the ring (and direct,
    which on a switch is the ring's cost) in the cheapest protocol (castpack_collectives.protocols), no recursive
    doubling (NCCL has none), and the in-switch reduction in Simple with no base latency."""
    _check(collective, n)
    if level.protocol_latency_s and algorithm == "recursive_doubling":
        return None
    alpha = level.latency_s
    link, fan, concurrent = _bandwidths(level, n)
    s = float(nbytes)
    share = (n - 1) / n * s  # what each rank sends in a bandwidth-optimal gather or scatter
    if algorithm == "ring":
        if collective == "all_to_all" and level.topology != "ring":
            return None  # on a switch or mesh all-to-all goes direct (pairwise), not around a ring
        # On a ring all-to-all is the only way: a rank's block (buffer / n) for the peer d hops on crosses d links,
        # so each link carries n(n-1)/2 blocks, (n-1)/2 of a rank's buffer, forwarded over n-1 steps.
        steps, moved = {"all_reduce": (2 * (n - 1), 2 * share), "broadcast": (n - 1, s),
                        "all_to_all": (n - 1, (n - 1) / 2 * s)}.get(collective, (n - 1, share))
        rate = link
    elif algorithm == "recursive_doubling":  # "tree" for broadcast: a binomial tree
        if level.topology == "ring":
            return None  # partners 2^k apart are not neighbours
        k = math.ceil(math.log2(n)) if n > 1 else 0
        steps, moved = {"all_reduce": (k, k * s), "broadcast": (k, k * s), "all_to_all": (k, k * s / 2)}.get(
            collective, (k, share))
        rate = link
    elif algorithm == "direct":
        if level.topology == "ring":
            return None
        rounds = 2 if collective == "all_reduce" else 1  # all_reduce = reduce_scatter + all_gather
        moved = {"all_reduce": 2 * share, "broadcast": (n - 1) * s}.get(collective, share)
        if concurrent:  # one link per peer: every peer at once
            steps, rate = rounds, fan
        else:  # one port: the n-1 transfers (per round) go one after another
            steps, rate = rounds * (n - 1), link
    elif algorithm in ENGINE_KERNELS:
        if collective != "all_reduce" or not level.engine_allreduce_max_bytes or s > level.engine_allreduce_max_bytes:
            return None
        if level.engine_allreduce_max_ranks and n > level.engine_allreduce_max_ranks:
            return None  # the engine hands the call to the collective library (vLLM above two PCIe-only GPUs)
        # On a full mesh the bandwidths are a rank's over all its links; a group of n uses n - 1 of them.
        links = (n - 1) / (level.devices - 1) if level.topology == "full-mesh" and level.devices > 1 else 1.0
        if algorithm == "one_shot":
            return Phase(collective, algorithm, level, n, s, 1, (n - 1) * s,
                         level.one_shot_latency_s + (n - 1) * s / (level.one_shot_bandwidth * links))
        return Phase(collective, algorithm, level, n, s, 2, 2 * share,
                     level.two_shot_latency_s + 2 * share / (level.two_shot_bandwidth * links))
    elif algorithm == "in_switch":  # each rank pushes its buffer into the switch once and reads the sum back
        if collective != "all_reduce" or not level.reduction_efficiency:
            return None
        if level.protocol_latency_s and n <= NVLS_MIN_RANKS:
            return None  # NCCL runs NVLS only above 4 GPUs: at 4 and fewer, the switch's multicast gains nothing
        return Phase(collective, algorithm, level, n, s, 2, s,
                     level.reduction_latency_s + s / (level.bandwidth * level.reduction_efficiency),
                     "Simple" if level.protocol_latency_s else "")
    else:
        raise ValueError(f"unknown flat algorithm {algorithm!r}; known: ring, recursive_doubling, direct, in_switch")
    if level.protocol_latency_s:
        chosen = protocols.cheapest(level, collective, steps, moved, rate)
        if chosen is None:
            return None
        return Phase(collective, algorithm, level, n, s, steps, moved, chosen[1], chosen[0], chosen[2])
    return Phase(collective, algorithm, level, n, s, steps, moved, steps * alpha + moved / rate)


def phases_time(phases: Sequence[Phase]) -> float:
    """Seconds for phases run one after another: their times plus the library's base latency once."""
    return sum(p.time_s for p in phases) + max((p.base_s for p in phases), default=0.0)


def _best(collective: str, nbytes: float, n: int, levels: Sequence[Interconnect], unit: int,
          allowed: Sequence[str], op_cost_s: float = 0.0) -> tuple[str, tuple[Phase, ...], bool, dict[str, float]]:
    """The fastest allowed algorithm for ``n`` ranks spaced ``unit`` devices apart, counting ``op_cost_s`` for all
    but the engine's kernels; with every candidate's communication time."""
    level, fits = pick_level(levels, n * unit)
    options: dict[str, tuple[Phase, ...]] = {}
    across = _ring_across(collective, nbytes, n, levels, unit)
    for algorithm in ("ring", "recursive_doubling", "direct", "in_switch", *ENGINE_KERNELS):
        if algorithm in allowed:
            phase = across if algorithm == "ring" and across else flat(collective, algorithm, nbytes, n, level)
            if phase is not None:
                options[algorithm] = (phase,)
    # NCCL has no reduce-scatter, all-reduce, all-gather over the nodes' NICs but its ring (and, where the switch
    # reduces, NVLS inside each node under a tree across them, which hierarchical stands for).
    nccl_ring_only = across is not None and (collective != "all_reduce" or not levels[-2].reduction_efficiency)
    if "tree" in allowed and collective == "all_reduce":
        tree = _tree_across(nbytes, n, levels, unit)
        if tree is not None:
            options["tree"] = (tree,)
    if "hierarchical" in allowed and not nccl_ring_only:
        phases = _hierarchical(collective, nbytes, n, levels, unit, allowed)
        if phases is not None:
            options["hierarchical"] = phases
    if "low_latency" in allowed and collective == "all_to_all":
        options["low_latency"] = (_low_latency(nbytes, n, levels, unit),)
    if not options:
        raise ValueError(f"none of {', '.join(allowed)} can run {collective} on level {level.name!r} "
                         f"(topology {level.topology})")
    times = {name: phases_time(phases) for name, phases in options.items()}
    # on a tie the earlier (simpler) algorithm wins
    chosen = min(times, key=lambda name: times[name] + (0.0 if name in ENGINE_KERNELS else op_cost_s))
    return chosen, options[chosen], fits, times


def _ring_across(collective: str, nbytes: float, n: int, levels: Sequence[Interconnect], unit: int) -> Phase | None:
    """NCCL's ring over nodes, where the innermost level and the one spanning the group give protocol latencies:
    ``p`` ranks a node, ``q = n / p`` nodes. Of its steps (all-reduce ``2(n-1)``, the others ``n-1``) ``2(q-1)``
    (``q-1``) cross the network at its step latency and the rest stay inside a node at the inner one (at least
    NET_OVERHEAD_S), at ``_nodes``' rate; LL capped as NCCL caps it over several nodes. None where it does not
    apply (another collective, one level, ranks not filling whole nodes)."""
    spans = _nodes(n, levels, unit) if collective in ("all_reduce", "all_gather", "reduce_scatter") else None
    if spans is None:
        return None
    inner, outer, p, q, rate = spans
    s = float(nbytes)
    twice = 2 if collective == "all_reduce" else 1
    steps, crossing, moved = twice * (n - 1), twice * (q - 1), twice * (n - 1) / n * s
    legs = ((inner, steps - crossing, NET_OVERHEAD_S), (outer, crossing, 0.0))
    chosen = protocols.cheapest_over(legs, collective, moved, rate, q)
    if chosen is None:
        return None
    return Phase(collective, "ring", outer, n, s, steps, moved, chosen[1], chosen[0], chosen[2])


def _nodes(n: int, levels: Sequence[Interconnect],
           unit: int) -> tuple[Interconnect, Interconnect, int, int, float] | None:
    """(a node's level, the network spanning the group, ranks a node, nodes, rate) for a group over the outermost
    level filling whole nodes (of the level inside it), both levels pricing NCCL's protocols; None otherwise (one
    level, a group inside one node, ranks not filling nodes). Every byte passes each rank's link inside the node and
    the node's NICs, which the channels share: the rate is ``min(B inside, ranks a node x B network)``."""
    outer, _ = pick_level(levels, n * unit)
    if len(levels) < 2 or outer is not levels[-1]:
        return None  # inside a node
    inner = levels[-2]  # a node: the level inside the network
    p = inner.devices // unit
    if not (inner.protocol_latency_s and outer.protocol_latency_s) or p < 1 or n <= p or n % p:
        return None
    return inner, outer, p, n // p, min(_bandwidths(inner, p)[0], p * outer.bandwidth * outer.efficiency)


def _tree_across(nbytes: float, n: int, levels: Sequence[Interconnect], unit: int) -> Phase | None:
    """NCCL's tree all-reduce over nodes (castpack_collectives.protocols.tree) where both levels give tree step
    latencies: its latency grows with the log of the nodes, where the ring's grows with the ranks."""
    spans = _nodes(n, levels, unit)
    if spans is None:
        return None
    inner, outer, p, q, rate = spans
    s = float(nbytes)
    chosen = protocols.tree(inner, outer, p, q, s, rate)
    if chosen is None:
        return None
    steps = 2 * ((p - 1) + (q.bit_length() - 1))
    return Phase("all_reduce", "tree", outer, n, s, steps, 2 * s, chosen[1], chosen[0], chosen[2])


def _low_latency(nbytes: float, n: int, levels: Sequence[Interconnect], unit: int) -> Phase:
    """One step: each rank's share for the peers in its innermost domain over that level, the rest over the level
    spanning the group, at the same time; the slower of the two, plus the spanning level's latency once."""
    outer, _ = pick_level(levels, n * unit)
    inner = levels[0]
    local = min(n, max(1, inner.devices // unit))  # ranks sharing this rank's innermost domain (ranks packed)
    s = float(nbytes)
    near, far = s * (local - 1) / n, s * (n - local) / n
    time = outer.latency_s + max(near / _bandwidths(inner, local)[1], far / _bandwidths(outer, n)[1] if far else 0.0)
    return Phase("all_to_all", "low_latency", outer, n, s, 1, near + far, time)


def _hierarchical(collective: str, nbytes: float, n: int, levels: Sequence[Interconnect], unit: int,
                  allowed: Sequence[str]) -> tuple[Phase, ...] | None:
    """Inside each innermost domain, then across domains (recursively over the outer levels)."""
    if len(levels) < 2:
        return None
    inner_level = levels[0]
    p = inner_level.devices // unit  # ranks of the group inside one innermost domain (ranks packed)
    if p < 2 or p >= n or n % p:
        return None
    q = n // p

    def inner(c: str, size: float) -> tuple[Phase, ...]:
        return _best(c, size, p, [inner_level], unit, [a for a in allowed if a in NCCL and a != "hierarchical"])[1]

    def outer(c: str, size: float) -> tuple[Phase, ...]:
        return _best(c, size, q, levels[1:], unit * p, allowed)[1]

    if collective == "all_reduce":
        return (*inner("reduce_scatter", nbytes), *outer("all_reduce", nbytes / p), *inner("all_gather", nbytes))
    if collective == "all_gather":
        return (*outer("all_gather", nbytes / p), *inner("all_gather", nbytes))
    if collective == "reduce_scatter":
        return (*inner("reduce_scatter", nbytes), *outer("reduce_scatter", nbytes / p))
    if collective == "broadcast":
        return (*outer("broadcast", nbytes), *inner("broadcast", nbytes))
    return (*inner("all_to_all", nbytes), *outer("all_to_all", nbytes))  # a 2-D all-to-all


def collective_cost(collective: str, nbytes: float, n: int, levels: Sequence[Interconnect],
                    op_cost_s: float = 0.0, algorithms: Sequence[str] = NCCL) -> CollectiveCost:
    """The fastest of ``algorithms`` for one collective of ``nbytes`` over ``n`` ranks, plus ``op_cost_s``.

    The group's ranks are taken as packed: a group of n spans the innermost level with
    ``devices >= n``. Flat algorithms run wholly on that level; hierarchical runs inside each
    innermost domain and across domains on the outer levels.
    """
    _check(collective, n)
    if nbytes < 0:
        raise ValueError(f"collective size must be >= 0 bytes, not {nbytes}")
    unknown = sorted(set(algorithms) - set(ALGORITHMS))
    if unknown:
        raise ValueError(f"unknown algorithm(s) {', '.join(unknown)}; known: {', '.join(ALGORITHMS)}")
    if n == 1:  # nothing leaves the device, and NCCL-style libraries skip the launch
        return CollectiveCost(collective, nbytes, 1, "none", 0.0, 0.0, 0.0, 0, 0.0)
    if not levels:
        raise ValueError("no interconnect levels to choose from")
    algorithm, phases, fits, times = _best(collective, nbytes, n, levels, 1, algorithms, op_cost_s)
    comm_s = phases_time(phases)
    op_cost_s = 0.0 if algorithm in ENGINE_KERNELS else op_cost_s
    return CollectiveCost(collective, nbytes, n, algorithm, comm_s + op_cost_s, comm_s, op_cost_s,
                          sum(p.steps for p in phases), sum(p.bytes_moved for p in phases), phases, fits, times)
