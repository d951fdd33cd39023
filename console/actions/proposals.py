"""The remediation policy's proposals and withdrawals, through the one write path.

Owns turning an open incident into the policy's plain `Cause` (console.policy.remediation),
proposing what the policy plans through `propose_action` (no user: the rule "policy"),
recording once per incident why nothing restarts (the page's reason) and why a proposal
waits (no agent can run it yet, a silence the fleet's), and withdrawing the policy's
proposals whose incident resolved before a decision. Group incidents come here after each
diagnosis (console.pipeline); fleet-scope node incidents (a hardware fault latched on a
node, a condition, a silent node) from the node sweep (`remediate_nodes`), whether or not
a group runs there. It decides nothing itself: the policy plans, the gates approve.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import Q

from console.actions.audit import audit
from console.actions.conditions import others_with
from console.actions.errors import NotAllowed, RemediationError
from console.actions.fleet import FLEET_SILENT
from console.actions.gating import locked_breaker
from console.actions.incidents import publish_incident
from console.actions.remediation import propose_action, withdraw_action
from console.actions.targets import controller_reporting, remediation_policy
from console.choices import ACTION_LIVE_STATES, GroupKind, Health, IncidentState
from console.models import Action, Incident, Node
from console.policy import fleet_health as fh
from console.policy import remediation as rp
from console.policy.lifecycle import ActionKind, ActionState
from console.queries.placement import placement_of

log = logging.getLogger(__name__)

POLICY_ACTOR = "policy"


def _name_of(subject: str, prefix: str) -> str | None:
    head, sep, name = subject.partition(":")
    return name if sep and head == prefix and name else None


def finding_of(incident: Incident) -> str:
    """The key a proposal is withdrawn by, and never proposed twice for: a group incident's
    fingerprint; a node incident's fingerprint and id (a node's fingerprint comes back with
    its next fault, which must not find the last episode's drain and propose nothing)."""
    if incident.group_id is None and incident.node_id is not None:
        return f"{incident.fingerprint}@{incident.pk}"
    return incident.fingerprint


def cause_of_incident(
    incident: Incident, *, now: datetime | None = None, hold: str = ""
) -> rp.Cause:
    """The plain input the policy reads, from a stored incident (group or node scope).

    `now` places a node incident's fault (idle, hosting ranks, launcher-only, serving);
    `hold` is why a silent node is not taken out now (silence_hold)."""
    head: dict[str, Any] = incident.root_cause or {}
    evidence = head.get("evidence") or {}
    subject = incident.subject or str(head.get("subject") or "")
    own = incident.node if incident.group_id is None else None
    node = (
        (own.name if own is not None else "")
        or str(evidence.get("node") or "")
        or _name_of(subject, "node")
    )
    gpu = str(evidence.get("gpu") or "") or _name_of(subject, "gpu")
    row = own if own is not None else (Node.objects.filter(name=node).first() if node else None)
    pool, node_out, reporting = "", False, True
    if row is not None:
        pool, node_out = row.pool or "", bool(row.cordoned or row.quarantined)
        reporting = row.health != Health.DOWN
    group = incident.group
    if group is not None:
        placement = rp.SERVING if group.kind == GroupKind.SERVING else rp.RANKS
    else:
        placement = placement_of(row, now=now) if row is not None and now is not None else ""
    restarted = bool(
        group
        and Action.objects.filter(
            kind=ActionKind.RESTART_GROUP,
            group=group,
            evidence__excluded=node or gpu or subject,
        )
        .exclude(
            state__in=[
                ActionState.REJECTED,
                ActionState.FAILED,
                ActionState.EXPIRED,
                ActionState.CANCELLED,
            ]
        )
        .exists()
    )
    controller_up = not reporting and controller_reporting(remediation_policy().for_pool(pool))
    return rp.Cause(
        kind=incident.kind,
        subject=subject,
        finding=finding_of(incident),
        summary=incident.summary,
        evidence=evidence,
        recovery=incident.recovery or None,
        pool=pool,
        node=node or None,
        gpu=gpu or None,
        group=group.name if group else None,
        job=(group.scheduler_job or None) if group else None,
        incident=incident.pk,
        node_out=node_out,
        restarted=restarted,
        placement=placement,
        reporting=reporting,
        controller_reporting=controller_up,
        hold=hold,
    )


# What the other incident of one fault (a node's and a group's) decided that stands for
# this one: a person's rejection, a take-out done. Not one that expired, failed or was
# cancelled (a group's drain refused as stale once the group moved on must not keep the
# node's own incident from taking the broken node out).
_DECIDED = (ActionState.REJECTED, ActionState.SUCCEEDED)


def _taken_keys(finding: str, incident: int | None) -> set[tuple[str, str]]:
    """(kind, target) already in play: any live action, or any this finding ever led to
    (a human's rejection or a done drain is not proposed again for the same finding), or
    one decided for the same fault on the other side of it: a group incident's node
    incident (its root incident), or a node incident's group incidents."""
    live = Action.objects.filter(state__in=[ActionState.PROPOSED, *ACTION_LIVE_STATES])
    keys = set(live.values_list("kind", "target"))
    same = Q(evidence__finding=finding)
    if incident is not None:
        root = Incident.objects.filter(pk=incident).values_list("root_incident", flat=True).first()
        other = Q(incident__root_incident=incident)
        if root is not None:
            other |= Q(incident=root)
        same |= other & Q(state__in=_DECIDED)
    keys |= set(Action.objects.filter(same).values_list("kind", "target"))
    return keys


def remediate(
    *, causes: Sequence[rp.Cause], now: datetime, waiting: Iterable[int] = ()
) -> list[int]:
    """Propose what the policy plans for each cause; returns the new actions' ids.

    A plan with proposals is made again under the remediation lock (the breaker row) and
    proposed there, so a node incident and a group incident for one fault, planned at
    once by the sweep and a diagnosis, propose its take-out once; a plan with nothing to
    propose (the common case of a diagnosis pass) takes no lock. Why a proposal waits is
    written on its incident when it changes (`waiting`: the incidents that say so now)."""
    policy = remediation_policy()
    waits_now = set(waiting)
    made: list[int] = []
    for cause in causes:
        plan = rp.plan(cause, policy, _taken_keys(cause.finding, cause.incident))
        if plan.proposals:
            with transaction.atomic():
                locked_breaker()
                plan = rp.plan(cause, policy, _taken_keys(cause.finding, cause.incident))
                made += _propose(plan, now)
        for page in plan.pages:
            _record_no_restart(page, now=now)
        if cause.incident is not None and (plan.waits or cause.incident in waits_now):
            _record_waits(cause.incident, plan.waits, now=now)
    return made


def _propose(plan: rp.Plan, now: datetime) -> list[int]:
    made = []
    for p in plan.proposals:
        try:
            outcome = propose_action(
                kind=p.kind,
                target=p.target,
                reason=p.reason,
                actor=None,
                rule=p.rule,
                trigger=p.trigger,
                incident_id=p.incident,
                evidence={**p.evidence, "finding": p.finding},
                params=dict(p.params),
                now=now,
            )
        except RemediationError as exc:
            log.info("policy: %s on %s not proposed: %s", p.kind, p.target, exc)
            continue
        made.append(outcome.action.pk)
    return made


WAITS = "remediation_waits"


def _record_waits(incident_id: int, waits: Sequence[str], *, now: datetime) -> None:
    """Why the incident's remediation waits (on its timeline, shown on its page), or
    nothing once it no longer does. Written only when it changes."""
    current = Incident.objects.filter(pk=incident_id).values_list("timeline", flat=True).first()
    if current is None or list((current or {}).get(WAITS) or []) == list(waits):
        return
    _write_waits(incident_id, waits, now=now)


@transaction.atomic
def _write_waits(incident_id: int, waits: Sequence[str], *, now: datetime) -> None:
    incident = Incident.objects.select_for_update(no_key=True).filter(pk=incident_id).first()
    if incident is None or list(incident.timeline.get(WAITS) or []) == list(waits):
        return
    timeline = {k: v for k, v in incident.timeline.items() if k != WAITS}
    incident.timeline = {**timeline, WAITS: list(waits)} if waits else timeline
    incident.save(update_fields=["timeline", "updated_at"])
    if waits:
        audit(
            actor=POLICY_ACTOR, verb="policy.waits", obj=incident, reason="; ".join(waits), now=now
        )
    publish_incident(incident)


@transaction.atomic
def _record_no_restart(page: rp.Page, *, now: datetime) -> None:
    """Why automation will not restart: once per incident, on its timeline and audited.

    The incident itself pages through its escalation policy (console.actions.notifications).
    """
    if page.incident is None:
        return
    incident = Incident.objects.select_for_update(no_key=True).filter(pk=page.incident).first()
    if incident is None or incident.timeline.get("no_restart"):
        return
    incident.timeline = {**incident.timeline, "no_restart": page.reason}
    incident.save(update_fields=["timeline", "updated_at"])
    audit(actor=POLICY_ACTOR, verb="policy.no_restart", obj=incident, reason=page.reason, now=now)


def withdraw_resolved(
    *, proposals: Iterable[Action], live: Iterable[str], now: datetime, approved_too: bool = False
) -> list[int]:
    """Withdraw the policy's proposals whose finding is no longer live (`approved_too`:
    approved ones not yet dispatched as well)."""
    rows = list(proposals)
    open_ = [
        rp.OpenProposal(
            id=a.pk,
            kind=a.kind,
            target=a.target,
            finding=str(a.evidence.get("finding") or ""),
            rule=a.proposed_by_rule,
        )
        for a in rows
    ]
    done = []
    for action_id in rp.withdrawals(open_, live):
        try:
            withdraw_action(
                action_id=action_id,
                actor=POLICY_ACTOR,
                reason="its finding resolved before "
                + ("it ran" if approved_too else "a decision"),
                now=now,
                approved_too=approved_too,
            )
        except (RemediationError, NotAllowed) as exc:  # decided meanwhile
            log.info("policy: action %s not withdrawn: %s", action_id, exc)
            continue
        done.append(action_id)
    return done


def remediate_group(*, group_name: str, now: datetime) -> list[int]:
    """After a group's diagnosis: propose for its open incidents whose verdict has settled
    (Incident.verdict_settled: a provisional root cause may still be revised, and a drain
    of the wrong node is the costly mistake), withdraw for resolved ones."""
    incidents = list(
        Incident.objects.select_related("group")
        .filter(group__name=group_name)
        .exclude(state=IncidentState.RESOLVED)
        .filter(role="root_cause")
    )
    pending = Action.objects.filter(
        incident__group__name=group_name, state=ActionState.PROPOSED, proposed_by__isnull=True
    ).exclude(proposed_by_rule="")
    live = {i.fingerprint for i in incidents}
    withdraw_resolved(proposals=pending, live=live, now=now)
    settled = [i for i in incidents if i.verdict_settled(now)]
    waiting = [i.pk for i in settled if i.timeline.get(WAITS)]
    return remediate(causes=[cause_of_incident(i) for i in settled], now=now, waiting=waiting)


PLANNED = "remediation_planned"  # the incident version the policy last planned


def remediate_nodes(*, now: datetime) -> list[int]:
    """Fleet-scope node incidents (a latched hardware fault, a NIC down, a full disk, a
    silent node) to the remediation policy, whether or not a group runs there: each once
    per version of the incident, and again each sweep while its remediation waits (for a
    controller agent, for a silence to last, for a fleet silence to end). The policy's
    proposals whose node incident resolved before a decision are withdrawn. The node
    sweep calls it every second: with no node incident open, two queries."""
    incidents = list(
        Incident.objects.select_related("node")
        .filter(group=None, node__isnull=False, kind__in=rp.NODE_SCOPE_KINDS, role="root_cause")
        .exclude(state=IncidentState.RESOLVED)
        .order_by("opened_at", "pk")
    )
    # Approved ones too: a node back from silence, or a condition that cleared, must not be
    # taken out by an approval given while it lasted.
    pending = Action.objects.filter(
        state__in=(ActionState.PROPOSED, ActionState.APPROVED),
        proposed_by__isnull=True,
        incident__group__isnull=True,
        incident__node__isnull=False,
    ).exclude(proposed_by_rule="")
    withdraw_resolved(
        proposals=pending, live={finding_of(i) for i in incidents}, now=now, approved_too=True
    )
    due = [i for i in incidents if i.timeline.get(PLANNED) != i.version or i.timeline.get(WAITS)]
    if not due:
        return []
    hold = _holds(now) if any(i.kind not in rp.HARDWARE_KINDS for i in due) else None
    made: list[int] = []
    for incident in due:
        why = hold(incident) if hold is not None else ""
        waiting = [incident.pk] if incident.timeline.get(WAITS) else []
        if why and incident.node is not None:
            # Held (a silence the fleet's, a condition too young): all the plan would say,
            # without reading where the node sits; a trickle of hundreds of silent nodes
            # costs each sweep one write per change, not a plan each.
            _record_waits(incident.pk, [rp.held(incident.node.name, why)], now=now)
        else:
            cause = cause_of_incident(incident, now=now, hold=why)
            made += remediate(causes=[cause], now=now, waiting=waiting)
        if incident.timeline.get(PLANNED) != incident.version:
            _mark_planned(incident.pk, incident.version)
    return made


def _holds(now: datetime) -> Callable[[Incident], str]:
    """Why a silent node or a condition waits (fleet_health.silence_hold, condition_hold),
    with the fleet read once a sweep."""
    fleet_open = (
        Incident.objects.filter(kind=FLEET_SILENT, group=None, node=None)
        .exclude(state=IncidentState.RESOLVED)
        .exists()
    )
    silent = Node.objects.filter(health=Health.DOWN).count()
    total = Node.objects.count()

    def hold(incident: Incident) -> str:
        if incident.kind in rp.SILENCE_KINDS:
            return fh.silence_hold(
                incident.opened_at, now, fleet_silence=fleet_open, silent=silent, reporting=total
            )
        if incident.kind in rp.CONDITION_KINDS:
            return fh.condition_hold(
                incident.kind,
                incident.opened_at,
                now,
                others=others_with(incident),
                reporting=total,
            )
        return ""

    return hold


@transaction.atomic
def _mark_planned(incident_id: int, version: int) -> None:
    incident = Incident.objects.select_for_update(no_key=True).filter(pk=incident_id).first()
    if incident is None or incident.timeline.get(PLANNED) == version:
        return
    incident.timeline = {**incident.timeline, PLANNED: version}
    incident.save(update_fields=["timeline", "updated_at"])
