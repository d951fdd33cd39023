"""A silent node is taken out by the pool's controller agent, never by the fleet's silence.

Through real ingest and the sweep's own functions: a node stops reporting; after 30 s (and
only when the silence is not the fleet's) the policy proposes cordon_node, routed to the
controller agent the pool names; the controller's agent receives it signed with its own
token, reports, and the node latches as a condition until it reports again and validates.
Without a controller (or with it silent) the proposal waits and the incident says why;
many nodes silent at once is one fleet incident and no node is cordoned.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from agents import signing
from console import actions, pipeline
from console.models import Action, AuditLog, Incident, Node
from ingest.auth import hash_token
from tests.conftest import make_batch

pytestmark = pytest.mark.django_db

NODE = "gpu-07"
CONTROLLER = "slurmctl-01"
POOLS = {"default": {"controller": CONTROLLER}}
AFTER = timedelta(seconds=31)


def _report(post_batch, name: str, token: str | None = None) -> Any:
    sample = {"kind": "device_sample", "gpu": f"GPU-{name}-0", "index": 0, "temp_c": 50.0}
    records = [sample] if name != CONTROLLER else [{"kind": "heartbeat", "uptime_s": 5.0}]
    response = post_batch(make_batch(records, node=name), token=token)
    assert response.status_code == 202, response.content
    return response


def _go_quiet(*names: str) -> None:
    Node.objects.filter(name__in=names).update(last_seen=timezone.now() - timedelta(minutes=1))
    pipeline.mark_silent_nodes(now=timezone.now())


def _waits(node: str = NODE) -> list[str]:
    incident = Incident.objects.get(kind="node_silent", node__name=node, state="open")
    return list(incident.timeline.get("remediation_waits") or [])


def test_a_silent_node_is_cordoned_by_the_controller_agent_and_returns_after_it_reports(
    post_batch, settings, agent_token, client, cast
) -> None:
    settings.FAULTLINE_REMEDIATION_POOLS = POOLS
    ctl_token = agent_token(CONTROLLER)
    _report(post_batch, CONTROLLER, ctl_token)
    _report(post_batch, NODE)
    for i in range(4):  # a fleet to take one node out of (below the blast-radius limit)
        _report(post_batch, f"gpu-1{i}")
    _go_quiet(NODE)
    assert actions.remediate_nodes(now=timezone.now()) == []  # silent for seconds: it waits
    assert "a silent node is taken out once it has been silent 30 s" in _waits()[0]
    (made,) = actions.remediate_nodes(now=timezone.now() + AFTER)
    cordon = Action.objects.get(pk=made)
    assert (cordon.kind, cordon.target, cordon.node.name) == ("cordon_node", f"node:{NODE}", NODE)
    assert cordon.executor.name == CONTROLLER and _waits() == []
    actions.vote_on_action(action_id=made, actor=cast["approver"], approve=True, now=timezone.now())
    # The silent node's own agent never gets it; the controller does, signed for itself.
    assert actions.dispatch_for_node(node=Node.objects.get(name=NODE), now=timezone.now()) == []
    (sent,) = _report(post_batch, CONTROLLER, ctl_token).json()["actions"]
    assert (sent["id"], sent["node"], sent["target"]) == (made, CONTROLLER, f"node:{NODE}")
    assert sent["params"]["node"] == NODE
    assert signing.verify(sent, signing.key_from_token_hash(hash_token(ctl_token)))
    node_token = agent_token(NODE)
    refused = client.post(
        f"/api/v1/actions/{made}/result",
        data={"status": "succeeded", "exit_code": 0, "output": ""},
        content_type="application/json", headers={"Authorization": f"Bearer {node_token}"},
    )  # fmt: skip
    assert refused.status_code == 403  # the result is the controller's to report
    done = client.post(
        f"/api/v1/actions/{made}/result",
        data={"status": "succeeded", "exit_code": 0, "output": "node gpu-07: idle -> drained",
              "outcome": {"state": "applied", "taken_out_by": "faultline"}},
        content_type="application/json", headers={"Authorization": f"Bearer {ctl_token}"},
    )  # fmt: skip
    assert done.status_code == 200, done.content
    node = Node.objects.get(name=NODE)
    assert (node.cordoned, node.lifecycle, node.repair_needed) == (
        True, "out_of_service", "condition"
    )  # fmt: skip
    assert not Node.objects.get(name=CONTROLLER).cordoned
    # It reports again: the silence resolves, the condition cleared; validation, then return.
    _report(post_batch, NODE)
    node.refresh_from_db()
    assert node.lifecycle == "validating"
    _report(post_batch, NODE)  # its GPU reports after the repair
    (back,) = actions.propose_returns(now=timezone.now() + timedelta(minutes=11))
    returned = Action.objects.get(pk=back)
    assert (returned.kind, returned.executor) == ("uncordon_node", None)  # its own agent


def test_without_a_controller_the_cordon_is_proposed_and_waits_and_moves_when_one_reports(
    post_batch, settings, agent_token, client, cast
) -> None:
    for i in range(4):
        _report(post_batch, f"gpu-1{i}")
    _report(post_batch, NODE)
    _go_quiet(NODE)
    (made,) = actions.remediate_nodes(now=timezone.now() + AFTER)
    assert Action.objects.get(pk=made).executor is None
    (why,) = _waits()
    assert "pool default names no controller agent" in why and "controller = true" in why
    client.force_login(cast["viewer"])  # the incident says why, on its page and in the API
    incident = Incident.objects.get(kind="node_silent", node__name=NODE)
    page = client.get(f"/incidents/{incident.pk}/").content.decode()
    assert "names no controller agent" in page and "data-remediation-wait" in page
    api = client.get(f"/api/v1/incidents/{incident.pk}/").json()
    assert api["timeline"]["remediation_waits"] == [why]
    # An admin names a controller that has not reported yet: still waiting, saying so.
    settings.FAULTLINE_REMEDIATION_POOLS = POOLS
    actions.remediate_nodes(now=timezone.now() + AFTER)
    assert actions.route_waiting(now=timezone.now()) == []
    assert "controller agent slurmctl-01 is silent" in _waits()[0]
    # It reports: the sweep routes the waiting cordon to it, and the incident stops waiting.
    _report(post_batch, CONTROLLER, agent_token(CONTROLLER))
    assert actions.route_waiting(now=timezone.now()) == [made]
    assert Action.objects.get(pk=made).executor.name == CONTROLLER
    assert client.get(f"/api/v1/actions/{made}/").json()["executor"] == CONTROLLER
    audit = AuditLog.objects.get(verb="action.routed", object_id=str(made))
    assert audit.data == {"from": "", "to": CONTROLLER}
    actions.remediate_nodes(now=timezone.now() + AFTER)
    assert _waits() == []
    # Approved ahead, but the node comes back before the controller ran it: withdrawn,
    # never run on a node that reports again.
    actions.vote_on_action(action_id=made, actor=cast["approver"], approve=True,
                           now=timezone.now())  # fmt: skip
    assert Action.objects.get(pk=made).state == "approved"
    _report(post_batch, NODE)
    actions.remediate_nodes(now=timezone.now() + AFTER)
    withdrawn = Action.objects.get(pk=made)
    assert withdrawn.state == "cancelled"
    assert AuditLog.objects.get(verb="action.cancelled", object_id=str(made)).reason == (
        "its finding resolved before it ran"
    )
    ctl = Node.objects.get(name=CONTROLLER)
    assert actions.dispatch_for_node(node=ctl, now=timezone.now()) == []


def test_a_proposal_for_a_node_that_goes_silent_before_dispatch_moves_to_the_controller(
    post_batch, settings, agent_token
) -> None:
    """Routing is decided again while an action waits: a drain proposed while its node's
    agent reported goes to the controller once the node is silent, and back if it returns."""
    settings.FAULTLINE_REMEDIATION_POOLS = POOLS
    _report(post_batch, CONTROLLER, agent_token(CONTROLLER))
    _report(post_batch, NODE)
    xid = {"kind": "device_event", "gpu": f"GPU-{NODE}-0", "event": "xid", "code": 79}
    assert post_batch(make_batch([xid], node=NODE)).status_code == 202
    (made,) = actions.remediate_nodes(now=timezone.now())
    assert Action.objects.get(pk=made).executor is None
    _go_quiet(NODE)
    assert actions.route_waiting(now=timezone.now()) == [made]
    assert Action.objects.get(pk=made).executor.name == CONTROLLER
    _report(post_batch, NODE)
    assert actions.route_waiting(now=timezone.now()) == [made]
    assert Action.objects.get(pk=made).executor is None


def test_many_silent_nodes_are_one_fleet_incident_and_none_is_cordoned(
    post_batch, settings, agent_token
) -> None:
    """20 of 24 nodes quiet in one sweep: one fleet incident, no node incident, nothing
    proposed. 20 of 24 quiet over two sweeps (10 each, neither a mass alone): each has a
    node incident, but the nodes silent right now are a mass, so none is cordoned and each
    incident says why."""
    settings.FAULTLINE_REMEDIATION_POOLS = POOLS
    _report(post_batch, CONTROLLER, agent_token(CONTROLLER))
    names = [f"rack-{i:02d}" for i in range(24)]
    for name in names:
        _report(post_batch, name)
    _go_quiet(*names[:20])
    assert Incident.objects.filter(kind="fleet_silent", state="open").count() == 1
    assert actions.remediate_nodes(now=timezone.now() + AFTER) == []
    for name in names[:20]:
        _report(post_batch, name)
    pipeline.mark_silent_nodes(now=timezone.now())  # the fleet silence resolves
    _go_quiet(*names[:10])
    _go_quiet(*names[10:20])
    assert Incident.objects.filter(kind="node_silent", state="open").count() == 20
    assert not Incident.objects.filter(kind="fleet_silent", state="open").exists()
    assert actions.remediate_nodes(now=timezone.now() + AFTER) == []
    assert not Action.objects.exists()
    assert "nodes are silent: more likely the path to Faultline" in _waits(names[3])[0]


def test_a_launcher_only_host_going_silent_is_not_cordoned(post_batch, settings, agent_token):
    settings.FAULTLINE_REMEDIATION_POOLS = POOLS
    _report(post_batch, CONTROLLER, agent_token(CONTROLLER))
    heartbeat = [{"kind": "heartbeat", "uptime_s": 5.0}]
    assert post_batch(make_batch(heartbeat, node="login-1")).status_code == 202
    for i in range(4):
        _report(post_batch, f"gpu-1{i}")
    _go_quiet("login-1")
    assert actions.remediate_nodes(now=timezone.now() + AFTER) == []
    assert not Action.objects.exists()
