"""Remediation policy: which actions a root cause calls for, per node pool.

Owns the mapping from a diagnosed root cause (a group incident's, or a fleet-scope node
incident's, given as the plain `Cause` below) to proposals — kind, target, params, reason,
the evidence they rest on — and to pages for a human where automatic recovery would hurt
(the seed's "when automatic recovery hurts"); the per-placement table (the same fault on an
idle node, a node hosting ranks, a launcher-only host or a serving worker: docs/safety.md);
which agent runs a proposal (`route`: the node's own, or the pool's controller agent for a
node that cannot be heard); one open proposal per (kind, target); which open proposals to
withdraw once their finding has resolved. Settings per pool come from plain data
(`RemediationPolicy.from_dict`, defaults in docs/safety.md).

It does not decide approval: whether a proposal is auto-approved (blast radius, breaker,
rate limits, `auto_approve` per kind and trigger) is console.policy.gates' call on the
proposal this module makes. Pure Python over plain data: no ORM, no I/O, no clock.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from agents import actions_contract as contract
from agents import vocab

from console.policy.inputs import PolicyError

# Root causes after which restarting repeats the fault or corrupts state: no restart,
# a human is paged with the diagnosis' reason. Any other root cause whose recovery advice
# says `auto_restart_safe: false` (a deterministic OOM, an undetermined cause) is paged too.
NO_RESTART_KINDS = frozenset(
    {
        "collective_mismatch",
        "nan_loss",
        "checkpoint_partial",
        "checkpoint_missing_shard",
        "checkpoint_corrupt",
        "checkpoint_modified",
        "split_brain",
        "stale_generation",
        "retry_storm",
    }
)
# Latched hardware faults: the node (or only the GPU) leaves service until repaired.
HARDWARE_KINDS = vocab.HARDWARE_FAULT_KINDS
# A GPU-scoped hardware fault may take out only that GPU where the scheduler can isolate one;
# a lost GPU is off the bus, and only its node's reboot brings it back.
GPU_SCOPED_KINDS = HARDWARE_KINDS - {vocab.GPU_LOST}
# A node's conditions (not a broken part): the node leaves service until the condition clears.
CONDITION_KINDS = frozenset({"nic_down", "disk_full"})
# The node's agent cannot be heard: taken out (cordoned, never drained: its work cannot be
# moved by a node nobody reaches) by the pool's controller agent, unless the silence is
# the fleet's (console.policy.fleet_health.silence_hold).
SILENCE_KINDS = frozenset({"node_silent"})
# Every root cause of a node's own (a fleet-scope node incident) the policy acts on.
NODE_SCOPE_KINDS = HARDWARE_KINDS | CONDITION_KINDS | SILENCE_KINDS
STALE_SERVING_KINDS = frozenset({"stale_version"})

# Where the fault sits (docs/safety.md, "Per placement"): a node running no work of
# anyone's, a node hosting ranks of a training group, a host that is only a group's
# launcher (no GPU, rank or worker of its own in the inventory: a login, head or
# controller host), a node hosting a serving worker.
IDLE = "idle"
RANKS = "ranks"
LAUNCHER = "launcher"
SERVING = "serving"
PLACEMENTS = (IDLE, RANKS, LAUNCHER, SERVING)

RULE = "policy"


@dataclass(frozen=True)
class PoolPolicy:
    """What to do in one pool. Defaults are the safe ones (docs/safety.md)."""

    scheduler: str = "slurm"  # which backend runs this pool's actions (each spec's backends)
    take_out: str = contract.DRAIN_NODE  # how a node with a latched fault leaves service
    isolate_gpu: bool = True  # GPU-scoped faults take only the GPU where the backend can
    restart_after_hardware: bool = True  # restart_group from a valid checkpoint, without it
    drain_stale_serving: bool = True
    page_when_unsafe: bool = True
    # The node name of the agent that runs this pool's node actions when a node's own agent
    # is silent (controller = true in its agent.toml: the Slurm controller or a login host
    # with scontrol rights). Empty: a silent node's take-out waits for its own agent.
    controller: str = ""

    def can_run(self, kind: str) -> bool:
        spec = contract.KINDS.get(kind)
        return spec is not None and (
            self.scheduler in spec.backends or self.scheduler not in contract.BACKENDS
        )


def node_take_out_kinds() -> list[str]:
    """What a pool's `take_out` may name: the agent kinds that take a whole node out."""
    return sorted(name for name, spec in contract.KINDS.items() if spec.node_out)


_BOOL_KEYS = frozenset(
    {"isolate_gpu", "restart_after_hardware", "drain_stale_serving", "page_when_unsafe"}
)


# The wire contract's node name (agents/protocol.py Name), or empty.
_NODE_NAME = re.compile(r"^$|^[A-Za-z0-9_.:@][A-Za-z0-9_.:@\-]{0,127}$")


def _pool(data: Mapping[str, Any], base: PoolPolicy, name: str) -> PoolPolicy:
    known = {f.name for f in fields(PoolPolicy)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise PolicyError(
            f"remediation pool {name}: unknown setting(s) {', '.join(unknown)}; "
            f"known: {', '.join(sorted(known))}"
        )
    values: dict[str, Any] = {}
    for key, raw in data.items():
        if key in _BOOL_KEYS:
            if not isinstance(raw, bool):
                raise PolicyError(f"remediation pool {name}: {key} must be true or false")
            values[key] = raw
        elif key == "scheduler":
            if raw not in contract.BACKENDS:
                raise PolicyError(
                    f"remediation pool {name}: scheduler must be one of "
                    f"{', '.join(sorted(contract.BACKENDS))}, got {raw!r}"
                )
            values[key] = raw
        elif key == "controller":
            if not isinstance(raw, str) or not _NODE_NAME.match(raw):
                raise PolicyError(
                    f"remediation pool {name}: controller must be the node name of the "
                    f"controller agent (letters, digits, _.:@-), got {raw!r}"
                )
            values[key] = raw
        elif key == "take_out":
            if raw not in node_take_out_kinds():
                raise PolicyError(
                    f"remediation pool {name}: take_out must be one of "
                    f"{', '.join(node_take_out_kinds())}, got {raw!r}"
                )
            values[key] = raw
    return replace(base, **values)


@dataclass(frozen=True)
class RemediationPolicy:
    default: PoolPolicy = PoolPolicy()
    pools: Mapping[str, PoolPolicy] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> RemediationPolicy:
        """`{"default": {...}, "pools": {"a100": {...}}}`; a pool inherits the default."""
        data = dict(data or {})
        unknown = sorted(set(data) - {"default", "pools"})
        if unknown:
            raise PolicyError(f"remediation policy: unknown key(s) {', '.join(unknown)}")
        default = _pool(data.get("default") or {}, PoolPolicy(), "default")
        pools_raw = data.get("pools") or {}
        if not isinstance(pools_raw, Mapping):
            raise PolicyError("remediation policy: pools must map a pool name to its settings")
        pools = {str(k): _pool(v or {}, default, str(k)) for k, v in pools_raw.items()}
        return cls(default=default, pools=pools)

    def for_pool(self, pool: str) -> PoolPolicy:
        return self.pools.get(pool or "default", self.default)


@dataclass(frozen=True)
class Cause:
    """A root cause as the policy reads it: plain data, from a group or a node incident.

    `recovery` is the diagnosis' advice (`auto_restart_safe`, `reason`, `checkpoint`);
    `node` is the scheduler's node name, `job` the scheduler job id of the group.
    `placement` is where the fault sits (PLACEMENTS; empty: `ranks` for a group's root
    cause, `idle` for a node's); `reporting` whether the node's own agent is heard, and
    `controller_reporting` whether the pool's controller agent is; `hold` why a silent
    node is not taken out now (fleet_health.silence_hold), empty when it may be.
    """

    kind: str
    subject: str
    finding: str  # the finding's fingerprint: the proposal is withdrawn when it resolves
    summary: str = ""
    evidence: Mapping[str, Any] = field(default_factory=dict)
    recovery: Mapping[str, Any] | None = None
    pool: str = ""
    node: str | None = None
    gpu: str | None = None
    group: str | None = None
    job: str | None = None
    incident: int | None = None
    # What already happened, so a root cause that outlives the action (device events stay
    # in the diagnosis window; a new generation re-opens them) does not repeat it.
    node_out: bool = False  # the node is already out of service
    restarted: bool = False  # a restart without this node was already made for the group
    placement: str = ""
    reporting: bool = True
    controller_reporting: bool = False
    hold: str = ""  # why a silent node, or a condition, is not taken out now

    @property
    def where(self) -> str:
        return self.placement or (RANKS if self.group else IDLE)


@dataclass(frozen=True)
class Proposal:
    kind: str
    target: str
    reason: str
    trigger: str
    finding: str
    params: Mapping[str, Any] = field(default_factory=dict)
    evidence: Mapping[str, Any] = field(default_factory=dict)
    incident: int | None = None
    rule: str = RULE
    executor: str | None = None  # the agent that runs it when not the target node's own

    @property
    def key(self) -> tuple[str, str]:
        return (self.kind, self.target)


@dataclass(frozen=True)
class Page:
    """No automatic action: a human is paged with the reason."""

    finding: str
    reason: str
    incident: int | None = None


@dataclass(frozen=True)
class Plan:
    proposals: tuple[Proposal, ...] = ()
    pages: tuple[Page, ...] = ()
    notes: tuple[str, ...] = ()  # why something was not proposed
    waits: tuple[str, ...] = ()  # why something is held, or proposed but cannot run yet


@dataclass(frozen=True)
class OpenProposal:
    """A proposal still waiting for a decision, as storage has it."""

    id: int
    kind: str
    target: str
    finding: str
    rule: str = RULE


def _trigger(cause: Cause) -> str:
    code = cause.evidence.get("code")
    return f"{cause.kind}:{code}" if code not in (None, "") else cause.kind


def _is_latched_hardware(cause: Cause) -> bool:
    if cause.kind not in HARDWARE_KINDS:
        return False
    # An Xid takes hardware out only when its class is hardware (agents/xid.py).
    return bool(cause.evidence.get("takes_gpu_out", True))


def _take_out_kind(cause: Cause, pool: PoolPolicy) -> str:
    """How the node (or GPU) leaves service, by the fault and where it sits."""
    node_kind = pool.take_out if pool.can_run(pool.take_out) else contract.CORDON_NODE
    if cause.kind in SILENCE_KINDS:
        return contract.CORDON_NODE  # nothing on a node nobody reaches can be moved off it
    if cause.where == SERVING:
        # A serving worker is drained: its traffic moves off before the node goes.
        return contract.DRAIN_NODE if pool.can_run(contract.DRAIN_NODE) else node_kind
    if (
        cause.gpu
        and cause.reporting  # only the node's own agent names its GPUs
        and pool.isolate_gpu
        and cause.kind in GPU_SCOPED_KINDS
        and pool.can_run(contract.ISOLATE_GPU)
    ):
        return contract.ISOLATE_GPU
    return node_kind


def _take_out(cause: Cause, pool: PoolPolicy) -> tuple[Proposal | None, str]:
    why = f"{cause.kind} on {cause.subject}: {cause.summary}".strip(": ")
    kind = _take_out_kind(cause, pool)
    if kind == contract.ISOLATE_GPU and cause.gpu:
        params: dict[str, Any] = {"gpu": cause.gpu}
        if cause.node:
            params["node"] = cause.node
        return (
            Proposal(
                kind=contract.ISOLATE_GPU,
                target=f"gpu:{cause.gpu}",
                reason=f"take GPU {cause.gpu} out of service: {why}",
                trigger=_trigger(cause),
                params=params,
                incident=cause.incident,
                evidence=dict(cause.evidence),
                finding=cause.finding,
            ),
            "",
        )
    if not cause.node:
        return None, f"{cause.kind} on {cause.subject}: no node named, nothing to take out"
    return (
        Proposal(
            kind=kind,
            target=f"node:{cause.node}",
            reason=f"take node {cause.node} out of service: {why}",
            trigger=_trigger(cause),
            params={"node": cause.node},
            incident=cause.incident,
            evidence=dict(cause.evidence),
            finding=cause.finding,
        ),
        "",
    )


def route(
    kind: str,
    node: str,
    pool: PoolPolicy,
    *,
    pool_name: str = "",
    reporting: bool,
    controller_reporting: bool,
) -> tuple[str | None, str]:
    """Which agent runs `kind` on `node`, and why it waits ('' when it need not).

    (None, ''): the node's own agent, which reports. A silent node's action goes to the
    pool's controller agent where the kind may run from there (its spec's `controller`);
    otherwise it stays the node's own and waits for it. Proposed either way: an approver
    may decide ahead, and it runs once an agent that may run it reports.
    """
    if reporting:
        return None, ""
    what = f"{kind} on node {node}"
    spec = contract.KINDS.get(kind)
    if spec is None or not spec.controller:
        return None, f"{what} waits: only the node's own agent runs it, and it is silent"
    if not pool.controller:
        return None, (
            f"{what} waits: its agent is silent and pool {pool_name or 'default'} names no "
            'controller agent (set "controller" in FAULTLINE_REMEDIATION_POOLS to the node '
            "of an agent run with controller = true on the scheduler's controller or a "
            "login host with its rights)"
        )
    if pool.controller == node:
        return None, f"{what} waits: the pool's controller agent is the silent node itself"
    if not controller_reporting:
        return pool.controller, f"{what} waits: the controller agent {pool.controller} is silent"
    return pool.controller, ""


def held(node: str, hold: str) -> str:
    """Why a silent node, or a node with a condition, is not taken out now."""
    return f"node {node} is not taken out: {hold}"


def _node_scope(
    cause: Cause,
    pool: PoolPolicy,
    proposals: list[Proposal],
    notes: list[str],
    waits: list[str],
) -> None:
    """Take the node or GPU out, by the placement table; a restart is the group's."""
    if cause.where == LAUNCHER:
        notes.append(
            f"{cause.kind} on {cause.subject}: {cause.node} is a launcher-only host (no GPU, "
            "rank or worker of its own): nothing to take out"
        )
        return
    if cause.hold and cause.kind in SILENCE_KINDS | CONDITION_KINDS:
        waits.append(held(cause.node or cause.subject, cause.hold))
        return
    out, note = _take_out(cause, pool)
    if note:
        notes.append(note)
    if out is None:
        return
    if cause.node_out and out.kind != contract.ISOLATE_GPU:
        notes.append(f"node {cause.node} is already out of service")
        return
    executor, wait = route(
        out.kind,
        cause.node or "",
        pool,
        pool_name=cause.pool,
        reporting=cause.reporting,
        controller_reporting=cause.controller_reporting,
    )
    if wait:
        waits.append(wait)
    proposals.append(replace(out, executor=executor))


def plan(
    cause: Cause, policy: RemediationPolicy, open_keys: Iterable[tuple[str, str]] = ()
) -> Plan:
    """Proposals and pages for one root cause; none repeats an open (kind, target)."""
    pool = policy.for_pool(cause.pool)
    recovery = cause.recovery or {}
    safe = recovery.get("auto_restart_safe")
    advice = str(recovery.get("reason") or "")
    proposals: list[Proposal] = []
    pages: list[Page] = []
    notes: list[str] = []
    waits: list[str] = []
    if cause.kind in STALE_SERVING_KINDS:
        if pool.drain_stale_serving and cause.node:
            proposals.append(
                Proposal(
                    kind=contract.DRAIN_NODE,
                    target=f"node:{cause.node}",
                    reason=f"drain the stale serving worker on {cause.node}: {cause.summary}",
                    trigger=_trigger(cause),
                    finding=cause.finding,
                    params={"node": cause.node},
                    evidence=dict(cause.evidence),
                    incident=cause.incident,
                )
            )
        else:
            notes.append(f"{cause.kind} on {cause.subject}: no node to drain")
    elif cause.kind in NO_RESTART_KINDS or (safe is False and not _is_latched_hardware(cause)):
        if pool.page_when_unsafe:
            pages.append(
                Page(
                    finding=cause.finding,
                    reason=f"no automatic restart after {cause.kind} on {cause.subject}: "
                    f"{advice or 'restarting repeats the fault'}",
                    incident=cause.incident,
                )
            )
    elif cause.kind in CONDITION_KINDS or cause.kind in SILENCE_KINDS:
        _node_scope(cause, pool, proposals, notes, waits)
    elif _is_latched_hardware(cause):
        _node_scope(cause, pool, proposals, notes, waits)
        if cause.group and cause.where == SERVING:
            notes.append(f"{cause.group} serves: its worker is drained, not restarted")
        elif cause.group and pool.restart_after_hardware:
            if cause.restarted:
                notes.append(f"{cause.group} was already restarted without {cause.node}")
            elif safe is True and recovery.get("checkpoint") and cause.job:
                without = cause.node or cause.gpu or cause.subject
                proposals.append(
                    Proposal(
                        kind=contract.RESTART_GROUP,
                        target=f"group:{cause.group}",
                        reason=f"restart {cause.group} from checkpoint "
                        f"{recovery['checkpoint']} without {without}: {advice}",
                        trigger=_trigger(cause),
                        finding=cause.finding,
                        params={"job": cause.job},
                        evidence={"checkpoint": recovery["checkpoint"], "excluded": without},
                        incident=cause.incident,
                    )
                )
            elif safe is False:
                pages.append(
                    Page(
                        finding=cause.finding,
                        reason=f"no automatic restart of {cause.group}: {advice}",
                        incident=cause.incident,
                    )
                )
            elif not cause.job:
                notes.append(f"no restart of {cause.group}: the scheduler job id is unknown")
            else:
                notes.append(f"no restart of {cause.group}: no valid checkpoint")
    seen = set(open_keys)
    kept = []
    for p in proposals:
        if p.key in seen:
            notes.append(f"{p.kind} on {p.target} is already proposed")
            continue
        seen.add(p.key)
        kept.append(p)
    return Plan(tuple(kept), tuple(pages), tuple(notes), tuple(waits))


def withdrawals(open_proposals: Iterable[OpenProposal], live_findings: Iterable[str]) -> list[int]:
    """The policy's own open proposals whose finding is no longer live."""
    live = set(live_findings)
    return [
        p.id
        for p in open_proposals
        if p.rule.startswith(RULE) and p.finding and p.finding not in live
    ]
