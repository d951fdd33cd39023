"""The circuit breaker: only an admin closes it, with a reason; the API cannot bypass it."""

from __future__ import annotations

import pytest

from console import actions
from console.models import AuditLog, BreakerState

pytestmark = pytest.mark.django_db


def test_it_refuses_to_close_the_breaker_for_an_approver_through_the_api(client, cast, now):
    actions.set_breaker(open=True, actor=cast["operator"], reason="xid storm", now=now)
    client.force_login(cast["approver"])
    response = client.post(
        "/api/v1/breaker/", {"open": False, "reason": "looks fine"}, content_type="application/json"
    )
    assert response.status_code == 403
    assert response.json()["error"] == (
        "approver is an approver; the admin role is needed for closing the circuit breaker"
    )
    assert BreakerState.objects.get(pk=1).open is True
    assert AuditLog.objects.filter(verb="breaker.refused", actor="approver").exists()


def test_it_refuses_to_close_the_breaker_without_a_reason(client, cast, now):
    actions.set_breaker(open=True, actor=cast["operator"], reason="xid storm", now=now)
    client.force_login(cast["admin"])
    response = client.post(
        "/api/v1/breaker/", {"open": False, "reason": " "}, content_type="application/json"
    )
    assert response.status_code == 400
    assert BreakerState.objects.get(pk=1).open is True


def test_it_holds_automatic_proposals_while_the_breaker_is_open(pool, cast, now, settings):
    settings.FAULTLINE_REMEDIATION_POLICY = {"auto_approve": {"cordon_node": ["xid"]}}
    auto = actions.propose_action(
        kind="cordon_node",
        target="node:n-01",
        reason="xid 79",
        actor=None,
        rule="xid-cordon",
        trigger="xid:79",
        now=now,
    )
    assert auto.action.state == "approved"
    actions.set_breaker(open=True, actor=cast["operator"], reason="storm", now=now)
    held = actions.propose_action(
        kind="cordon_node",
        target="node:n-02",
        reason="xid 79",
        actor=None,
        rule="xid-cordon",
        trigger="xid:79",
        now=now,
    )
    assert held.action.state == "proposed"
    assert any(r.startswith("circuit breaker open") for r in held.reasons)


def test_it_closes_the_breaker_for_an_admin_and_keeps_the_reason(client, cast, now):
    actions.set_breaker(open=True, actor=cast["operator"], reason="xid storm", now=now)
    client.force_login(cast["admin"])
    response = client.post(
        "/api/v1/breaker/",
        {"open": False, "reason": "bad NIC replaced"},
        content_type="application/json",
    )
    assert response.status_code == 200
    assert (response.json()["open"], response.json()["closed_by"]) == (False, "admin")
    assert response.json()["closed_reason"] == "bad NIC replaced"
