"""Reads for the remediation pages and REST: the approvals queue and the audit log.

Owns these two querysets with their joins baked in. It must not write; the write path
is console.actions.
"""

from __future__ import annotations

from django.db.models import Count, Q, QuerySet

from console.choices import UserRole
from console.models import Action, AuditLog
from console.policy.lifecycle import IN_FLIGHT_STATES, ActionState
from console.roles import User, has_role


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
    if not has_role(user, UserRole.APPROVER):
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
