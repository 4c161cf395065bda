"""Who answers each operator: declared claims in call order (static), or the ops a model runs (dynamic)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from castcore.plugins.loading import CORE_NAME
from castcore.plugins.claims import ESTIMATOR, PROPERTIES, Claim, ClaimTable
from castcore.plugins.resolve import hookimpls_in_call_order
from castcore.recording.invoke import op_name
from castcore.recording.recorder import SKIPPED_NAMESPACES, Capture
from castcore.recording.whole import decomposes

if TYPE_CHECKING:
    from castcore.plugins.host import PluginHost

OK, OVERRIDE, CONFLICT, UNCOVERED = "ok", "override", "CONFLICT", "UNCOVERED"
UNREACHED = "unreached in this workload"  # a claim on an op the deployed kernels replaced
# A custom-op file or the embedding program answers before packs and the core: the seed RFC's override,
# needing no override=True.
OVERRIDE_USER = "override (user)"
USER_KINDS = ("file", "script")
# Claims that cannot answer, by why: the capture records the op's decomposition (no pack or file claims it on
# the device, and the core's claims keep nothing whole), or drops the op's calls as bookkeeping.
DECOMPOSED, NOT_RECORDED = "decomposed", "not recorded"
CANNOT_ANSWER = (DECOMPOSED, NOT_RECORDED)


@dataclass
class Candidate:
    plugin: str
    kind: str  # estimator | properties
    device: str | None
    override: bool
    function: str
    by_user: bool = False  # from a custom-op file or the embedding program

    def __str__(self) -> str:
        return f"{self.plugin} ({self.kind}{', override' if self.override else ''})"


@dataclass
class OpAudit:
    op: str
    device: str
    status: str
    candidates: list[Candidate] = field(default_factory=list)  # declared claims in call order
    answered_by: list[str] = field(default_factory=list)  # dynamic audit: who answered the calls, and how
    calls: int = 0

    @property
    def winner(self) -> Candidate | None:
        return self.candidates[0] if self.candidates and self.status not in CANNOT_ANSWER else None

    @property
    def shadowed(self) -> list[Candidate]:
        """Claims that did not answer: after the winner statically, or not among who answered."""
        if not self.answered_by:
            return self.candidates[1:] if self.winner else list(self.candidates)
        answering = {source.rsplit(" (", 1)[0] for source in self.answered_by}
        return [c for c in self.candidates if c.plugin not in answering]

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["winner"] = asdict(self.winner) if self.winner and not self.answered_by else None
        data["shadowed"] = [asdict(c) for c in self.shadowed]
        return data


def _claims_in_call_order(host: PluginHost, kind: str) -> list[tuple[str, bool, Claim]]:
    """(plugin label, whether the user's, claim) for every declared claim of ``kind``, in the order plugins
    are asked."""
    hook = host.plugins.pm.hook.estimate_op if kind == ESTIMATOR else host.plugins.pm.hook.op_properties
    ordered = []
    for impl in hookimpls_in_call_order(hook):
        if isinstance(impl.plugin, ClaimTable):
            info = host.plugins.info_for(impl.plugin_name)
            label, by_user = (
                host.plugins.label(impl.plugin_name),
                info is not None and info.kind in USER_KINDS,
            )
            ordered += [(label, by_user, c) for c in impl.plugin.claims if c.kind == kind]
    return ordered


def candidates_for(host: PluginHost, device: str) -> dict[Any, list[Candidate]]:
    """op -> its candidates on ``device``: estimators first, then properties, each in call order.

    Within one plugin only the first matching claim of a kind counts, as at run time.
    """
    result: dict[Any, list[Candidate]] = {}
    for kind in (ESTIMATOR, PROPERTIES):
        seen: set[tuple[str, Any]] = set()
        for label, by_user, claim in _claims_in_call_order(host, kind):
            if not claim.matches(device) or (label, claim.op) in seen:
                continue
            seen.add((label, claim.op))
            result.setdefault(claim.op, []).append(
                Candidate(label, kind, claim.device, claim.override, claim.fn.__qualname__, by_user)
            )
    return result


def _contest(candidates: list[Candidate]) -> str:
    """CONFLICT: two plugins claim the op in the same way and neither says override."""
    contested = False
    for i, first in enumerate(candidates):
        for second in candidates[i + 1 :]:
            if first.kind == second.kind and first.plugin != second.plugin:
                if not (first.override or second.override):
                    return CONFLICT
                contested = True
    return OVERRIDE if contested else OK


def status_of(candidates: list[Candidate]) -> str:
    """Judged without the core, whose defaults are there to be overridden: the user's claim winning over a
    pack's is ``override (user)``; two of the user's own files, or two packs, can still conflict."""
    others = [c for c in candidates if c.plugin != CORE_NAME]
    if candidates and candidates[0].by_user:
        status = _contest([c for c in others if c.by_user])
        if status != CONFLICT and any(not c.by_user for c in others):
            return OVERRIDE_USER
        return status
    return _contest(others)


def cannot_answer(op: Any, whole_ops: frozenset) -> str | None:
    """Why no claim on ``op`` can answer in a capture whose whole ops are ``whole_ops``; None if one can."""
    if op.namespace in SKIPPED_NAMESPACES:
        return NOT_RECORDED
    return DECOMPOSED if op not in whole_ops and decomposes(op) else None


def static_audit(host: PluginHost, devices: list[str], op: str | None = None) -> list[OpAudit]:
    rows = []
    for device in devices:
        whole = host.whole_ops(device)
        for claimed_op, candidates in candidates_for(host, device).items():
            name = op_name(claimed_op)
            if op is None or _op_matches(name, op):
                status = cannot_answer(claimed_op, whole) or status_of(candidates)
                rows.append(OpAudit(op=name, device=device, status=status, candidates=candidates))
    rows.sort(key=lambda r: (r.device, r.op))
    return rows


def unreached_claims(
    host: PluginHost,
    captured: Capture,
    device: str,
    replaces: Mapping[str, Sequence[str]],
    others_only: bool = False,
) -> list[tuple[str, Candidate, str]]:
    """(op, claim, the op run instead) for each claim of a pack, a custom-op file or the program on ``device``
    whose op the capture never runs because an op that ``replaces`` it (a fused kernel: name -> eager op names)
    ran instead. The core's own claims are defaults, never missed. ``others_only``: only claims another plugin's
    rewrite hides, not those of a plugin that prices every fused op run in its op's place (its own rewrite: its
    estimators still price that work, and warning of it tells the user nothing to act on)."""
    ran = {invoke.name for invoke in captured.invokes}
    instead: dict[str, list[str]] = {}
    for fused in sorted(ran):
        for hidden in replaces.get(fused, ()):
            instead.setdefault(hidden, []).append(fused)
    claimed = {op_name(op): cands for op, cands in candidates_for(host, device).items()}
    found = []
    for name, candidates in claimed.items():
        if name in ran or name not in instead:
            continue
        for c in candidates:
            own = all(_prices(claimed.get(f, ()), c) for f in instead[name])
            if c.plugin != CORE_NAME and not (others_only and own):
                found.append((name, c, instead[name][-1]))
    return found


def _prices(candidates: Sequence[Candidate], claim: Candidate) -> bool:
    return any(c.plugin == claim.plugin and c.kind == claim.kind for c in candidates)


def plugins_elsewhere(host: PluginHost, device: str) -> set[str]:
    """The labels of the plugins that do not serve ``device``: each of their claims that names devices names
    others (a claim naming none, such as the properties of a pack's own fused op, prices it anywhere)."""
    matched: dict[str, bool] = {}
    for kind in (ESTIMATOR, PROPERTIES):
        for label, _, claim in _claims_in_call_order(host, kind):
            if claim.device is not None:
                matched[label] = matched.get(label, False) or claim.matches(device)
    return {label for label, hit in matched.items() if not hit}


def unreached_lines(unreached: list[tuple[str, Candidate, str]]) -> list[str]:
    return [
        f"{claim.plugin}: its {claim.kind} for {name} ({claim.function}) is not reached in this workload: the "
        f"deployed kernels run {fused} instead (--eager prices the graph op by op)"
        for name, claim, fused in unreached
    ]


def dynamic_audit(
    host: PluginHost,
    captured: Capture,
    device: str,
    op: str | None = None,
    replaces: Mapping[str, Sequence[str]] | None = None,
) -> list[OpAudit]:
    """For every distinct op the model ran: who answered its calls on ``device``, UNCOVERED if it fell back; and
    for every claim the deployed kernels left unreached (``replaces``: see unreached_claims), a row saying so."""
    profile = host.device(device)
    claimed = {op_name(k): v for k, v in candidates_for(host, profile.name).items()}
    rows: dict[str, OpAudit] = {}
    for name, claim, fused in unreached_claims(host, captured, profile.name, replaces or {}):
        if op is None or _op_matches(name, op):
            unreached = rows.setdefault(name, OpAudit(op=name, device=profile.name, status=UNREACHED))
            unreached.candidates.append(claim)
            unreached.answered_by = [f"none: {fused} runs instead"]
    for invoke in captured.invokes:
        if op is not None and not _op_matches(invoke.name, op):
            continue
        row = rows.get(invoke.name)
        if row is None:
            candidates = claimed.get(invoke.name, [])
            row = rows[invoke.name] = OpAudit(
                op=invoke.name, device=profile.name, status=status_of(candidates), candidates=candidates
            )
        row.calls += 1
        estimate = host.resolver.estimate(invoke, profile)
        source = str(estimate.source)
        if source not in row.answered_by:
            row.answered_by.append(source)
        if estimate.fallback:
            row.status = UNCOVERED
    return sorted(rows.values(), key=lambda r: r.op)


def _op_matches(name: str, wanted: str) -> bool:
    """``aten::mm`` matches aten::mm; ``aten::add`` matches every overload of add."""
    return name == wanted or name.split(".")[0] == wanted


def format_audit(rows: list[OpAudit], dynamic: bool = False) -> str:
    if not rows:
        return "no claims match"
    header = (
        ("op", "calls", "status", "answered by", "shadowed")
        if dynamic
        else ("op", "status", "winner", "shadowed")
    )
    lines = []
    for device in sorted({r.device for r in rows}):
        body: list[tuple[str, ...]] = []
        for r in (r for r in rows if r.device == device):
            shadowed = ", ".join(str(c) for c in r.shadowed) or "-"
            if dynamic:
                body.append((r.op, str(r.calls), r.status, ", ".join(r.answered_by), shadowed))
            else:
                body.append((r.op, r.status, str(r.winner or "-"), shadowed))
        widths = [max(len(row[i]) for row in [header, *body]) for i in range(len(header))]
        lines += [
            f"device {device}",
            *("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in [header, *body]),
            "",
        ]
    counts = {
        s: sum(r.status == s for r in rows) for s in (CONFLICT, OVERRIDE_USER, OVERRIDE, UNCOVERED, UNREACHED)
    }
    counts.update({s: n for s in CANNOT_ANSWER if (n := sum(r.status == s for r in rows))})
    lines.append(", ".join(f"{n} {s}" for s, n in counts.items()) + f" among {len(rows)} rows")
    return "\n".join(lines)
