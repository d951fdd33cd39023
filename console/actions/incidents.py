"""People's changes to incidents: acknowledge, assign, comment.

Owns the versioned, audited updates a person makes to an incident (an acknowledge that
raced an auto-resolve must not un-resolve it) and the `incident.changed` publish after
commit. Every verb is keyword-only, atomic, and writes an audit entry naming `actor`.
Each verb asks the permission table first (console.policy.roles, through `require`); it
must not fold findings (console.actions.diagnosis does).
"""

from __future__ import annotations

from datetime import datetime

from django.contrib.auth import get_user_model
from django.db import transaction

from console import events
from console.actions.audit import actor_name, audit, require
from console.actions.errors import IncidentChangeError
from console.choices import IncidentState
from console.models import Incident, IncidentComment
from console.policy.roles import Permission
from console.roles import Actor

COMMENT_LIMIT = 4000


def publish_incident(incident: Incident) -> None:
    """`incident.changed` to the fleet and to the incident's group, after commit."""
    payload = events.incident_payload(incident)
    if incident.group is not None:
        events.publish_on_commit(
            events.group_channel(incident.group.name), "incident.changed", payload
        )
    events.publish_on_commit(events.FLEET, "incident.changed", payload)


def resolve_held(incident: Incident, *, actor: str, reason: str, now: datetime) -> None:
    """Resolve an incident the caller holds locked, in its transaction: an incident no
    diagnosis pass owns (a node's, the fleet's, Alertmanager's). Versioned, audited,
    published after commit."""
    incident.state, incident.resolved_at = IncidentState.RESOLVED, now
    incident.version += 1
    incident.timeline = {**incident.timeline, "resolved": now.isoformat()}
    incident.save()
    audit(actor=actor, verb="incident.resolved", obj=incident, reason=reason, now=now)
    publish_incident(incident)


def _locked_incident(incident_id: int, expected_version: int | None) -> Incident:
    incident = (
        Incident.objects.select_for_update(of=("self",), no_key=True)
        .select_related("group")
        .get(pk=incident_id)
    )
    # Versioned updates: an acknowledge that raced an auto-resolve must not un-resolve it.
    if expected_version is not None and incident.version != expected_version:
        raise IncidentChangeError(
            f"incident #{incident_id} changed (version {incident.version}, you saw "
            f"{expected_version}): reload and try again"
        )
    return incident


@transaction.atomic
def acknowledge_incident(
    *, incident_id: int, actor: Actor, now: datetime, expected_version: int | None = None
) -> Incident:
    """Mark an open incident acknowledged by `actor` (stops escalation); idempotent."""
    require(actor, Permission.ACKNOWLEDGE)
    incident = _locked_incident(incident_id, expected_version)
    if incident.state == IncidentState.RESOLVED:
        raise IncidentChangeError(f"incident #{incident_id} is already resolved")
    if incident.state == IncidentState.ACKNOWLEDGED:
        return incident
    incident.state = IncidentState.ACKNOWLEDGED
    incident.acknowledged_by, incident.acknowledged_at = actor, now
    incident.version += 1
    incident.timeline = {**incident.timeline, "acknowledged": now.isoformat()}
    incident.save(
        update_fields=[
            "state",
            "acknowledged_by",
            "acknowledged_at",
            "version",
            "timeline",
            "updated_at",
        ]
    )
    audit(
        actor=actor_name(actor),
        verb="incident.acknowledged",
        obj=incident,
        now=now,
        data={"version": incident.version},
    )
    publish_incident(incident)
    return incident


@transaction.atomic
def assign_incident(
    *,
    incident_id: int,
    assignee: str,
    actor: Actor,
    now: datetime,
    expected_version: int | None = None,
) -> Incident:
    """Give the incident to the active user named `assignee` ("": unassign); audited with
    who did it. The name is looked up only after the permission check: a caller who may
    not assign must not learn which names exist."""
    require(actor, Permission.ASSIGN)
    user = None
    if assignee:
        user = get_user_model().objects.filter(username=assignee, is_active=True).first()
        if user is None:
            raise IncidentChangeError(f"no active user named {assignee!r}: pick one from the list")
    incident = _locked_incident(incident_id, expected_version)
    before = incident.assignee.get_username() if incident.assignee else None
    incident.assignee = user
    incident.version += 1
    incident.save(update_fields=["assignee", "version", "updated_at"])
    after = user.get_username() if user is not None else None
    audit(
        actor=actor_name(actor),
        verb="incident.assigned",
        obj=incident,
        now=now,
        data={"before": before, "after": after, "version": incident.version},
    )
    publish_incident(incident)
    return incident


@transaction.atomic
def comment_on_incident(
    *, incident_id: int, actor: Actor, body: str, now: datetime
) -> IncidentComment:
    """Append `actor`'s comment to the incident's timeline (audited, body included)."""
    require(actor, Permission.COMMENT)
    text = body.strip()
    if not text:
        raise IncidentChangeError("a comment cannot be empty")
    if len(text) > COMMENT_LIMIT:
        raise IncidentChangeError(
            f"a comment is at most {COMMENT_LIMIT} characters, got {len(text)}"
        )
    incident = _locked_incident(incident_id, None)
    comment = IncidentComment.objects.create(incident=incident, author=actor, body=text)
    audit(
        actor=actor_name(actor),
        verb="incident.commented",
        obj=incident,
        now=now,
        data={"comment": comment.pk, "body": text},
    )
    publish_incident(incident)
    return comment
