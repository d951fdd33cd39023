"""Votes: nobody approves their own action, one vote each, no replays, no late votes."""

from __future__ import annotations

from datetime import timedelta

import pytest

from console.models import Action, AuditLog, Incident, Vote
from console.policy.votes import VoteRefused

pytestmark = pytest.mark.django_db


def test_it_refuses_self_approval_and_audits_the_refusal(pool, propose, vote):
    action = propose("node:n-01", by="approver").action
    with pytest.raises(VoteRefused, match=r"proposed action \d+ and may not approve it"):
        vote(action.pk, "approver")
    action.refresh_from_db()
    assert action.state == "proposed"
    assert AuditLog.objects.filter(verb="vote.refused", actor="approver").count() == 1


def test_it_refuses_a_second_vote_by_the_same_approver(pool, propose, vote, cast):
    action = propose("node:n-03").action
    Action.objects.filter(pk=action.pk).update(approvals_required=2)
    vote(action.pk, "approver")
    with pytest.raises(VoteRefused, match="already voted"):
        vote(action.pk, "approver")
    assert Vote.objects.filter(action=action).count() == 1


def test_it_ignores_a_replayed_approval_once_voting_closed(pool, propose, vote):
    action = propose("node:n-01").action
    assert vote(action.pk, "approver").action.state == "approved"
    with pytest.raises(VoteRefused, match="not proposed; voting is closed"):
        vote(action.pk, "approver2")
    assert Vote.objects.filter(action=action).count() == 1


def test_it_refuses_an_approval_after_expiry_and_expires_the_action(pool, propose, vote, now):
    action = propose("node:n-01").action
    with pytest.raises(VoteRefused, match="expired at"):
        vote(action.pk, "approver", at=now + timedelta(hours=2))
    action.refresh_from_db()
    assert action.state == "expired"


def test_it_lets_any_reject_win(pool, propose, vote):
    action = propose("node:n-01").action
    Action.objects.filter(pk=action.pk).update(approvals_required=2)
    vote(action.pk, "approver")
    outcome = vote(action.pk, "approver2", approve=False)
    assert outcome.action.state == "rejected"
    assert "rejected by approver2" in outcome.reasons


def test_it_refuses_a_vote_from_an_operator(pool, propose, vote):
    action = propose("node:n-01", by="admin").action
    with pytest.raises(VoteRefused, match="needs the approver role"):
        vote(action.pk, "operator")


def test_it_returns_why_an_unsafe_restart_needs_a_human(pool, propose, vote, now):
    incident = Incident.objects.create(
        group_id=pool[0].rank_set.first().group_id,
        fingerprint="fp",
        kind="collective_mismatch",
        subject="group:llama",
        severity="critical",
        summary="mismatch",
        opened_at=now,
        recovery={"auto_restart_safe": False, "reason": "a retry hangs again"},
    )
    outcome = propose(
        "group:llama", kind="restart_group", incident_id=incident.pk, params={"job": "77"}
    )
    assert outcome.action.approvals_required == 1
    assert any("auto-restart is unsafe: a retry hangs again" in r for r in outcome.reasons)
    approved = vote(outcome.action.pk, "approver")
    assert approved.action.state == "approved"
    assert any("restart needs a human" in r for r in approved.reasons)


def test_it_enforces_one_vote_per_user_in_the_database(pool, propose, cast, now):
    from django.db import IntegrityError, transaction

    action = propose("node:n-01").action
    Vote.objects.create(action=action, user=cast["approver"], decision="approve", cast_at=now)
    with pytest.raises(IntegrityError), transaction.atomic():
        Vote.objects.create(action=action, user=cast["approver"], decision="reject", cast_at=now)
