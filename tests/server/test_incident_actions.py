"""People changing incidents: acknowledge, assign, comment — versioned, never un-resolving."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from console import actions
from console.models import ConsistencyGroup, Incident

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)


@pytest.fixture
def incident() -> Incident:
    group = ConsistencyGroup.objects.create(name="job")
    return Incident.objects.create(
        group=group, fingerprint="fp", kind="xid", subject="gpu:GPU-1", severity="critical",
        summary="Xid 79", opened_at=NOW,
    )  # fmt: skip


def test_it_acknowledges_once_and_bumps_the_version(incident, cast):
    done = actions.acknowledge_incident(incident_id=incident.pk, actor=cast["operator"], now=NOW)
    assert (done.state, done.acknowledged_by, done.version) == ("acknowledged", cast["operator"], 2)
    again = actions.acknowledge_incident(incident_id=incident.pk, actor=cast["admin"], now=NOW)
    assert again.acknowledged_by == cast["operator"] and again.version == 2


def test_it_refuses_an_acknowledge_based_on_a_stale_version(incident, cast):
    incident.version = 5
    incident.save()
    with pytest.raises(actions.IncidentChangeError, match="reload"):
        actions.acknowledge_incident(
            incident_id=incident.pk, actor=cast["operator"], now=NOW, expected_version=4
        )


def test_it_never_unresolves_a_resolved_incident_on_acknowledge(incident, cast):
    incident.state, incident.resolved_at = "resolved", NOW
    incident.save()
    with pytest.raises(actions.IncidentChangeError, match="already resolved"):
        actions.acknowledge_incident(incident_id=incident.pk, actor=cast["operator"], now=NOW)
    incident.refresh_from_db()
    assert incident.state == "resolved"


def test_it_assigns_and_keeps_comments_in_order(incident, cast):
    actions.assign_incident(
        incident_id=incident.pk, assignee=cast["approver"].username, actor=cast["admin"], now=NOW
    )
    actions.comment_on_incident(
        incident_id=incident.pk, actor=cast["operator"], body=" first ", now=NOW
    )
    actions.comment_on_incident(
        incident_id=incident.pk, actor=cast["admin"], body="second", now=NOW
    )
    incident.refresh_from_db()
    assert incident.assignee == cast["approver"]
    assert [c.body for c in incident.comments.all()] == ["first", "second"]
    with pytest.raises(actions.IncidentChangeError, match="empty"):
        actions.comment_on_incident(
            incident_id=incident.pk, actor=cast["admin"], body="  ", now=NOW
        )


def test_it_audits_acknowledge_assign_and_comment_naming_the_actor(incident, cast):
    from console.models import AuditLog

    actions.acknowledge_incident(incident_id=incident.pk, actor=cast["operator"], now=NOW)
    actions.assign_incident(
        incident_id=incident.pk, assignee=cast["approver"].username, actor=cast["admin"], now=NOW
    )
    actions.assign_incident(incident_id=incident.pk, assignee="", actor=cast["operator"], now=NOW)
    actions.comment_on_incident(incident_id=incident.pk, actor=cast["approver"], body="hi", now=NOW)
    rows = AuditLog.objects.filter(object_type="incident", object_id=str(incident.pk))
    assert [(r.actor, r.verb) for r in rows.order_by("id")] == [
        ("operator", "incident.acknowledged"),
        ("admin", "incident.assigned"),
        ("operator", "incident.assigned"),
        ("approver", "incident.commented"),
    ]
    assigned = [r.data for r in rows.filter(verb="incident.assigned").order_by("id")]
    assert [(d["before"], d["after"]) for d in assigned] == [(None, "approver"), ("approver", None)]


def test_it_audits_a_node_health_change_with_its_actor_and_only_when_it_changes(db):
    from console.models import AuditLog, Node

    Node.objects.create(name="n-1", health="ok")
    assert actions.set_node_health(name="n-1", health="down", actor="system", now=NOW) is True
    assert actions.set_node_health(name="n-1", health="down", actor="system", now=NOW) is False
    rows = list(AuditLog.objects.filter(verb="node.health").values_list("actor", "data"))
    assert rows == [("system", {"before": "ok", "after": "down"})]
