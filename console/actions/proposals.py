"""The remediation policy's proposals and withdrawals, through the one write path.

Owns turning an open incident into the policy's plain `Cause` (console.policy.remediation),
proposing what the policy plans through `propose_action` (no user: the rule "policy"),
recording once per incident why nothing restarts (the page's reason), and withdrawing the
policy's proposals whose incident resolved before a decision. Group incidents come here
after each diagnosis (console.pipeline); fleet-scope node incidents call `remediate` with
their own causes. It decides nothing itself: the policy plans, the gates approve.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import transaction

from console.actions.audit import audit
from console.actions.errors import NotAllowed, RemediationError
from console.actions.remediation import propose_action, withdraw_action
from console.choices import ACTION_LIVE_STATES, IncidentState
from console.models import Action, Incident, Node
from console.policy import remediation as rp
from console.policy.lifecycle import ActionKind, ActionState

log = logging.getLogger(__name__)

POLICY_ACTOR = "policy"


def remediation_policy() -> rp.RemediationPolicy:
    """Per-pool settings; read per call from FAULTLINE_REMEDIATION_POOLS (docs/safety.md)."""
    return rp.RemediationPolicy.from_dict(getattr(settings, "FAULTLINE_REMEDIATION_POOLS", None))


def _name_of(subject: str, prefix: str) -> str | None:
    head, sep, name = subject.partition(":")
    return name if sep and head == prefix and name else None


def cause_of_incident(incident: Incident) -> rp.Cause:
    """The plain input the policy reads, from a stored incident (group or node scope)."""
    head: dict[str, Any] = incident.root_cause or {}
    evidence = head.get("evidence") or {}
    subject = incident.subject or str(head.get("subject") or "")
    node = str(evidence.get("node") or "") or _name_of(subject, "node")
    gpu = str(evidence.get("gpu") or "") or _name_of(subject, "gpu")
    pool, node_out = "", False
    if node:
        row = Node.objects.filter(name=node).values_list("pool", "cordoned", "quarantined")
        found = row.first()
        if found is not None:
            pool, node_out = found[0] or "", bool(found[1] or found[2])
    group = incident.group
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
    return rp.Cause(
        kind=incident.kind,
        subject=subject,
        finding=incident.fingerprint,
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
    )


def _taken_keys(finding: str) -> set[tuple[str, str]]:
    """(kind, target) already in play: any live action, or any this finding ever led to
    (a human's rejection or a done drain is not proposed again for the same finding)."""
    live = Action.objects.filter(state__in=[ActionState.PROPOSED, *ACTION_LIVE_STATES])
    keys = set(live.values_list("kind", "target"))
    keys |= set(Action.objects.filter(evidence__finding=finding).values_list("kind", "target"))
    return keys


def remediate(*, causes: Sequence[rp.Cause], now: datetime) -> list[int]:
    """Propose what the policy plans for each cause; returns the new actions' ids."""
    policy = remediation_policy()
    made: list[int] = []
    for cause in causes:
        plan = rp.plan(cause, policy, _taken_keys(cause.finding))
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
        for page in plan.pages:
            _record_no_restart(page, now=now)
    return made


@transaction.atomic
def _record_no_restart(page: rp.Page, *, now: datetime) -> None:
    """Why automation will not restart: once per incident, on its timeline and audited.

    The incident itself pages through its escalation policy (console.actions.notifications).
    """
    if page.incident is None:
        return
    incident = Incident.objects.select_for_update().filter(pk=page.incident).first()
    if incident is None or incident.timeline.get("no_restart"):
        return
    incident.timeline = {**incident.timeline, "no_restart": page.reason}
    incident.save(update_fields=["timeline", "updated_at"])
    audit(actor=POLICY_ACTOR, verb="policy.no_restart", obj=incident, reason=page.reason, now=now)


def withdraw_resolved(
    *, proposals: Iterable[Action], live: Iterable[str], now: datetime
) -> list[int]:
    """Withdraw the policy's proposals whose finding is no longer live."""
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
                reason="its finding resolved before a decision",
                now=now,
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
    return remediate(causes=[cause_of_incident(i) for i in settled], now=now)
