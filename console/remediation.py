"""The write path for remediation: actions, votes, dispatch, results, breaker, silences.

Same shape as console.actions: keyword-only `do`-style verbs with `actor=`, atomic, the
breaker row locked first so concurrent decisions see each other (blast radius is a
count across actions), live events and Celery enqueues only after commit. Every rule is
decided by the pure gates in console.policy; this module only builds their inputs from
the database and stores what they say, with an AuditLog row in the same transaction.
Refusals that must stay on record (a refused vote) commit their audit row, then raise.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Count, Q

from console import events, live
from console.choices import ACTION_LIVE_STATES, UserRole
from console.models import (
    Action,
    AuditLog,
    BreakerState,
    ConsistencyGroup,
    Device,
    Incident,
    Node,
    Rank,
)
from console.models import Vote as VoteRow
from console.policy import breaker as breakers
from console.policy import gates, inputs, votes
from console.policy.dryrun import dry_run as policy_dry_run
from console.policy.lifecycle import (
    GPU_KINDS,
    NODE_KINDS,
    ActionKind,
    ActionState,
    TransitionError,
    check_transition,
)
from console.roles import has_role, role_of

log = logging.getLogger(__name__)

OUTPUT_LIMIT = 4096
LIVE_STATES = ACTION_LIVE_STATES
HISTORY_STATES = ("dispatched", "acknowledged", "succeeded", "failed")


class RemediationError(ValueError):
    """A remediation request that cannot apply; the message names the problem and the fix."""


class NotAllowed(PermissionError):
    """The actor's role or relation to the action does not allow this change."""


class NotFound(LookupError):
    """No such action (or not one this agent may see)."""


class Conflict(RemediationError):
    """The action is not in a state where this change applies (e.g. a result twice)."""


@dataclass(frozen=True)
class Outcome:
    """What a change did, and why: the gate reasons are shown to the person who acted."""

    action: Action
    reasons: tuple[str, ...]


# -- inputs for the pure gates ----------------------------------------------------------------


def policy() -> inputs.Policy:
    """Gate settings; read per call (never at import) from FAULTLINE_REMEDIATION_POLICY."""
    return inputs.Policy.from_dict(getattr(settings, "FAULTLINE_REMEDIATION_POLICY", None))


def actor_name(actor: Any | None) -> str:
    return actor.get_username() if actor is not None else "system"


def audit(
    *,
    actor: str,
    verb: str,
    obj: Any = None,
    reason: str = "",
    data: dict[str, Any] | None = None,
    now: datetime,
    object_type: str = "",
    object_id: str = "",
) -> AuditLog:
    """Append one audit row (inside the caller's transaction)."""
    if obj is not None:
        object_type = object_type or type(obj).__name__.lower()
        object_id = object_id or str(obj.pk)
    return AuditLog.objects.create(
        ts=now,
        actor=actor[:150],
        verb=verb,
        object_type=object_type or "system",
        object_id=object_id,
        reason=reason,
        data=data or {},
    )


def role_refused(actor: Any, what: str, minimum: str) -> NotAllowed:
    """The refusal for an actor below `minimum`, naming who, their role and what it needs."""
    return NotAllowed(
        f"{actor_name(actor)} is a {role_of(actor)}; the {minimum} role is needed for {what}"
    )


def _locked_breaker() -> BreakerState:
    # The single breaker row doubles as the remediation lock: proposals, votes and
    # dispatches that count nodes out of service must not interleave.
    BreakerState.objects.get_or_create(pk=1)
    return BreakerState.objects.select_for_update().get(pk=1)


def _breaker_input(row: BreakerState) -> inputs.BreakerState:
    return inputs.BreakerState(
        open=row.open,
        reason=row.reason,
        opened_at=row.opened_at,
        closed_at=row.closed_at,
        closed_by=row.closed_by or None,
        close_reason=row.closed_reason,
    )


def _store_breaker(
    row: BreakerState, state: inputs.BreakerState, *, actor: str, now: datetime
) -> None:
    if state.open == row.open:
        return
    row.open, row.reason, row.opened_at = state.open, state.reason, state.opened_at
    row.opened_by = actor
    row.save()
    audit(actor=actor, verb="breaker.opened", obj=row, reason=state.reason, now=now)
    transaction.on_commit(lambda: live.publish(events.FLEET, "breaker.changed", breaker_payload()))


def fleet_state(*, exclude: int | None, include_proposed: bool) -> inputs.FleetState:
    """Inventory plus what is out or committed to go out (live actions other than `exclude`).

    At proposal, pending proposals count too, so a storm of proposals is held early; at
    approval and dispatch only actions already approved or in flight count.
    """
    nodes = list(Node.objects.values_list("name", "pool", "quarantined", "cordoned"))
    node_pool = {n: (pool or "default") for n, pool, _, _ in nodes}
    pools: dict[str, int] = {}
    for pool in node_pool.values():
        pools[pool] = pools.get(pool, 0) + 1
    quarantined = {n for n, _, q, _ in nodes if q}
    cordoned = {n for n, _, _, c in nodes if c}
    gpus = list(Device.objects.values_list("uuid", "node__name", "isolated"))
    gpu_node = {g: n for g, n, _ in gpus}
    pool_gpus: dict[str, int] = {}
    for _, n, _ in gpus:
        pool_gpus[node_pool[n]] = pool_gpus.get(node_pool[n], 0) + 1
    isolated = {g for g, _, i in gpus if i}
    states = [*LIVE_STATES, "proposed"] if include_proposed else list(LIVE_STATES)
    pending = Action.objects.filter(state__in=states).exclude(pk=exclude)
    for kind, node, gpu in pending.values_list("kind", "node__name", "gpu"):
        if kind in NODE_KINDS and node:
            cordoned.add(node)
        elif kind in GPU_KINDS and gpu:
            isolated.add(gpu)
    generations = dict(ConsistencyGroup.objects.values_list("name", "generation"))
    return inputs.FleetState(
        pools=pools,
        node_pool=node_pool,
        quarantined=frozenset(quarantined),
        cordoned=frozenset(cordoned),
        pool_gpus=pool_gpus,
        gpu_node=gpu_node,
        isolated_gpus=frozenset(isolated),
        generations=generations,
    )


def history(now: datetime, pol: inputs.Policy) -> inputs.RecentActions:
    window = max(pol.rate_window_s, pol.repeat_window_s, pol.breaker_window_s)
    rows = Action.objects.filter(
        state__in=HISTORY_STATES, dispatched_at__gt=now - timedelta(seconds=window)
    ).values_list("kind", "target", "dispatched_at", "proposed_by_id", "node__name", "state")
    return inputs.RecentActions.of(
        inputs.ActionRecord(
            kind=ActionKind(kind),
            target=target,
            at=at,
            automatic=by is None,
            node=node,
            failed=state == "failed",
        )
        for kind, target, at, by, node, state in rows
    )


def _request(action: Action) -> inputs.ActionRequest:
    advice = (action.incident.recovery if action.incident else None) or (
        action.group.summary.get("recovery_advice") if action.group else None
    )
    safe = advice.get("auto_restart_safe") if isinstance(advice, dict) else None
    return inputs.ActionRequest(
        id=str(action.pk),
        kind=ActionKind(action.kind),
        target=action.target,
        proposed_at=action.proposed_at,
        expires_at=action.expires_at,
        proposed_by=action.proposed_by.get_username() if action.proposed_by else None,
        state=ActionState(action.state),
        node=action.node.name if action.node else None,
        gpu=action.gpu or None,
        group=action.group.name if action.group else None,
        generation=action.generation,
        trigger=action.trigger or None,
        auto_restart_safe=safe if isinstance(safe, bool) else None,
        restart_advice=str(advice.get("reason", "")) if isinstance(advice, dict) else "",
    )


def _votes(action: Action) -> list[inputs.Vote]:
    return [
        inputs.Vote(
            action_id=str(v.action_id),
            voter=v.user.get_username(),
            role=role_of(v.user),
            approve=v.decision == "approve",
            cast_at=v.cast_at,
            generation=v.generation,
        )
        for v in action.votes.select_related("user__membership")
    ]


def _locked_action(action_id: int) -> Action:
    try:
        return (
            Action.objects.select_for_update(of=("self",))
            .select_related("node", "group", "incident", "proposed_by")
            .get(pk=action_id)
        )
    except Action.DoesNotExist:
        raise NotFound(f"action {action_id} does not exist") from None


# -- targets ----------------------------------------------------------------------------------

_TARGET_PREFIX = {
    ActionKind.QUARANTINE_NODE: "node",
    ActionKind.CORDON_NODE: "node",
    ActionKind.DRAIN_NODE: "node",
    ActionKind.ISOLATE_GPU: "gpu",
    ActionKind.ISOLATE_RANK: "rank",
    ActionKind.RESTART_GROUP: "group",
    ActionKind.ROLLBACK_MODEL: "group",
    ActionKind.PAGE_HUMAN: "*",
}


def _resolve_target(
    kind: ActionKind, target: str
) -> tuple[Node | None, str, ConsistencyGroup | None]:
    """(executing node, gpu uuid, group) for a subject string; raises if it names nothing."""
    prefix, _, name = target.partition(":")
    want = _TARGET_PREFIX[kind]
    if not name or (want != "*" and prefix != want):
        example = {
            "node": "node:node-17",
            "gpu": "gpu:GPU-<uuid>",
            "rank": "rank:<group>/<rank>",
            "group": "group:<name>",
            "*": "node:node-17",
        }[want]
        raise RemediationError(f'{kind} needs a target like "{example}", got "{target}"')
    if prefix == "node":
        node = Node.objects.filter(name=name).first()
        if node is None:
            raise RemediationError(f'target "{target}": node {name} is not in the fleet inventory')
        return node, "", None
    if prefix == "gpu":
        device = Device.objects.select_related("node").filter(uuid=name).first()
        if device is None:
            raise RemediationError(f'target "{target}": GPU {name} is not in the fleet inventory')
        return device.node, name, None
    if prefix in ("group", "rank"):
        group_name, _, rank = name.partition("/") if prefix == "rank" else (name, "", "")
        group = ConsistencyGroup.objects.filter(name=group_name).first()
        if group is None:
            raise RemediationError(f'target "{target}": group {group_name} does not exist')
        ranks = Rank.objects.filter(group=group, node__isnull=False).select_related("node")
        if prefix == "rank":
            if not rank.isdigit():
                raise RemediationError(f'target "{target}": rank must be a number')
            ranks = ranks.filter(rank=int(rank))
        # A group-wide action runs on the agent of its lowest rank (the group's leader).
        member = ranks.order_by("rank").first()
        return (member.node if member else None), "", group
    raise RemediationError(f'target "{target}" must start with node:, gpu:, rank: or group:')


# -- payloads ---------------------------------------------------------------------------------


def action_payload(action: Action) -> dict[str, Any]:
    return {
        "id": action.pk,
        "kind": action.kind,
        "target": action.target,
        "state": action.state,
        "approvals_required": action.approvals_required,
        "reasons": action.gate_reasons,
    }


def agent_payload(action: Action) -> dict[str, Any]:
    """What an agent executes: the shape the node executor reads (agents/executor.py)."""
    return {
        "id": action.pk,
        "kind": action.kind,
        "target": action.target,
        "group": action.group.name if action.group else None,
        "generation": action.generation,
        "params": {**action.params, "reason": action.reason[:200], "dry_run": action.dry_run},
    }


def breaker_payload() -> dict[str, Any]:
    row, _ = BreakerState.objects.get_or_create(pk=1)
    return {
        "open": row.open,
        "reason": row.reason,
        "opened_at": row.opened_at,
        "opened_by": row.opened_by,
        "closed_at": row.closed_at,
        "closed_by": row.closed_by,
        "closed_reason": row.closed_reason,
        "description": breakers.describe(_breaker_input(row)),
    }


def _publish(action: Action) -> None:
    payload = action_payload(action)
    transaction.on_commit(lambda: live.publish(events.FLEET, "action.changed", payload))


def _move(
    action: Action,
    target: str,
    *,
    actor: str,
    now: datetime,
    reason: str = "",
    data: dict[str, Any] | None = None,
) -> None:
    before = action.state
    action.state = check_transition(action.state, target)
    if target in ("approved", "rejected", "cancelled", "expired") and before == "proposed":
        action.decided_at = now
    if target == "dispatched":
        action.dispatched_at = now
    if target in ("succeeded", "failed", "cancelled", "expired", "rejected"):
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


# -- the verbs ------------------------------------------------------------------------------


@transaction.atomic
def propose_action(
    *,
    kind: str,
    target: str,
    reason: str,
    actor: Any | None,
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
    if actor is not None and not has_role(actor, UserRole.OPERATOR):
        raise role_refused(actor, "proposing", UserRole.OPERATOR)
    try:
        action_kind = ActionKind(kind)
    except ValueError:
        known = ", ".join(k.value for k in ActionKind)
        raise RemediationError(f'unknown action kind "{kind}"; known: {known}') from None
    if len(reason.strip()) < 3:
        raise RemediationError("a proposal needs a reason: say what it fixes")
    incident = None
    if incident_id is not None:
        incident = Incident.objects.select_related("group").filter(pk=incident_id).first()
        if incident is None:
            raise RemediationError(f"incident {incident_id} does not exist")
    node, gpu, group = _resolve_target(action_kind, target)
    group = group or (incident.group if incident else None)
    breaker_row = _locked_breaker()
    pol = policy()
    action = Action.objects.create(
        kind=action_kind,
        target=target,
        node=node,
        gpu=gpu,
        group=group,
        generation=group.generation if group else None,
        reason=reason.strip(),
        evidence=evidence or {},
        incident=incident,
        proposed_by=actor,
        proposed_by_rule=rule if actor is None else "",
        trigger=trigger,
        dry_run=dry_run,
        params=params or {},
        proposed_at=now,
        expires_at=pol.expires_at(now),
    )
    who = actor_name(actor) if actor is not None else f"rule:{rule}"
    fleet = fleet_state(exclude=action.pk, include_proposed=True)
    recent = history(now, pol)
    breaker_in = _breaker_input(breaker_row)
    preview = policy_dry_run(
        _request(action),
        stage="proposal",
        policy=pol,
        fleet=fleet,
        history=recent,
        breaker=breaker_in,
        now=now,
    )
    decision = preview.decision
    _store_breaker(breaker_row, decision.breaker, actor=who, now=now)
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
    if decision.allowed:
        _move(action, "approved", actor=who, now=now, reason="; ".join(decision.reasons))
    _publish(action)
    return Outcome(action, decision.reasons)


def vote_on_action(
    *, action_id: int, actor: Any, approve: bool, now: datetime, reason: str = ""
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
    action_id: int, actor: Any, approve: bool, now: datetime, reason: str
) -> tuple[Outcome | None, str | None]:
    who = actor_name(actor)
    breaker_row = _locked_breaker()
    action = _locked_action(action_id)
    request = _request(action)
    stored = _votes(action)
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
        if action.state == "proposed" and now >= action.expires_at:
            _move(action, "expired", actor="system", now=now, reason="no decision before expiry")
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
        breaker=_breaker_input(breaker_row),
        now=now,
    )
    _store_breaker(breaker_row, decision.breaker, actor=who, now=now)
    required = max(decision.approvals_required, action.approvals_required)
    action.gate_reasons = list(decision.reasons)
    if decision.refused:
        _move(action, "rejected", actor=who, now=now, reason="; ".join(decision.reasons))
    elif decision.allowed and len(decision.approvals) >= required:
        _move(
            action,
            "approved",
            actor=who,
            now=now,
            reason=f"{len(decision.approvals)} of {required} approvals",
        )
    else:
        action.approvals_required = required
        action.save(update_fields=["gate_reasons", "approvals_required", "updated_at"])
        _held_audit(action, decision.reasons, actor=who, now=now)
        _publish(action)
    return Outcome(action, decision.reasons), None


@transaction.atomic
def cancel_action(*, action_id: int, actor: Any, reason: str, now: datetime) -> Outcome:
    """Withdraw a proposed or approved action: its proposer or an admin may."""
    action = _locked_action(action_id)
    who = actor_name(actor)
    is_proposer = action.proposed_by_id is not None and action.proposed_by_id == actor.pk
    if not (is_proposer and has_role(actor, UserRole.OPERATOR)) and not has_role(
        actor, UserRole.ADMIN
    ):
        raise NotAllowed(f"{who} may not cancel action {action.pk}: only its proposer or an admin")
    if not reason.strip():
        raise RemediationError("cancelling needs a reason")
    try:
        _move(action, "cancelled", actor=who, now=now, reason=reason.strip())
    except TransitionError as exc:
        raise Conflict(str(exc)) from None
    return Outcome(action, (reason.strip(),))


@transaction.atomic
def expire_actions(*, now: datetime) -> list[int]:
    """Proposals and approvals nobody acted on in time expire (never dispatched late)."""
    expired = []
    for action in Action.objects.select_for_update(skip_locked=True).filter(
        state__in=("proposed", "approved"), expires_at__lte=now
    ):
        _move(action, "expired", actor="system", now=now, reason="expired before dispatch")
        expired.append(action.pk)
    return expired


@transaction.atomic
def dispatch_action(*, action_id: int, now: datetime) -> Outcome:
    """Re-check every gate against the fleet as it is now; dispatch or cancel with the reason."""
    breaker_row = _locked_breaker()
    action = _locked_action(action_id)
    if action.state == "approved" and now >= action.expires_at:
        _move(action, "expired", actor="system", now=now, reason="approved but never dispatched")
        return Outcome(action, ("expired before dispatch",))
    pol = policy()
    decision = gates.check_dispatch(
        _request(action),
        _votes(action),
        policy=pol,
        fleet=fleet_state(exclude=action.pk, include_proposed=False),
        history=history(now, pol),
        breaker=_breaker_input(breaker_row),
        now=now,
    )
    _store_breaker(breaker_row, decision.breaker, actor="system", now=now)
    action.gate_reasons = list(decision.reasons)
    if decision.allowed and len(decision.approvals) >= action.approvals_required:
        _move(action, "dispatched", actor="system", now=now, reason="dispatch re-check passed")
    elif action.state == "approved":
        _held_audit(action, decision.reasons, actor="system", now=now)
        _move(action, "cancelled", actor="system", now=now, reason="; ".join(decision.reasons))
    return Outcome(action, decision.reasons)


def dispatch_for_node(*, node: Node, now: datetime) -> list[dict[str, Any]]:
    """Dispatch this node's approved actions (each re-checked) and return every in-flight one.

    Dispatched actions are returned until the agent reports a result: the executor runs
    each id once, so redelivery is harmless and a lost response loses nothing.
    """
    pending = Action.objects.filter(node=node, state__in=LIVE_STATES)
    if not pending.exists():  # the common case on the ingest hot path: one indexed query
        return []
    for action_id in pending.filter(state="approved").values_list("pk", flat=True):
        dispatch_action(action_id=action_id, now=now)
    rows = (
        Action.objects.filter(node=node, state__in=("dispatched", "acknowledged"))
        .select_related("group")
        .order_by("dispatched_at", "pk")
    )
    return [agent_payload(a) for a in rows]


@transaction.atomic
def record_action_result(
    *, action_id: int, node: Node, status: str, exit_code: int | None, output: str, now: datetime
) -> Action:
    """Store the agent's outcome; a successful quarantine/cordon/isolation marks the inventory."""
    action = _locked_action(action_id)
    if action.node_id != node.pk:
        raise NotAllowed(f"action {action_id} is not for node {node.name}")
    if status not in ("succeeded", "failed"):
        raise RemediationError(f'status must be "succeeded" or "failed", got "{status}"')
    if action.state not in ("dispatched", "acknowledged"):
        raise Conflict(f"action {action_id} is {action.state}; a result is not expected")
    text = output if len(output) <= OUTPUT_LIMIT else output[: OUTPUT_LIMIT - 15] + "\n[truncated]"
    action.result = {"status": status, "exit_code": exit_code, "output": text}
    _move(
        action,
        status,
        actor=f"agent:{node.name}",
        now=now,
        reason=f"exit code {exit_code}",
        data={"exit_code": exit_code},
    )
    if status == "succeeded" and not action.dry_run:
        _apply_effect(action, now=now)
    return action


def _apply_effect(action: Action, *, now: datetime) -> None:
    field = {
        "quarantine_node": "quarantined",
        "cordon_node": "cordoned",
        "drain_node": "cordoned",
    }.get(action.kind)
    who = f"agent:{action.node.name}" if action.node else "system"
    if field and action.node is not None:
        Node.objects.filter(pk=action.node.pk).update(**{field: True})
        audit(
            actor=who,
            verb=f"node.{field}",
            obj=action.node,
            now=now,
            reason=f"action {action.pk}: {action.reason}",
        )
        name = action.node.name

        def publish() -> None:
            from console.queries import node_payloads

            for payload in node_payloads(names=[name]):
                live.publish(events.FLEET, "node.changed", payload)

        transaction.on_commit(publish)
    elif action.kind == "isolate_gpu" and action.gpu:
        Device.objects.filter(uuid=action.gpu).update(isolated=True)
        audit(
            actor=who,
            verb="gpu.isolated",
            object_type="device",
            object_id=action.gpu,
            now=now,
            reason=f"action {action.pk}: {action.reason}",
        )


# -- breaker --------------------------------------------------------------------------------


def set_breaker(*, open: bool, actor: Any, reason: str, now: datetime) -> BreakerState:
    """Open (any operator) or close (admin, with a reason) the automation circuit breaker.

    A refusal is audited and committed, then raised as `breakers.BreakerError`.
    """
    with transaction.atomic():
        row, refusal = _set_breaker(open, actor, reason, now)
    if refusal is not None:
        raise refusal
    return row


def _set_breaker(
    open: bool, actor: Any, reason: str, now: datetime
) -> tuple[BreakerState, breakers.BreakerError | None]:
    row = _locked_breaker()
    current = _breaker_input(row)
    who = actor_name(actor)
    change = breakers.open_breaker if open else breakers.close_breaker
    try:
        new = change(current, actor=who, role=role_of(actor), reason=reason, now=now)
    except breakers.BreakerError as exc:
        audit(actor=who, verb="breaker.refused", obj=row, reason=str(exc), now=now)
        return row, exc
    if new == current:
        return row, None
    row.open, row.reason, row.opened_at = new.open, new.reason, new.opened_at
    if open:
        row.opened_by = who
    else:
        row.closed_at, row.closed_by, row.closed_reason = now, who, new.close_reason
    row.save()
    verb = "breaker.opened" if open else "breaker.closed"
    audit(actor=who, verb=verb, obj=row, reason=reason.strip(), now=now)
    transaction.on_commit(lambda: live.publish(events.FLEET, "breaker.changed", breaker_payload()))
    return row, None


def waiting_for(user: Any) -> list[Action]:
    """Proposals this user could approve: not their own, not yet voted on by them."""
    if not has_role(user, UserRole.APPROVER):
        return []
    return list(
        Action.objects.filter(state="proposed")
        .exclude(proposed_by=user)
        .exclude(votes__user=user)
        .select_related("node", "group", "incident", "proposed_by")
        .annotate(approvals=Count("votes", filter=Q(votes__decision="approve")))
        .order_by("proposed_at")
    )


def audit_log(
    *,
    verb: str | None = None,
    actor: str | None = None,
    object_type: str | None = None,
    object_id: str | None = None,
) -> Any:
    """Audit rows newest first; `verb` ending in "." matches a family ("action.")."""
    qs = AuditLog.objects.order_by("-ts", "-id")
    if verb:
        qs = qs.filter(verb__startswith=verb) if verb.endswith(".") else qs.filter(verb=verb)
    if actor:
        qs = qs.filter(actor=actor)
    if object_type:
        qs = qs.filter(object_type=object_type)
    if object_id:
        qs = qs.filter(object_id=object_id)
    return qs
