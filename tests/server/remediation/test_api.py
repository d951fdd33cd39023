"""The REST flow: propose, vote, refusals as JSON that name the problem."""

from __future__ import annotations

from datetime import timedelta

import pytest

pytestmark = pytest.mark.django_db


def _post(client, url, body):
    return client.post(url, body, content_type="application/json")


def test_it_proposes_and_approves_through_the_api(client, cast, pool):
    client.force_login(cast["operator"])
    proposed = _post(
        client,
        "/api/v1/actions/",
        {"kind": "cordon_node", "target": "node:n-03", "reason": "xid 79"},
    )
    assert proposed.status_code == 201
    action = proposed.json()["action"]
    assert (action["state"], action["proposed_by"], action["node"]) == (
        "proposed",
        "operator",
        "n-03",
    )
    client.force_login(cast["approver"])
    approved = _post(client, f"/api/v1/actions/{action['id']}/approve/", {"reason": "confirmed"})
    assert approved.json()["action"]["state"] == "approved"
    listed = client.get("/api/v1/actions/?state=approved").json()["results"]
    assert [a["id"] for a in listed] == [action["id"]]


def test_it_answers_a_self_approval_with_a_json_error(client, cast, pool):
    client.force_login(cast["approver"])
    action = _post(
        client,
        "/api/v1/actions/",
        {"kind": "cordon_node", "target": "node:n-03", "reason": "xid 79"},
    ).json()
    response = _post(client, f"/api/v1/actions/{action['action']['id']}/approve/", {})
    assert response.status_code == 403
    assert response.json()["error"].endswith("may not approve it")


def test_it_names_an_unknown_target_in_the_error(client, cast, pool):
    client.force_login(cast["operator"])
    response = _post(
        client, "/api/v1/actions/", {"kind": "cordon_node", "target": "node:ghost", "reason": "xid"}
    )
    assert response.status_code == 400
    assert response.json() == {
        "error": 'target "node:ghost": node ghost is not in the fleet inventory'
    }


def test_it_refuses_a_silence_longer_than_72_hours(client, cast, now):
    client.force_login(cast["operator"])
    response = _post(
        client,
        "/api/v1/silences/",
        {
            "matchers": {"group": "llama"},
            "reason": "long maintenance",
            "ends_at": (now + timedelta(hours=100)).isoformat(),
        },
    )
    assert response.status_code == 400
    assert "at most 72 h" in response.json()["error"]


def test_it_rejects_an_unknown_state_filter(client, cast):
    client.force_login(cast["viewer"])
    response = client.get("/api/v1/actions/?state=done")
    assert response.status_code == 400
    assert "must be one of" in response.json()["state"]


def test_it_lists_actions_in_a_fixed_number_of_queries(
    client, cast, pool, propose, django_assert_max_num_queries
):
    for i in range(6):
        propose(f"node:n-{i:02d}")
    client.force_login(cast["viewer"])
    with django_assert_max_num_queries(8):
        response = client.get("/api/v1/actions/")
    assert response.json()["count"] == 6


def test_it_refuses_an_escalation_policy_that_repeats_too_fast(client, cast):
    client.force_login(cast["admin"])
    steps = [{"delay_s": 0, "channels": ["hook"], "repeat": 3, "repeat_interval_s": 5}]
    response = _post(client, "/api/v1/escalation-policies/", {"name": "fast", "steps": steps})
    assert response.status_code == 400
    assert "repeat_interval_s must be at least 60" in response.json()["error"]


def test_it_refuses_nul_in_a_json_body_and_stores_nothing(client, cast, pool):
    """Found by the schema fuzz: NUL in a jsonb field was a 500 (Postgres cannot store it)."""
    from console.models import Action, EscalationPolicy

    client.force_login(cast["admin"])
    proposal = {"kind": "cordon_node", "target": "node:n-03", "reason": "xid 79"}
    steps = [{"delay_s": 0, "channels": ["ops\u0000"]}]
    for url, body in [
        ("/api/v1/actions/", {**proposal, "params": {"drain": "now\u0000"}}),
        ("/api/v1/actions/", {**proposal, "params": {"k\u0000": 1}}),
        ("/api/v1/escalation-policies/", {"name": "p", "steps": steps}),
    ]:
        response = _post(client, url, body)
        assert response.status_code == 400, url
        assert "NUL" in response.json()["detail"]
    assert (Action.objects.count(), EscalationPolicy.objects.count()) == (0, 0)


def test_it_refuses_nul_in_an_audit_filter(client, cast):
    client.force_login(cast["viewer"])
    response = client.get("/api/v1/audit/?actor=admin%00")
    assert response.status_code == 400
    assert "NUL" in response.json()["error"]
