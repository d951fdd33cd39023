"""Dispatch re-checks every gate; agents fetch only their node's actions and report results."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from console import actions
from console.actions.gating import fleet_state
from console.actions.remediation import OUTPUT_LIMIT
from console.models import Action, AuditLog, ConsistencyGroup, Node

pytestmark = pytest.mark.django_db


def _approved(propose, vote, target, kind="cordon_node", **kw):
    action = propose(target, kind=kind, **kw).action
    return vote(action.pk, "approver").action


def test_it_refuses_to_dispatch_after_the_group_generation_changed(pool, propose, vote, now):
    action = _approved(propose, vote, "rank:llama/1", kind="isolate_rank")
    assert (action.generation, action.node.name) == (3, "n-01")
    ConsistencyGroup.objects.filter(name="llama").update(generation=4)
    outcome = actions.dispatch_action(action_id=action.pk, now=now)
    assert outcome.action.state == "cancelled"
    assert any("stale: group llama is at generation 4" in r for r in outcome.reasons)


def test_it_dispatches_an_approved_action_with_the_agent_shape(pool, propose, vote, now):
    action = _approved(propose, vote, "node:n-04")
    payloads = actions.dispatch_for_node(node=pool[4], now=now)
    assert payloads == [
        {
            "id": action.pk,
            "kind": "cordon_node",
            "target": "node:n-04",
            "group": None,
            "generation": None,
            "params": {"node": "n-04", "reason": "xid 79 storm", "dry_run": False},
            # The service fails the action then; the node refuses it from then on.
            "deadline": (now + timedelta(seconds=900)).isoformat().replace("+00:00", "Z"),
        },
    ]
    assert Action.objects.get(pk=action.pk).state == "dispatched"
    assert actions.dispatch_for_node(node=pool[3], now=now) == []


def test_it_cancels_at_dispatch_when_the_pool_filled_since_approval(pool, propose, vote, now):
    action = _approved(propose, vote, "node:n-09")
    Node.objects.filter(name__in=["n-00", "n-01"]).update(cordoned=True)
    outcome = actions.dispatch_action(action_id=action.pk, now=now)
    assert outcome.action.state == "cancelled"
    assert "not dispatched: the gates changed since approval" in outcome.reasons


def test_it_returns_approved_actions_on_the_ingest_response(pool, propose, vote, post_batch):
    from tests.conftest import make_batch

    action = _approved(propose, vote, "node:n-02")
    response = post_batch(
        make_batch(
            [{"kind": "heartbeat", "uptime_s": 1.0, "spool_depth": 0, "dropped": 0}], node="n-02"
        )
    )
    assert response.status_code == 202
    assert [a["id"] for a in response.json()["actions"]] == [action.pk]


def test_it_refuses_a_result_for_another_nodes_action(pool, propose, vote, client, agent_token):
    action = _approved(propose, vote, "node:n-02")
    actions.dispatch_for_node(node=pool[2], now=action.proposed_at)
    response = client.post(
        f"/api/v1/actions/{action.pk}/result",
        data=json.dumps({"status": "succeeded"}),
        content_type="application/json",
        headers={"Authorization": f"Bearer {agent_token('n-07')}"},
    )
    assert response.status_code == 403
    assert "not for node n-07" in response.json()["error"]
    assert Action.objects.get(pk=action.pk).state == "dispatched"


def test_it_cordons_the_node_when_the_agent_reports_success(
    pool, propose, vote, client, agent_token
):
    action = _approved(propose, vote, "node:n-02")
    token = agent_token("n-02")
    polled = client.get("/api/v1/agents/actions", headers={"Authorization": f"Bearer {token}"})
    assert [a["id"] for a in polled.json()["actions"]] == [action.pk]
    body = {"status": "succeeded", "exit_code": 0, "output": "node/n-02 cordoned\n" * 1000}
    response = client.post(
        f"/api/v1/actions/{action.pk}/result",
        data=json.dumps(body),
        content_type="application/json",
        headers={"Authorization": f"Bearer {token}"},
    )
    assert response.status_code == 200
    assert response.json()["state"] == "succeeded"
    assert len(response.json()["result"]["output"]) <= OUTPUT_LIMIT
    assert Node.objects.get(name="n-02").cordoned is True
    again = client.post(
        f"/api/v1/actions/{action.pk}/result",
        data=json.dumps(body),
        content_type="application/json",
        headers={"Authorization": f"Bearer {token}"},
    )
    assert again.status_code == 409


def test_it_never_dispatches_a_dry_run_and_completes_it_with_its_preview(pool, propose, vote, now):
    action = _approved(propose, vote, "node:n-06", dry_run=True)
    action.refresh_from_db()
    assert action.state == "succeeded"
    assert action.dispatched_at is None
    assert action.result["dry_run"] is True
    assert any("would" in line for line in action.result["preview"])
    assert actions.dispatch_for_node(node=pool[6], now=now) == []
    with pytest.raises(actions.Conflict):
        actions.record_action_result(
            action_id=action.pk,
            node=pool[6],
            status="succeeded",
            exit_code=0,
            output="ran for real",
            now=now,
        )
    assert Node.objects.get(name="n-06").cordoned is False
    verbs = set(AuditLog.objects.filter(object_id=str(action.pk)).values_list("verb", flat=True))
    assert "action.succeeded" in verbs and "action.dispatched" not in verbs


def test_it_does_not_count_a_dry_run_against_the_blast_radius(pool, propose):
    propose("node:n-06", dry_run=True)
    real = propose("node:n-07")
    out = fleet_state(exclude=real.action.pk, include_proposed=True)
    assert "n-06" not in out.nodes_out
    propose("node:n-08")
    assert "n-08" in fleet_state(exclude=real.action.pk, include_proposed=True).nodes_out


def test_it_refuses_a_restart_without_the_schedulers_job_id(pool, propose):
    with pytest.raises(actions.RemediationError, match=r"params\.job"):
        propose("group:llama", kind="restart_group")


def test_it_fills_the_job_id_from_the_group(pool, propose):
    ConsistencyGroup.objects.filter(name="llama").update(scheduler_job="4242")
    outcome = propose("group:llama", kind="restart_group")
    assert outcome.action.params["job"] == "4242"
