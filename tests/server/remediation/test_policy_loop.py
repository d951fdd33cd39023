"""The remediation policy wired to the write path; dispatched actions' deadline and abandon."""

from __future__ import annotations

from datetime import timedelta

import pytest

from console import actions
from console.models import (
    VERDICT_SETTLES_AFTER,
    Action,
    AuditLog,
    ConsistencyGroup,
    Incident,
    Node,
)

pytestmark = pytest.mark.django_db


def _xid_incident(now, *, recovery=None, fp="fp-xid", kind="xid", evidence=None, settled=True):
    """An open Xid incident; `settled`: opened long enough ago that its verdict settled."""
    group = ConsistencyGroup.objects.get(name="llama")
    ev = {"code": 79, "takes_gpu_out": True, "node": "n-01", "gpu": "GPU-0001"}
    return Incident.objects.create(
        group=group,
        fingerprint=fp,
        kind=kind,
        subject="gpu:GPU-0001",
        severity="critical",
        summary="Xid 79: GPU fell off the bus",
        opened_at=now - VERDICT_SETTLES_AFTER if settled else now,
        root_cause={"kind": kind, "evidence": evidence if evidence is not None else ev},
        recovery=recovery
        if recovery is not None
        else {"auto_restart_safe": True, "reason": "restart from c9", "checkpoint": "c9"},
    )


def test_it_proposes_drain_and_restart_for_a_hardware_fault(pool, now):
    ConsistencyGroup.objects.filter(name="llama").update(scheduler_job="4242")
    incident = _xid_incident(now)
    made = actions.remediate_group(group_name="llama", now=now)
    rows = {a.kind: a for a in Action.objects.filter(pk__in=made)}
    assert set(rows) == {"drain_node", "restart_group"}
    drain = rows["drain_node"]
    assert (drain.target, drain.params["node"], drain.state) == ("node:n-01", "n-01", "proposed")
    assert drain.proposed_by is None and drain.proposed_by_rule == "policy"
    assert drain.incident_id == incident.pk and drain.evidence["finding"] == "fp-xid"
    assert drain.trigger == "xid:79" and drain.preview
    assert rows["restart_group"].params["job"] == "4242"
    # A second sweep proposes nothing new: one open proposal per (kind, target).
    assert actions.remediate_group(group_name="llama", now=now) == []


def test_it_proposes_nothing_until_the_verdict_settles(pool, now):
    """A provisional root cause may still be revised (a peer's error folded under the
    death that arrives a moment later): nothing is proposed from it. One send interval
    after it opened the verdict settles and the same incident is remediated."""
    ConsistencyGroup.objects.filter(name="llama").update(scheduler_job="4242")
    incident = _xid_incident(now, settled=False)
    assert not incident.verdict_settled(now)
    assert actions.remediate_group(group_name="llama", now=now) == []
    almost = now + VERDICT_SETTLES_AFTER - timedelta(milliseconds=1)
    assert actions.remediate_group(group_name="llama", now=almost) == []
    assert not Action.objects.exists()
    later = now + VERDICT_SETTLES_AFTER
    assert incident.verdict_settled(later)
    made = actions.remediate_group(group_name="llama", now=later)
    assert {a.kind for a in Action.objects.filter(pk__in=made)} == {"drain_node", "restart_group"}


def test_it_auto_approves_only_what_the_gate_policy_lists(pool, now, settings):
    settings.FAULTLINE_REMEDIATION_POLICY = {"auto_approve": {"drain_node": ["xid:79"]}}
    _xid_incident(now)
    made = actions.remediate_group(group_name="llama", now=now)
    states = dict(Action.objects.filter(pk__in=made).values_list("kind", "state"))
    assert states == {"drain_node": "approved"}  # no job id known: no restart proposed


def test_it_pages_instead_of_restarting_after_a_mismatch(pool, now):
    incident = _xid_incident(
        now,
        kind="collective_mismatch",
        evidence={},
        recovery={"auto_restart_safe": False, "reason": "a retry hangs again"},
    )
    assert actions.remediate_group(group_name="llama", now=now) == []
    incident.refresh_from_db()
    assert "a retry hangs again" in incident.timeline["no_restart"]
    assert AuditLog.objects.filter(verb="policy.no_restart").count() == 1
    actions.remediate_group(group_name="llama", now=now)
    assert AuditLog.objects.filter(verb="policy.no_restart").count() == 1


def test_it_withdraws_the_proposal_when_the_incident_resolves(pool, now):
    incident = _xid_incident(now)
    (made,) = actions.remediate_group(group_name="llama", now=now)
    Incident.objects.filter(pk=incident.pk).update(state="resolved", resolved_at=now)
    actions.remediate_group(group_name="llama", now=now)
    action = Action.objects.get(pk=made)
    assert action.state == "cancelled"
    entry = AuditLog.objects.get(verb="action.cancelled", object_id=str(made))
    assert entry.actor == "policy" and "resolved" in entry.reason


def test_it_keeps_a_person_s_proposal_when_the_incident_resolves(pool, propose, now):
    incident = _xid_incident(now)
    mine = propose("node:n-05", incident_id=incident.pk, evidence={"finding": "fp-xid"}).action
    Incident.objects.filter(pk=incident.pk).update(state="resolved", resolved_at=now)
    actions.remediate_group(group_name="llama", now=now)
    assert Action.objects.get(pk=mine.pk).state == "proposed"


def _dispatched(propose, vote, pool, now):
    action = propose("node:n-04").action
    vote(action.pk, "approver")
    actions.dispatch_for_node(node=pool[4], now=now)
    action.refresh_from_db()
    assert action.state == "dispatched"
    return action


def test_it_fails_a_dispatched_action_after_its_deadline(pool, propose, vote, now, settings):
    settings.FAULTLINE_ACTION_DEADLINE_S = 60
    action = _dispatched(propose, vote, pool, now)
    assert actions.deadline_of(action) == action.dispatched_at + timedelta(seconds=60)
    assert actions.expire_actions(now=now + timedelta(seconds=59)) == []
    assert actions.expire_actions(now=now + timedelta(seconds=61)) == [action.pk]
    action.refresh_from_db()
    assert action.state == "failed" and "within 60 s" in action.result["output"]
    assert AuditLog.objects.filter(verb="action.deadline_passed").count() == 1
    assert actions.dispatch_for_node(node=pool[4], now=now) == []


def test_it_lets_only_an_admin_abandon_a_dispatched_action(pool, propose, vote, cast, now):
    action = _dispatched(propose, vote, pool, now)
    with pytest.raises(actions.NotAllowed):
        actions.abandon_action(action_id=action.pk, actor=cast["approver"], reason="gone", now=now)
    actions.abandon_action(
        action_id=action.pk, actor=cast["admin"], reason="node was reimaged", now=now
    )
    action.refresh_from_db()
    assert action.state == "failed" and action.result["abandoned"] is True
    entry = AuditLog.objects.get(verb="action.abandoned", object_id=str(action.pk))
    assert entry.actor == "admin" and "reimaged" in entry.reason
    with pytest.raises(actions.Conflict):
        actions.abandon_action(action_id=action.pk, actor=cast["admin"], reason="again", now=now)


def test_it_does_not_drain_or_restart_again_in_the_next_generation(pool, now):
    ConsistencyGroup.objects.filter(name="llama").update(scheduler_job="4242")
    _xid_incident(now)
    first = actions.remediate_group(group_name="llama", now=now)
    assert len(first) == 2
    Action.objects.filter(pk__in=first).update(state="succeeded")
    Node.objects.filter(name="n-01").update(cordoned=True)
    # The group restarted; the Xid is still in the window and re-opens under gen 4.
    _xid_incident(now, fp="fp-xid-gen4")
    assert actions.remediate_group(group_name="llama", now=now) == []
