"""A launcher token speaks for its group, never for the node it was issued on (a launcher
token once sent an Xid for another node, polled that node's actions and posted a
forged `succeeded`). Real endpoints, real tokens, real Postgres."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from console import actions
from console.models import Action, ConsistencyGroup, Node, Rank
from ingest.auth import issue_token
from ingest.models import BatchReceipt, DeviceEvent, DeviceSample, HostEvent, ProcessRecord
from tests.conftest import make_batch

pytestmark = pytest.mark.django_db


def _approved(propose, vote, target: str) -> Action:
    action = propose(target).action
    return vote(action.pk, "approver").action


def _launcher(node: str = "n-02", group: str = "llama") -> str:
    """A launcher token issued on a GPU node's name: the shape the review abused."""
    return issue_token(node_name=node, launcher_group=group)


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_a_launcher_token_cannot_poll_its_nodes_actions(pool, propose, vote, client):
    action = _approved(propose, vote, "node:n-02")
    response = client.get("/api/v1/agents/actions", headers=_bearer(_launcher()))
    assert response.status_code == 403
    assert "a launcher token may not read or answer" in response.json()["detail"]
    assert Action.objects.get(pk=action.pk).state == "approved"  # not dispatched to it


@pytest.mark.parametrize("status", ["succeeded", "failed"])
def test_a_launcher_token_cannot_answer_its_nodes_actions(pool, propose, vote, client, status):
    action = _approved(propose, vote, "node:n-02")
    actions.dispatch_for_node(node=pool[2], now=action.proposed_at)
    response = client.post(
        f"/api/v1/actions/{action.pk}/result",
        data=json.dumps({"status": status, "exit_code": 0, "output": "node/n-02 cordoned"}),
        content_type="application/json",
        headers=_bearer(_launcher()),
    )
    assert response.status_code == 403
    assert Action.objects.get(pk=action.pk).state == "dispatched"
    assert Node.objects.get(name="n-02").cordoned is False


def test_a_launcher_tokens_batch_carries_no_actions_of_its_node(pool, propose, vote, post_batch):
    action = _approved(propose, vote, "node:n-02")
    running = {"kind": "transition", "group": "llama", "generation": 3, "to_state": "running"}
    response = post_batch(make_batch([running], node="n-02"), token=_launcher())
    assert response.status_code == 202
    assert response.json()["actions"] == []
    assert Action.objects.get(pk=action.pk).state == "approved"


XID = {"kind": "device_event", "gpu": "GPU-0002", "event": "xid", "code": 79}


@pytest.mark.parametrize(
    "record",
    [
        XID,
        {"kind": "device_sample", "gpu": "GPU-0002", "index": 0, "temp_c": 99.0},
        {"kind": "heartbeat", "uptime_s": 1.0},
        {"kind": "host_event", "event": "oom_kill", "pid": 7, "comm": "python"},
        {"kind": "step", "group": "llama", "generation": 3, "rank": 0, "step": 9},
        {"kind": "checkpoint", "group": "llama", "generation": 3, "checkpoint_id": "c"}
        | {"phase": "committed"},
        {"kind": "transition", "group": "other", "generation": 1, "to_state": "failed"},
        {"kind": "process", "group": "other", "generation": 1, "rank": 0, "event": "exited"},
    ],
    ids=lambda r: f"{r['kind']}-{r.get('group', 'node')}",
)
def test_a_launcher_token_sends_only_its_groups_records(pool, post_batch, record):
    own = {"kind": "transition", "group": "llama", "generation": 3, "to_state": "running"}
    response = post_batch(make_batch([own, dict(record)], node="n-02"), token=_launcher())
    assert response.status_code == 403
    body = response.json()
    assert body["error"].startswith('record 1: a launcher token speaks for group "llama" only')
    assert not BatchReceipt.objects.exists()  # nothing of the batch stored
    assert not DeviceEvent.objects.exists() and not DeviceSample.objects.exists()
    assert not HostEvent.objects.exists()
    assert ConsistencyGroup.objects.get(name="llama").state == "running"
    assert not ConsistencyGroup.objects.filter(name="other").exists()


def test_a_launcher_reports_its_groups_exits_without_hosting_a_rank_or_proving_its_node(
    pool, post_batch
):
    """What a launcher sees: a rank that died (torchrun's waitpid) and a serving worker's
    exit. Stored and applied to the group, but the rank stays where it runs, and the node the
    token names is not kept alive by it."""
    stale = datetime.now(UTC) - timedelta(minutes=10)
    Node.objects.filter(name="n-02").update(last_seen=stale)
    exited = {"kind": "process", "group": "llama", "generation": 3, "rank": 1,
              "event": "exited", "signal": 9, "job": "5150"}  # fmt: skip
    window = {"kind": "serving", "group": "llama", "worker": "w0",
              "window": {"seconds": 10, "exited": True}}  # fmt: skip
    response = post_batch(make_batch([exited, window], node="n-02"), token=_launcher())
    assert response.status_code == 202, response.content
    assert ProcessRecord.objects.get(rank=1).stale is False
    assert Rank.objects.get(group__name="llama", rank=1).node.name == "n-01"
    assert ConsistencyGroup.objects.get(name="llama").scheduler_job == "5150"
    assert Node.objects.get(name="n-02").last_seen == stale
