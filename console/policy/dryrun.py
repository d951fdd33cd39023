"""Dry run: what the gates would decide and what would happen, with no effects.

Owns the human-readable description of a decision. It only calls the pure gate
functions, so running it changes nothing: no breaker is stored, no vote recorded,
no action dispatched.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from console.policy.gates import GateDecision, check_dispatch, decide_approval, evaluate_proposal
from console.policy.inputs import (
    ActionRequest,
    BreakerState,
    FleetState,
    Policy,
    RecentActions,
    Vote,
)
from console.policy.lifecycle import kind_spec

STAGES = ("proposal", "approval", "dispatch")


@dataclass(frozen=True)
class DryRun:
    decision: GateDecision
    effects: tuple[str, ...]


def _capacity(request: ActionRequest, policy: Policy, fleet: FleetState) -> str | None:
    if not kind_spec(request.kind).node_out or request.node not in fleet.node_pool:
        return None
    pool = fleet.node_pool[request.node or ""]
    out = {n for n in fleet.nodes_out if fleet.node_pool.get(n) == pool} | {request.node}
    total = fleet.pools.get(pool, 0)
    limit = policy.max_nodes_out_per_pool.allowed(total)
    return f"pool {pool} would have {len(out)} of {total} nodes out (limit {limit})"


def _what(request: ActionRequest) -> str:
    """What the action does once it runs, in its kind's words (its spec's preview)."""
    return f"{request.kind}: {kind_spec(request.kind).preview_text(request.target)}"


def dry_run(
    request: ActionRequest,
    votes: Iterable[Vote] = (),
    *,
    stage: str,
    policy: Policy,
    fleet: FleetState,
    history: RecentActions,
    breaker: BreakerState,
    now: datetime,
) -> DryRun:
    """Evaluate `request` at `stage` and describe the outcome; nothing is changed."""
    if stage not in STAGES:
        raise ValueError(f'stage must be one of {", ".join(STAGES)}, got "{stage}"')
    if stage == "proposal":
        decision = evaluate_proposal(
            request, policy=policy, fleet=fleet, history=history, breaker=breaker, now=now
        )
    elif stage == "approval":
        decision = decide_approval(
            request, votes, policy=policy, fleet=fleet, history=history, breaker=breaker, now=now
        )
    else:
        decision = check_dispatch(
            request, votes, policy=policy, fleet=fleet, history=history, breaker=breaker, now=now
        )
    effects = ["dry run: nothing was stored, sent or dispatched"]
    if decision.breaker.open and not breaker.open:
        effects.append(f"would open the circuit breaker: {decision.breaker.reason}")
    if decision.allowed:
        verb = {
            "proposal": "auto-approve",
            "approval": "approve",
            "dispatch": "dispatch",
        }[stage]
        effects.append(f"would {verb} {request.kind} on {request.target}")
        effects.append(_what(request))
        capacity = _capacity(request, policy, fleet)
        if capacity:
            effects.append(capacity)
    elif decision.refused:
        effects.append(f"would refuse {request.kind} on {request.target}")
    else:
        effects.append(
            f"would hold {request.kind} on {request.target} for "
            f"{decision.approvals_required} human approval(s)"
        )
        effects.append(_what(request))
    if decision.escalate:
        effects.append("would escalate to a human")
    return DryRun(decision, tuple(effects))
