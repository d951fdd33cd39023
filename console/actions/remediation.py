"""Remediation actions: propose, vote, cancel, expire, dispatch, and the agent's result.

Owns every write to Action and Vote rows. Keyword-only verbs with `actor=`, atomic, the
breaker row locked first so concurrent decisions see each other (blast radius is a count
across actions), `action.changed` published and effects applied only through the write
path, each change audited in the same transaction. Every rule is decided by the pure
gates in console.policy; this module builds their inputs (console.actions.gating) and
stores what they say. Refusals that must stay on record (a refused vote) commit their
audit row, then raise.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, get_args

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q

from agents import actions_contract as contract
from agents import vocab
from agents.actions_contract import Action as AgentAction
from agents.actions_contract import Status
from console import events
from console.actions import fleet
from console.actions.audit import SYSTEM, actor_name, audit, require
from console.actions.breaker import store_gate_decision
from console.actions.errors import Conflict, NotAllowed, RemediationError
from console.actions.fleet import NodeMark
from console.actions.gating import (
    breaker_input,
    fleet_state,
    history,
    locked_action,
    locked_breaker,
    policy,
    request_of,
    votes_of,
)
from console.actions.targets import executor_for, remediation_policy, resolve_target
from console.choices import ACTION_LIVE_STATES, IncidentState
from console.models import Action, Incident, Node
from console.models import Vote as VoteRow
from console.policy import gates, inputs, votes
from console.policy.dryrun import dry_run as policy_dry_run
from console.policy.fleet_health import CONDITION_CLEARED, TakenOutBy
from console.policy.lifecycle import (
    DECIDED_STATES,
    IN_FLIGHT_STATES,
    ActionKind,
    ActionState,
    TransitionError,
    check_transition,
    is_terminal,
    kind_spec,
)
from console.policy.roles import Permission
from console.roles import Actor, role_of

log = logging.getLogger(__name__)

# The agent clips to the same limit (agents.vocab); an older agent's longer text is clipped here.
OUTPUT_LIMIT = vocab.ACTION_OUTPUT_LIMIT
# A dispatched action whose agent reports nothing this long fails.
DEFAULT_DEADLINE_S = 900


def deadline_s() -> int:
    """FAULTLINE_ACTION_DEADLINE_S (seconds from dispatch to a result), read per call."""
    value = getattr(settings, "FAULTLINE_ACTION_DEADLINE_S", DEFAULT_DEADLINE_S)
    return int(value) if isinstance(value, int) and value > 0 else DEFAULT_DEADLINE_S


def deadline_of(action: Action) -> datetime | None:
    """When a dispatched action fails unless its agent reported; None before dispatch."""
    if action.dispatched_at is None:
        return None
    return action.dispatched_at + timedelta(seconds=deadline_s())


@dataclass(frozen=True)
class Outcome:
    """What a change did, and why: the gate reasons are shown to the person who acted."""

    action: Action
    reasons: tuple[str, ...]


def agent_payload(action: Action) -> AgentAction:
    """What an agent executes: the shape the node executor reads (agents/executor.py).

    A dry run is never dispatched (dispatch_action completes it with its preview), so
    `dry_run` on the wire is always false; a dry-run row reaching here is a bug.
    """
    if action.dry_run:
        raise RemediationError(f"action {action.pk} is a dry run; it is never sent to an agent")
    payload: AgentAction = {
        "id": action.pk,
        "kind": action.kind,
        "target": action.target,
        "group": action.group.name if action.group else None,
        "generation": action.generation,
        "params": {
            **action.params,
            "reason": action.reason[: contract.REASON_CHARS],
            "dry_run": False,
        },
    }
    deadline = deadline_of(action)
    if deadline is not None:  # signed with the rest: the node refuses the action after it
        payload["deadline"] = contract.deadline_text(deadline)
    return payload


def _publish(action: Action) -> None:
    events.publish_on_commit(events.FLEET, "action.changed", events.action_payload(action))


def _move(
    action: Action,
    target: ActionState,
    *,
    actor: str,
    now: datetime,
    reason: str = "",
    data: dict[str, Any] | None = None,
) -> None:
    before = action.state
    action.state = check_transition(action.state, target)
    if action.state in DECIDED_STATES and before == ActionState.PROPOSED:
        action.decided_at = now
    if action.state == ActionState.DISPATCHED:
        action.dispatched_at = now
    if is_terminal(action.state):
        action.finished_at = now
    action.save()
    audit(
        actor=actor,
        verb=f"action.{target}",
        obj=action,
        reason=reason,
        now=now,
        data={"from": before, **(data or {})},
    )
    _publish(action)


def _held_audit(action: Action, reasons: tuple[str, ...], *, actor: str, now: datetime) -> None:
    """Each gate that held the action is its own audit row, so the log can be filtered."""
    for reason in reasons:
        if reason.startswith(("blocked by", "held", "circuit breaker", "restart needs")):
            audit(actor=actor, verb="gate.held", obj=action, reason=reason, now=now)


def scheduler_params(
    kind: ActionKind,
    params: dict[str, Any],
    *,
    node: Node | None,
    gpu: str,
    group: Any,
) -> dict[str, Any]:
    """The scheduler's identity of what the action acts on, filled where the caller left it
    out: `node` (the node's name as its agent reports it, which is the scheduler's node
    name), `gpu`, and for restart_group the group's scheduler job id (`job` on its
    transitions and processes)."""
    out = {k: v for k, v in params.items() if k not in ("dry_run",)}
    spec = contract.KINDS.get(kind.value)
    if spec is None:
        return out
    names = {p.name for p in spec.params}
    if "node" in names and node is not None and not out.get("node"):
        out["node"] = node.name
    if "gpu" in names and gpu and not out.get("gpu"):
        out["gpu"] = gpu
    if "job" in names and not out.get("job") and group is not None and group.scheduler_job:
        out["job"] = group.scheduler_job
    return out


def _check_reason(reason: str) -> None:
    """A person's reason travels to the node as params.reason: refuse now, at proposal,
    what the node's executor would refuse after the approvals (agents/actions_contract)."""
    problem = contract.value_problem("reason", reason[: contract.REASON_CHARS])
    if problem is not None:
        what = problem.removeprefix("param 'reason' ")
        raise RemediationError(
            f"reason {what}: the node would refuse the action after its approvals; "
            "write the reason on one line"
        )


# -- the verbs ------------------------------------------------------------------------------


@transaction.atomic
def propose_action(
    *,
    kind: str,
    target: str,
    reason: str,
    actor: Actor | None,
    now: datetime,
    rule: str = "",
    trigger: str = "",
    incident_id: int | None = None,
    dry_run: bool = False,
    evidence: dict[str, Any] | None = None,
    params: dict[str, Any] | None = None,
) -> Outcome:
    """Record a proposal, gate it, and auto-approve it only when policy allows automation."""
    if actor is None and not rule:
        raise RemediationError("an automatic proposal must name the rule that made it")
    if actor is not None:
        require(actor, Permission.PROPOSE)
    try:
        action_kind = ActionKind(kind)
    except ValueError:
        known = ", ".join(k.value for k in ActionKind)
        raise RemediationError(f'unknown action kind "{kind}"; known: {known}') from None
    if len(reason.strip()) < 3:
        raise RemediationError("a proposal needs a reason: say what it fixes")
    if actor is None:
        reason = contract.one_line(reason)  # a rule's wording never fails on the node
    else:
        _check_reason(reason.strip())
    incident = None
    if incident_id is not None:
        incident = Incident.objects.select_related("group").filter(pk=incident_id).first()
        if incident is None:
            raise RemediationError(f"incident {incident_id} does not exist")
    node, gpu, group = resolve_target(action_kind, target)
    group = group or (incident.group if incident else None)
    params = scheduler_params(action_kind, params or {}, node=node, gpu=gpu, group=group)
    if action_kind.value in contract.KINDS:
        found = contract.problems(action_kind.value, params, target)
        if found:
            raise RemediationError("; ".join(found))
    executor, _ = executor_for(action_kind.value, node)
    breaker_row = locked_breaker()
    pol = policy()
    action = Action.objects.create(
        kind=action_kind,
        target=target,
        node=node,
        executor=executor,
        gpu=gpu,
        group=group,
        generation=group.generation if group else None,
        reason=reason.strip(),
        evidence=evidence or _evidence_of(incident),
        incident=incident,
        proposed_by=actor,
        proposed_by_rule=rule if actor is None else "",
        trigger=trigger,
        dry_run=dry_run,
        params=params,
        proposed_at=now,
        expires_at=pol.expires_at(now),
    )
    who = actor_name(actor) if actor is not None else f"rule:{rule}"
    fleet = fleet_state(exclude=action.pk, include_proposed=True)
    recent = history(now, pol)
    breaker_in = breaker_input(breaker_row)
    preview = policy_dry_run(
        request_of(action),
        stage="proposal",
        policy=pol,
        fleet=fleet,
        history=recent,
        breaker=breaker_in,
        now=now,
    )
    decision = preview.decision
    store_gate_decision(breaker_row, decision.breaker, actor=who, now=now)
    action.approvals_required = max(decision.approvals_required, 1 if decision.needs_human else 0)
    action.gate_reasons = list(decision.reasons)
    action.preview = list(preview.effects)
    action.escalated = decision.escalate
    action.save()
    audit(
        actor=who,
        verb="action.proposed",
        obj=action,
        reason=action.reason,
        now=now,
        data={
            "kind": kind,
            "target": target,
            "approvals_required": action.approvals_required,
            "reasons": list(decision.reasons),
            "dry_run": dry_run,
        },
    )
    _held_audit(action, decision.reasons, actor=who, now=now)
    if decision.allowed:  # _move publishes the approved state: one action.changed, not two
        _move(action, ActionState.APPROVED, actor=who, now=now, reason="; ".join(decision.reasons))
        if action.dry_run:
            _dispatch(action, breaker_row, now=now)
    else:
        _publish(action)
    return Outcome(action, decision.reasons)


def _evidence_of(incident: Incident | None) -> dict[str, Any]:
    """A proposal for an incident rests on its root cause's evidence when its proposer
    gave none (a person's): the approvers see what the proposer saw."""
    return dict((incident.root_cause or {}).get("evidence") or {}) if incident else {}


def vote_on_action(
    *, action_id: int, actor: Actor, approve: bool, now: datetime, reason: str = ""
) -> Outcome:
    """Cast an approve or reject; any valid reject wins, enough approvals approve.

    A refused vote (own action, second vote, expired, wrong role) is audited and then
    raised as `votes.VoteRefused`; the refusal row is committed even though nothing else is.
    """
    with transaction.atomic():
        outcome, refusal = _vote(action_id, actor, approve, now, reason)
    if refusal is not None:
        raise votes.VoteRefused(refusal)
    if outcome is None:
        raise RuntimeError(f"vote on action {action_id} produced neither outcome nor refusal")
    return outcome


def _vote(
    action_id: int, actor: Actor, approve: bool, now: datetime, reason: str
) -> tuple[Outcome | None, str | None]:
    who = actor_name(actor)
    breaker_row = locked_breaker()
    action = locked_action(action_id)
    request = request_of(action)
    stored = votes_of(action)
    ballot = inputs.Vote(
        action_id=str(action.pk),
        voter=who,
        role=role_of(actor),
        approve=approve,
        cast_at=now,
        generation=action.generation,
    )
    try:
        votes.check_vote(request, ballot, stored, now=now)
        with transaction.atomic():
            VoteRow.objects.create(
                action=action,
                user=actor,
                decision="approve" if approve else "reject",
                generation=action.generation,
                reason=reason[:512],
                cast_at=now,
            )
    except votes.VoteRefused as exc:
        audit(actor=who, verb="vote.refused", obj=action, reason=str(exc), now=now)
        if action.state == ActionState.PROPOSED and now >= action.expires_at:
            _move(
                action,
                ActionState.EXPIRED,
                actor=SYSTEM,
                now=now,
                reason="no decision before expiry",
            )
        return None, str(exc)
    except IntegrityError:
        # Two requests from the same person raced past check_vote; the unique index decided.
        message = f"{who} already voted on action {action.pk}; one vote per approver"
        audit(actor=who, verb="vote.refused", obj=action, reason=message, now=now)
        return None, message
    verb = "vote.approve" if approve else "vote.reject"
    audit(actor=who, verb=verb, obj=action, reason=reason, now=now)
    pol = policy()
    decision = gates.decide_approval(
        request,
        [*stored, ballot],
        policy=pol,
        fleet=fleet_state(exclude=action.pk, include_proposed=False),
        history=history(now, pol),
        breaker=breaker_input(breaker_row),
        now=now,
    )
    store_gate_decision(breaker_row, decision.breaker, actor=who, now=now)
    required = max(decision.approvals_required, action.approvals_required)
    action.gate_reasons = list(decision.reasons)
    if decision.refused:
        _move(action, ActionState.REJECTED, actor=who, now=now, reason="; ".join(decision.reasons))
    elif decision.allowed and len(decision.approvals) >= required:
        _move(
            action,
            ActionState.APPROVED,
            actor=who,
            now=now,
            reason=f"{len(decision.approvals)} of {required} approvals",
        )
        if action.dry_run:
            _dispatch(action, breaker_row, now=now)
    else:
        action.approvals_required = required
        action.save(update_fields=["gate_reasons", "approvals_required", "updated_at"])
        _held_audit(action, decision.reasons, actor=who, now=now)
        _publish(action)
    return Outcome(action, decision.reasons), None


@transaction.atomic
def cancel_action(*, action_id: int, actor: Actor, reason: str, now: datetime) -> Outcome:
    """Withdraw a proposed or approved action: its proposer or an admin may."""
    require(actor, Permission.CANCEL_OWN)  # nobody below it cancels anything
    action = locked_action(action_id)
    who = actor_name(actor)
    own = action.proposed_by_id is not None and action.proposed_by_id == actor.pk
    require(actor, Permission.CANCEL_ANY, own=own)
    if not reason.strip():
        raise RemediationError("cancelling needs a reason")
    try:
        _move(action, ActionState.CANCELLED, actor=who, now=now, reason=reason.strip())
    except TransitionError as exc:
        raise Conflict(str(exc)) from None
    return Outcome(action, (reason.strip(),))


@transaction.atomic
def withdraw_action(
    *, action_id: int, actor: str, reason: str, now: datetime, approved_too: bool = False
) -> Outcome:
    """Automation withdraws its own proposal (its finding resolved before a decision).

    Only a proposal a rule made, still waiting for a decision, may be withdrawn this way
    (with `approved_too`, also one approved but not yet dispatched: a node's silence or
    condition that cleared before the agent ran its take-out); people cancel through
    cancel_action.
    """
    action = locked_action(action_id)
    if action.proposed_by_id is not None or not action.proposed_by_rule:
        raise NotAllowed(f"action {action.pk} was proposed by a person; only they or an admin")
    waiting = (
        (ActionState.PROPOSED, ActionState.APPROVED) if approved_too else (ActionState.PROPOSED,)
    )
    if action.state not in waiting:
        raise Conflict(f"action {action.pk} is {action.state}; only a proposal is withdrawn")
    if not reason.strip():
        raise RemediationError("withdrawing needs a reason")
    _move(
        action,
        ActionState.CANCELLED,
        actor=actor,
        now=now,
        reason=reason.strip(),
        data={"withdrawn": True},
    )
    return Outcome(action, (reason.strip(),))


def _fail_in_flight(action: Action, *, actor: str, now: datetime, reason: str, verb: str) -> None:
    """A dispatched action ends without the agent's report: failed, with why, audited."""
    action.result = {"status": "failed", "exit_code": None, "output": reason, verb: True}
    _move(action, ActionState.FAILED, actor=actor, now=now, reason=reason, data={verb: True})
    audit(actor=actor, verb=f"action.{verb}", obj=action, reason=reason, now=now)


@transaction.atomic
def abandon_action(*, action_id: int, actor: Actor, reason: str, now: datetime) -> Outcome:
    """An admin gives up on a dispatched action whose agent never reported: it fails.

    Nothing is sent to the node: what the agent did, if anything, is unknown, which the
    result says. A result arriving afterwards is refused (the action is final).
    """
    require(actor, Permission.ABANDON)
    who = actor_name(actor)
    if len(reason.strip()) < 3:
        raise RemediationError("abandoning needs a reason: say why the agent will not report")
    action = locked_action(action_id)
    if action.state not in IN_FLIGHT_STATES:
        raise Conflict(
            f"action {action.pk} is {action.state}; only a dispatched action is abandoned "
            "(cancel a proposal or an approval instead)"
        )
    _fail_in_flight(
        action,
        actor=who,
        now=now,
        reason=f"abandoned by {who}: {reason.strip()}; whether the agent ran it is unknown",
        verb="abandoned",
    )
    return Outcome(action, (reason.strip(),))


@transaction.atomic
def expire_actions(*, now: datetime) -> list[int]:
    """Proposals and approvals nobody acted on in time expire (never dispatched late);
    dispatched actions whose agent did not report before their deadline fail."""
    expired = []
    for action in Action.objects.select_for_update(skip_locked=True).filter(
        state__in=(ActionState.PROPOSED, ActionState.APPROVED), expires_at__lte=now
    ):
        _move(action, ActionState.EXPIRED, actor=SYSTEM, now=now, reason="expired before dispatch")
        expired.append(action.pk)
    late = now - timedelta(seconds=deadline_s())
    for action in Action.objects.select_for_update(skip_locked=True).filter(
        state__in=IN_FLIGHT_STATES, dispatched_at__lte=late
    ):
        _fail_in_flight(
            action,
            actor=SYSTEM,
            now=now,
            reason=f"no result from the agent within {deadline_s()} s of dispatch; "
            "whether it ran is unknown",
            verb="deadline_passed",
        )
        expired.append(action.pk)
    return expired


@transaction.atomic
def dispatch_action(*, action_id: int, now: datetime) -> Outcome:
    """Re-check every gate against the fleet as it is now; dispatch or cancel with the reason."""
    breaker_row = locked_breaker()
    action = locked_action(action_id)
    return _dispatch(action, breaker_row, now=now)


def _dispatch(action: Action, breaker_row: Any, *, now: datetime) -> Outcome:
    if action.state == ActionState.APPROVED and now >= action.expires_at:
        _move(
            action,
            ActionState.EXPIRED,
            actor=SYSTEM,
            now=now,
            reason="approved but never dispatched",
        )
        return Outcome(action, ("expired before dispatch",))
    pol = policy()
    decision = gates.check_dispatch(
        request_of(action),
        votes_of(action),
        policy=pol,
        fleet=fleet_state(exclude=action.pk, include_proposed=False),
        history=history(now, pol),
        breaker=breaker_input(breaker_row),
        now=now,
    )
    store_gate_decision(breaker_row, decision.breaker, actor=SYSTEM, now=now)
    action.gate_reasons = list(decision.reasons)
    allowed = decision.allowed and len(decision.approvals) >= action.approvals_required
    if allowed and action.dry_run:
        # Never dispatched: the dry run completes here with what dispatch would have done.
        action.result = {
            "status": "succeeded",
            "exit_code": None,
            "dry_run": True,
            "output": "dry run: nothing was sent to the agent",
            "preview": [*action.preview, f"dispatch re-check: {'; '.join(decision.reasons)}"],
        }
        _move(
            action,
            ActionState.SUCCEEDED,
            actor=SYSTEM,
            now=now,
            reason="dry run: completed with its preview, never dispatched",
            data={"dry_run": True},
        )
    elif allowed:
        _move(
            action, ActionState.DISPATCHED, actor=SYSTEM, now=now, reason="dispatch re-check passed"
        )
    elif action.state == ActionState.APPROVED:
        _held_audit(action, decision.reasons, actor=SYSTEM, now=now)
        _move(
            action, ActionState.CANCELLED, actor=SYSTEM, now=now, reason="; ".join(decision.reasons)
        )
    return Outcome(action, decision.reasons)


def _run_by(node: Node) -> Q:
    """The actions this node's agent runs: its own (no other executor), and those routed
    to it as a controller agent (`Action.executor`)."""
    return Q(node=node, executor__isnull=True) | Q(executor=node)


def dispatch_for_node(*, node: Node, now: datetime) -> list[AgentAction]:
    """Dispatch the approved actions this node's agent runs (each re-checked) and return
    every in-flight one.

    Dispatched actions are returned until the agent reports a result: the executor runs
    each id once, so redelivery is harmless and a lost response loses nothing.
    """
    pending = Action.objects.filter(_run_by(node), state__in=ACTION_LIVE_STATES)
    if not pending.exists():  # the common case on the ingest hot path: one indexed query
        return []
    for action_id in pending.filter(state=ActionState.APPROVED).values_list("pk", flat=True):
        dispatch_action(action_id=action_id, now=now)
    rows = (
        Action.objects.filter(_run_by(node), state__in=IN_FLIGHT_STATES, dry_run=False)
        .select_related("group")
        .order_by("dispatched_at", "pk")
    )
    return [agent_payload(a) for a in rows]


_WAITING = (ActionState.PROPOSED, ActionState.APPROVED)


@transaction.atomic
def route_waiting(*, now: datetime) -> list[int]:
    """Route again each action still waiting for dispatch whose node's agent went silent
    or came back (docs/safety.md, "Who runs a proposal"): to the pool's controller agent,
    or back to the node's own. The node sweep calls it every second: with nothing waiting
    for a node-scope kind, one query. Returns the actions routed."""
    rows = list(
        Action.objects.select_for_update(of=("self",), skip_locked=True, no_key=True)
        .filter(state__in=_WAITING, dry_run=False, kind__in=contract.controller_kinds())
        .select_related("node", "executor")
    )
    if not rows:
        return []
    pol = remediation_policy()
    routed = []
    for action in rows:
        executor, wait = executor_for(action.kind, action.node, pol)
        if executor == action.executor:
            continue
        before = action.executor.name if action.executor else ""
        action.executor = executor
        action.save(update_fields=["executor", "updated_at"])
        where = f"the controller agent {executor.name}" if executor else "the node's own agent"
        audit(
            actor=SYSTEM,
            verb="action.routed",
            obj=action,
            now=now,
            reason=f"runs on {where}" + (f"; {wait}" if wait else ""),
            data={"from": before, "to": executor.name if executor else ""},
        )
        _publish(action)
        routed.append(action.pk)
    return routed


@transaction.atomic
def record_action_result(
    *,
    action_id: int,
    node: Node,
    status: str,
    exit_code: int | None,
    output: str,
    now: datetime,
    outcome: dict[str, Any] | None = None,
) -> Action:
    """Store the agent's result and its structured outcome (applied, already,
    held_by_other, refused...); a success moves the node's and GPUs' state (_apply_effect)."""
    action = locked_action(action_id)
    if (action.executor_id or action.node_id) != node.pk:
        raise NotAllowed(f"action {action_id} is not for node {node.name}")
    if status not in get_args(Status):
        raise RemediationError(f'status must be "succeeded" or "failed", got "{status}"')
    final = ActionState(status)
    if action.state not in IN_FLIGHT_STATES:
        raise Conflict(f"action {action_id} is {action.state}; a result is not expected")
    text = output if len(output) <= OUTPUT_LIMIT else output[: OUTPUT_LIMIT - 15] + "\n[truncated]"
    action.result = {"status": status, "exit_code": exit_code, "output": text}
    action.outcome = dict(outcome or {})
    state = str(action.outcome.get("state") or "")
    _move(
        action,
        final,
        actor=f"agent:{node.name}",
        now=now,
        reason=f"exit code {exit_code}" + (f", {state}" if state else ""),
        data={"exit_code": exit_code, "outcome": state},
    )
    if not action.dry_run:
        _apply_effect(action, now=now)
    return action


def _apply_effect(action: Action, *, now: datetime) -> None:
    """What a finished action does to the node and GPU state.

    Taking out (a kind whose spec takes a node or a GPU out: quarantine, cordon, drain,
    isolate) that succeeded marks the node (the spec's `marks`) or GPU and
    moves latched hardware out of service, owned by Faultline; `held_by_other` means it
    was already out, someone else's (`taken_out_by=scheduler`): Faultline never puts it
    back on its own. One a person proposed (not a rule) is the operator's decision
    (`taken_out_by=operator`): a return needs an approver, never the automatic path.
    Putting back (a `put_back` kind: uncordon_node, release_gpu) that succeeded returns the
    hardware to service and resolves its node incidents; `refused` (someone else holds it)
    is a failed result and changes nothing.
    """
    if action.node is None or action.state != ActionState.SUCCEEDED:
        return
    spec = kind_spec(action.kind)
    state = str(action.outcome.get("state") or "applied")
    who = f"agent:{(action.executor or action.node).name}"
    reason = f"action {action.pk}: {action.reason}"
    mark: NodeMark | None = None
    if spec.node_out and spec.marks:
        mark = spec.marks  # quarantined or cordoned, as the kind says
    if spec.node_out or spec.gpu_out:
        by_other = state == "held_by_other" or action.outcome.get("taken_out_by") == "other"
        condition = action.incident if mark is not None else None
        if condition is not None and condition.kind not in fleet.CONDITION_KINDS:
            condition = None
        if mark is not None:
            fleet.mark_node(node_id=action.node.pk, mark=mark, actor=who, reason=reason, now=now)
        elif action.gpu:
            fleet.isolate_gpu(uuid=action.gpu, actor=who, reason=reason, now=now)
        if condition is not None:  # silent, a NIC down, a full disk: latched while it lasts
            fleet.latch_condition(
                node_id=action.node.pk,
                incident_id=condition.pk,
                actor=who,
                reason=f"{reason} ({condition.kind})",
                now=now,
            )
        fleet.mark_out_of_service(
            node_id=action.node.pk,
            gpu=action.gpu if mark is None else "",
            taken_out_by=(
                TakenOutBy.SCHEDULER
                if by_other
                else TakenOutBy.OPERATOR
                if action.proposed_by_id is not None
                else TakenOutBy.FAULTLINE
            ),
            actor=who,
            reason=f"{reason} ({state})",
            now=now,
        )
        if condition is not None and condition.state == IncidentState.RESOLVED:
            fleet.record_repair_evidence(  # it cleared while the take-out ran
                node_id=action.node.pk,
                evidence=CONDITION_CLEARED,
                actor=who,
                now=now,
                detail={"cleared": condition.kind, "incident": condition.pk},
            )
    elif spec.effect == "put_back":
        fleet.mark_returned(
            node_id=action.node.pk,
            gpu=action.gpu if spec.target == "gpu" else "",
            actor=who,
            reason=f"{reason} ({state})",
            now=now,
        )
