"""Safety gates for remediation actions, evaluated at proposal, approval and dispatch.

Owns the rules that keep automation from making an incident worse: blast radius, rate
limits, repeated remediation of one node, the circuit breaker, auto-approval and
restart safety, and the dispatch-time re-check. Pure: plain inputs and `now` in, a
`GateDecision` out; it never stores, sends or dispatches anything. An approval never
bypasses a gate: `check_dispatch` evaluates every gate again.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from console.policy import breaker as breakers
from console.policy.fleet_health import TakenOutBy
from console.policy.inputs import (
    ActionRequest,
    BreakerState,
    FleetState,
    Limit,
    Policy,
    RecentActions,
    Vote,
)
from console.policy.lifecycle import ActionState, kind_spec
from console.policy.votes import tally


@dataclass(frozen=True)
class GateDecision:
    """What the gates say about one action at one stage.

    `allowed`: it may go ahead now (be auto-approved, become approved, be dispatched).
    `needs_human`: automation may not approve it. `approvals_required`: distinct human
    approvals it needs (0 when policy auto-approves it). `refused`: no vote can help
    (expired, rejected, stale, wrong state). `escalate`: a gate held it; page a human.
    `breaker` is the breaker state after this evaluation; store it if it changed.
    """

    allowed: bool
    needs_human: bool
    approvals_required: int
    reasons: tuple[str, ...]
    stage: str
    refused: bool = False
    escalate: bool = False
    approvals: tuple[str, ...] = ()
    breaker: BreakerState = field(default_factory=BreakerState)


@dataclass(frozen=True)
class _Holds:
    reasons: tuple[str, ...]
    above_limit: bool


def _limit_text(limit: Limit, total: int, unit: str) -> str:
    if limit.count is not None:
        return f"limit {limit.count} {unit}"
    return f"limit {limit.describe()}, {limit.allowed(total)} {unit}"


def _over(out: int, total: int, limit: Limit, where: str, unit: str, verb: str) -> str | None:
    if out + 1 <= limit.allowed(total):
        return None
    return (
        f"blocked by blast radius: {out} of {total} {unit} {where} already {verb} "
        f"({_limit_text(limit, total, unit)})"
    )


def _node_blast(request: ActionRequest, policy: Policy, fleet: FleetState) -> list[str]:
    node = request.node
    if node is None or node not in fleet.node_pool:
        # Fail closed: what cannot be counted cannot be shown to be under the limit.
        return [f"blocked by blast radius: node {node} is not in the fleet inventory"]
    if node in fleet.nodes_out:
        return []
    pool = fleet.node_pool[node]
    in_pool = sum(1 for n in fleet.nodes_out if fleet.node_pool.get(n) == pool)
    verb = "quarantined or cordoned"
    found = [
        _over(
            in_pool,
            fleet.pools.get(pool, 0),
            policy.max_nodes_out_per_pool,
            f"in pool {pool}",
            "nodes",
            verb,
        ),
        _over(
            len(fleet.nodes_out),
            sum(fleet.pools.values()),
            policy.max_nodes_out_fleet,
            "in the fleet",
            "nodes",
            verb,
        ),
    ]
    return [r for r in found if r]


def _gpu_blast(request: ActionRequest, policy: Policy, fleet: FleetState) -> list[str]:
    gpu = request.gpu
    pool = fleet.gpu_pool(gpu) if gpu else None
    if gpu is None or pool is None:
        return [f"blocked by blast radius: GPU {gpu} is not in the fleet inventory"]
    if gpu in fleet.isolated_gpus:
        return []
    in_pool = sum(1 for g in fleet.isolated_gpus if fleet.gpu_pool(g) == pool)
    found = [
        _over(
            in_pool,
            fleet.pool_gpus.get(pool, 0),
            policy.max_gpus_out_per_pool,
            f"in pool {pool}",
            "GPUs",
            "isolated",
        ),
        _over(
            len(fleet.isolated_gpus),
            sum(fleet.pool_gpus.values()),
            policy.max_gpus_out_fleet,
            "in the fleet",
            "GPUs",
            "isolated",
        ),
    ]
    return [r for r in found if r]


def _rates(
    request: ActionRequest,
    policy: Policy,
    fleet: FleetState,
    history: RecentActions,
    now: datetime,
) -> list[str]:
    reasons = []
    recent = history.since(now - timedelta(seconds=policy.rate_window_s))
    window = breakers.span(policy.rate_window_s)
    same_kind = sum(1 for r in recent if r.kind == request.kind)
    if same_kind >= policy.kind_limit(request.kind):
        reasons.append(
            f"held by rate limit: {same_kind} {request.kind} actions in the last {window} "
            f"(limit {policy.kind_limit(request.kind)})"
        )
    same_target = sum(1 for r in recent if r.target == request.target)
    if same_target >= policy.max_per_target:
        reasons.append(
            f"held by rate limit: {same_target} actions on {request.target} in the last "
            f"{window} (limit {policy.max_per_target})"
        )
    # A GPU action lands on that GPU's node: isolating its GPUs one by one is still
    # remediating the same node again and again.
    node = request.node or (fleet.gpu_node.get(request.gpu) if request.gpu else None)
    if node:
        since = now - timedelta(seconds=policy.repeat_window_s)
        repeats = sum(1 for r in history.since(since) if r.node == node)
        if repeats >= policy.max_repeats_per_node:
            reasons.append(
                f"held for a human: node {node} was remediated {repeats} times in the last "
                f"{breakers.span(policy.repeat_window_s)} (limit {policy.max_repeats_per_node}); "
                "a person decides the next remediation"
            )
    return reasons


def _holds(
    request: ActionRequest,
    policy: Policy,
    fleet: FleetState,
    history: RecentActions,
    breaker: BreakerState,
    now: datetime,
) -> _Holds:
    blast: list[str] = []
    spec = kind_spec(request.kind)
    if spec.node_out:
        blast = _node_blast(request, policy, fleet)
    elif spec.gpu_out:
        blast = _gpu_blast(request, policy, fleet)
    reasons = list(blast) + _rates(request, policy, fleet, history, now)
    if breaker.open:
        reasons.append(
            f"circuit breaker {breakers.describe(breaker)}; every action needs a human "
            "until an admin closes it"
        )
    reasons += return_holds(request)
    if spec.effect == "restart" and request.auto_restart_safe is not True:
        advice = request.restart_advice.strip() or "diagnosis gave no restart advice"
        if request.auto_restart_safe is False:
            advice = f"diagnosis says auto-restart is unsafe: {advice}"
        reasons.append(f"restart needs a human: {advice}")
    return _Holds(tuple(reasons), above_limit=bool(blast))


def return_holds(request: ActionRequest) -> list[str]:
    """Putting capacity back: blast radius does not apply, but the repeat-offender rule
    and ownership do; a node someone else took out is theirs until an approver says so."""
    if kind_spec(request.kind).effect != "put_back":
        return []
    out = []
    if request.replace_flagged:
        out.append(
            f"held: {request.target} is flagged for replacement (repeat faults); "
            "returning it needs an approver"
        )
    if request.taken_out_by not in ("", TakenOutBy.FAULTLINE):
        out.append(
            f"held: {request.target} was taken out by the {request.taken_out_by}, not "
            "Faultline; only an approver puts it back"
        )
    return out


def _refuse(stage: str, reason: str, breaker: BreakerState, required: int = 0) -> GateDecision:
    return GateDecision(
        allowed=False,
        needs_human=True,
        approvals_required=required,
        reasons=(reason,),
        stage=stage,
        refused=True,
        breaker=breaker,
    )


def _requirement(
    request: ActionRequest, policy: Policy, holds: _Holds
) -> tuple[bool, int, list[str]]:
    """(needs_human, approvals_required, reasons) before any vote is counted."""
    reasons = list(holds.reasons)
    if request.automatic and not holds.reasons:
        if policy.auto_approves(request.kind, request.trigger):
            return False, 0, [f"auto-approved by policy: {request.kind} after {request.trigger}"]
        reasons.append(f"auto-approval is off for {request.kind}; an approver decides")
    if holds.above_limit:
        need = policy.approvals_above_limit
        reasons.append(f"above the blast-radius limit: needs {need} distinct approvers")
        return True, need, reasons
    return True, policy.approvals_required, reasons


def evaluate_proposal(
    request: ActionRequest,
    *,
    policy: Policy,
    fleet: FleetState,
    history: RecentActions,
    breaker: BreakerState,
    now: datetime,
) -> GateDecision:
    """Gate a proposed action: may automation approve it, or how many humans must?"""
    state = breakers.trip(breaker, history, policy, now)
    if request.state != ActionState.PROPOSED:
        return _refuse("proposal", f"action {request.id} is {request.state}, not proposed", state)
    if now >= request.expires_at:
        return _refuse(
            "proposal",
            f"action {request.id} expired at {request.expires_at:%Y-%m-%d %H:%M UTC}; "
            "propose it again",
            state,
        )
    holds = _holds(request, policy, fleet, history, state, now)
    needs_human, required, reasons = _requirement(request, policy, holds)
    return GateDecision(
        allowed=not needs_human,
        needs_human=needs_human,
        approvals_required=required,
        reasons=tuple(reasons),
        stage="proposal",
        escalate=bool(holds.reasons),
        breaker=state,
    )


def _with_votes(base: GateDecision, request: ActionRequest, votes: Iterable[Vote]) -> GateDecision:
    counted = tally(request, votes)
    reasons = list(base.reasons) + list(counted.ignored)
    if counted.rejecters:
        reasons.append(f"rejected by {', '.join(counted.rejecters)}")
        return GateDecision(
            allowed=False,
            needs_human=base.needs_human,
            approvals_required=base.approvals_required,
            reasons=tuple(reasons),
            stage=base.stage,
            refused=True,
            escalate=base.escalate,
            approvals=counted.approvers,
            breaker=base.breaker,
        )
    have = len(counted.approvers)
    enough = have >= base.approvals_required
    if base.needs_human:
        reasons.append(f"{have} of {base.approvals_required} approvals")
    return GateDecision(
        allowed=enough,
        needs_human=base.needs_human,
        approvals_required=base.approvals_required,
        reasons=tuple(reasons),
        stage=base.stage,
        escalate=base.escalate,
        approvals=counted.approvers,
        breaker=base.breaker,
    )


def decide_approval(
    request: ActionRequest,
    votes: Iterable[Vote],
    *,
    policy: Policy,
    fleet: FleetState,
    history: RecentActions,
    breaker: BreakerState,
    now: datetime,
) -> GateDecision:
    """Whether the votes so far approve `request`; any valid reject wins."""
    base = evaluate_proposal(
        request, policy=policy, fleet=fleet, history=history, breaker=breaker, now=now
    )
    if base.refused:
        return base
    return _with_votes(
        GateDecision(
            allowed=base.allowed,
            needs_human=base.needs_human,
            approvals_required=base.approvals_required,
            reasons=base.reasons,
            stage="approval",
            escalate=base.escalate,
            breaker=base.breaker,
        ),
        request,
        votes,
    )


def check_dispatch(
    request: ActionRequest,
    votes: Iterable[Vote],
    *,
    policy: Policy,
    fleet: FleetState,
    history: RecentActions,
    breaker: BreakerState,
    now: datetime,
) -> GateDecision:
    """Re-check an approved action right before it is sent to an agent.

    The group must still be on the generation the action was decided for, and every
    gate is evaluated again against the fleet as it is now: an action approved when
    it was safe is refused if it no longer is and its votes do not cover the change.
    """
    state = breakers.trip(breaker, history, policy, now)
    if request.state != ActionState.APPROVED:
        return _refuse("dispatch", f"action {request.id} is {request.state}, not approved", state)
    if request.group is not None or kind_spec(request.kind).on_generation:
        current = fleet.generations.get(request.group or "")
        if request.generation is None or current != request.generation:
            return _refuse(
                "dispatch",
                f"stale: group {request.group} is at generation {current}, the action was "
                f"decided for generation {request.generation}; propose it again",
                state,
            )
    holds = _holds(request, policy, fleet, history, state, now)
    needs_human, required, reasons = _requirement(request, policy, holds)
    base = GateDecision(
        allowed=not needs_human,
        needs_human=needs_human,
        approvals_required=required,
        reasons=tuple(reasons),
        stage="dispatch",
        escalate=bool(holds.reasons),
        breaker=state,
    )
    decided = _with_votes(base, request, votes)
    if not decided.allowed and not decided.refused:
        return GateDecision(
            allowed=False,
            needs_human=True,
            approvals_required=required,
            reasons=(*decided.reasons, "not dispatched: the gates changed since approval"),
            stage="dispatch",
            refused=True,
            escalate=True,
            approvals=decided.approvals,
            breaker=state,
        )
    return decided
