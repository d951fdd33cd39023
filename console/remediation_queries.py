"""Reads for the remediation pages and REST: the approvals queue and the audit log.

Owns these two querysets with their joins baked in. It must not write; the write path
is console.actions.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import Count, Q, QuerySet

from console.choices import IncidentState
from console.models import Action, AuditLog, Incident
from console.policy.lifecycle import IN_FLIGHT_STATES, ActionState
from console.policy.roles import Permission
from console.roles import User, allowed


def proposed() -> QuerySet[Action]:
    """Every open proposal, oldest first (the approvals page shows at most 200)."""
    return (
        Action.objects.filter(state=ActionState.PROPOSED)
        .select_related("proposed_by", "node", "group")
        .order_by("proposed_at")
    )


def for_incident(incident_id: int) -> list[Action]:
    """The actions proposed for an incident (the policy's and people's), newest first."""
    return list(
        Action.objects.filter(incident_id=incident_id)
        .select_related("proposed_by", "node", "executor")
        .order_by("-proposed_at", "-id")[:50]
    )


def in_flight() -> list[Action]:
    """Dispatched actions the agent has not reported on, oldest first, with their deadline."""
    from console.actions.remediation import deadline_of  # pure arithmetic over one setting

    rows = list(
        Action.objects.filter(state__in=IN_FLIGHT_STATES)
        .select_related("node", "group")
        .order_by("dispatched_at")[:200]
    )
    for a in rows:
        a.deadline = deadline_of(a)  # shown by the template only
    return rows


def waiting_for(user: User) -> list[Action]:
    """Proposals this user could approve: not their own, not yet voted on by them."""
    if not allowed(user, Permission.APPROVE):
        return []
    return list(
        Action.objects.filter(state=ActionState.PROPOSED)
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
) -> QuerySet[AuditLog]:
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


# What `faultline demo` narrates: incidents opened and resolved, actions proposed and decided.
ACTION_VERBS = (
    "action.proposed",
    "action.approved",
    "action.rejected",
    "action.succeeded",
    "action.failed",
    "action.cancelled",
)


def demo_feed(*, since: datetime, skip: set[str]) -> list[dict[str, Any]]:
    """Incidents opened or resolved and action audit rows at or after `since`, oldest
    first, each keyed (`key`) so a caller can skip what it has seen."""
    out: list[dict[str, Any]] = []
    incidents = (
        Incident.objects.select_related("group")
        .exclude(role="symptom")
        .filter(Q(opened_at__gte=since) | Q(resolved_at__gte=since))
        .order_by("opened_at")[:200]
    )
    for i in incidents:
        base = {
            "object": i.pk,
            "kind": i.kind,
            "summary": i.summary,
            "group": i.group.name if i.group else None,
        }
        marks = [("incident.opened", i.opened_at)]
        if i.state == IncidentState.RESOLVED and i.resolved_at is not None:
            marks.append(("incident.resolved", i.resolved_at))
        for verb, at in marks:
            key = f"{verb}:{i.pk}:{at.isoformat()}"
            if at >= since and key not in skip:
                out.append({**base, "key": key, "verb": verb, "at": at, "actor": ""})
    rows = AuditLog.objects.filter(
        ts__gte=since, verb__in=ACTION_VERBS, object_type="action"
    ).order_by("ts", "id")[:500]
    fresh = [r for r in rows if f"audit:{r.pk}" not in skip and r.object_id.isdigit()]
    acts = Action.objects.in_bulk([int(r.object_id) for r in fresh])
    for r in fresh:
        a = acts.get(int(r.object_id))
        if a is not None:
            out.append(
                {
                    "key": f"audit:{r.pk}",
                    "verb": r.verb,
                    "at": r.ts,
                    "actor": r.actor,
                    "object": a.pk,
                    "kind": a.kind,
                    "target": a.target,
                    "state": a.state,
                    "approvals_required": a.approvals_required,
                }
            )
    return sorted(out, key=lambda item: item["at"])
