"""Node-scope incidents reach the remediation policy through real ingest, whether or not a
group runs there, and propose what docs/safety.md's per-placement table says.

Each fault is reported by the node's agent (POST /api/v1/ingest); the node sweep's
`remediate_nodes` plans the node's incident; where the node hosts a group, the group's
diagnosis (the real pipeline) plans its root cause too. The proposals together must be the
table's cell, read from the document (tests/policy/test_placement.py reads the same).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from console import actions
from console.models import VERDICT_SETTLES_AFTER, Action, Incident, Node
from tests.conftest import make_batch
from tests.policy.test_placement import _table
from tests.server.scenarios.timeline import Timeline

pytestmark = pytest.mark.django_db

NODE = "node-0"  # Timeline places ranks 0-3 on node-0
K8S = {"default": {"scheduler": "kubernetes"}}
LATER = timedelta(seconds=31)  # a condition is taken out once it lasted 30 s


def _gpu(placement: str) -> str:
    return "GPU-train-1" if placement == "ranks" else f"GPU-{NODE}-1"


def _sample(gpu: str) -> dict[str, Any]:
    return {"kind": "device_sample", "gpu": gpu, "index": 1, "temp_c": 55.0, "util_pct": 0.0}


# fault name -> (records for the node, the table's row, the pool settings)
def _fault(name: str, gpu: str) -> list[dict[str, Any]]:
    return {
        "xid79": [{"kind": "device_event", "gpu": gpu, "event": "xid", "code": 79,
                   "detail": "GPU has fallen off the bus"}],
        "dbe": [{"kind": "device_event", "gpu": gpu, "event": "ecc_dbe", "code": 48,
                 "detail": "double-bit ECC error"}],
        "gpu_lost": [{"kind": "device_event", "gpu": gpu, "event": "gpu_lost",
                      "detail": "GPU is lost"}],
        "row_remap": [{"kind": "device_event", "gpu": gpu, "event": "row_remap_failure",
                       "detail": "row remapping failed"}],
        "nic_down": [{"kind": "net_event", "port": "mlx5_0/1", "link": "ib",
                      "event": "link_down", "state": "DOWN", "counters": {"link_downed": 1}}],
        "disk_full": [{"kind": "host_sample", "disks": [
            {"root": "/ckpt", "device": "nvme1n1", "free_bytes": 2**30,
             "total_bytes": 3500 * 2**30}]}],
    }[name]  # fmt: skip


FAULTS = {
    "xid79": ("hardware fault on a GPU (Xid of class hardware, `ecc_dbe`), Slurm", None),
    "row_remap": ("`row_remap_failure` (a GPU out of spare rows), Slurm", None),
    "dbe": ("hardware fault on a GPU, Kubernetes", K8S),
    "gpu_lost": ("`gpu_lost`", K8S),
    "nic_down": ("`nic_down`, `disk_full`", None),
    "disk_full": ("`nic_down`, `disk_full`", K8S),
}


def _place(post_batch, placement: str) -> Timeline | None:
    """Put node-0 where the placement says, through its agent's batches."""
    if placement == "ranks":
        t = Timeline(post=post_batch, group="train", ranks=4)
        t.boot(at=0, job="4242")
        t.good_checkpoint("ckpt-10", at=10.5, step=10)
        t.steps(first=0, count=30, at=1)
        t.heartbeats(until=40)
        t.send()
        return t
    records: list[dict[str, Any]] = [{"kind": "heartbeat", "uptime_s": 60.0}]
    if placement != "launcher":
        records.append(_sample(_gpu(placement)))
    if placement == "serving":
        records.append(
            {"kind": "serving", "group": "serve", "worker": "w0", "model_version": "m1",
             "ready": True, "window": {"seconds": 5, "requests": 10, "slo_met": 10}}
        )  # fmt: skip
    assert post_batch(make_batch(records, node=NODE)).status_code == 202
    return None


def _proposed() -> list[str]:
    return sorted(Action.objects.filter(state="proposed").values_list("kind", flat=True))


def _diagnosed(t: Any) -> None:
    """The group's diagnosis, then its pass once the verdict has settled: a group's
    incident is proposed from only then (Incident.verdict_settled)."""
    t.diagnose(at=41)
    t.diagnose(at=41 + VERDICT_SETTLES_AFTER.total_seconds() + 1)


@pytest.mark.parametrize("fault", sorted(FAULTS))
@pytest.mark.parametrize("placement", ["idle", "ranks", "launcher", "serving"])
def test_a_node_fault_proposes_what_the_placement_table_says(
    post_batch, settings, placement: str, fault: str
) -> None:
    row, pools = FAULTS[fault]
    if pools:
        settings.FAULTLINE_REMEDIATION_POOLS = pools
    records = _fault(fault, _gpu(placement))
    if placement == "launcher" and records[0]["kind"] == "device_event":
        pytest.skip("a GPU's event makes the host one with a GPU: not launcher-only")
    timeline = _place(post_batch, placement)
    assert post_batch(make_batch(records, node=NODE)).status_code == 202
    (incident,) = Incident.objects.filter(group=None, node__name=NODE)
    if timeline is not None and records[0]["kind"] == "device_event":
        _diagnosed(timeline)  # the group's own root cause, planned once it settles
    actions.remediate_nodes(now=timezone.now() + LATER)
    want = _table()[row][placement]
    assert _proposed() == sorted(want), (placement, fault, incident.timeline)
    for action in Action.objects.all():
        assert action.executor is None  # the node's own agent reports: it runs them
        assert action.proposed_by_rule == "policy" and action.evidence["finding"]
    if not want:
        assert incident.timeline.get("remediation_waits") in (None, [])
    # Planned once per version of the incident: the next sweep proposes nothing new.
    assert actions.remediate_nodes(now=timezone.now() + LATER) == []


def test_an_idle_nodes_xid_is_drained_by_its_own_agent_and_latches_out_of_service(
    post_batch, client, agent_token, cast
) -> None:
    """The issue's case: a GPU dies on a node with no job. The sweep proposes drain_node,
    an approver approves, the node's agent receives it (signed) on its next batch, reports
    success, and the node is out of service, owned by Faultline."""
    token = agent_token(NODE)
    gpu = _gpu("idle")
    post = lambda recs: post_batch(make_batch(recs, node=NODE), token=token)  # noqa: E731
    assert post([_sample(gpu)]).status_code == 202
    assert post(_fault("xid79", gpu)).status_code == 202
    (made,) = actions.remediate_nodes(now=timezone.now())
    drain = Action.objects.get(pk=made)
    assert (drain.kind, drain.target, drain.trigger) == ("drain_node", f"node:{NODE}", "xid:79")
    assert drain.incident.group is None and drain.incident.node.name == NODE
    for who in ("approver", "approver2"):  # one node of one: above the blast radius
        actions.vote_on_action(action_id=made, actor=cast[who], approve=True,
                               now=timezone.now())  # fmt: skip
    response = post([{"kind": "heartbeat", "uptime_s": 61.0}])
    (sent,) = response.json()["actions"]
    assert (sent["id"], sent["node"], sent["params"]["node"]) == (made, NODE, NODE)
    assert sent["signature"].startswith("hmac-sha256:v1:")
    result = client.post(
        f"/api/v1/actions/{made}/result",
        data={"status": "succeeded", "exit_code": 0, "output": "drained",
              "outcome": {"state": "applied", "taken_out_by": "faultline"}},
        content_type="application/json", headers={"Authorization": f"Bearer {token}"},
    )  # fmt: skip
    assert result.status_code == 200, result.content
    node = Node.objects.get(name=NODE)
    assert (node.cordoned, node.lifecycle, node.taken_out_by) == (
        True, "out_of_service", "faultline"
    )  # fmt: skip


def test_a_busy_nodes_fault_is_taken_out_once_whichever_incident_plans_first(
    post_batch,
) -> None:
    """The node's incident and the group's root cause name the same fault: one drain,
    and the restart only from the group's, whichever of the sweep and the diagnosis runs
    first."""
    t = _place(post_batch, "ranks")
    assert t is not None
    t.add(NODE, t.at(40), _fault("xid79", _gpu("ranks"))[0])
    t.send()
    actions.remediate_nodes(now=timezone.now())  # the sweep first, this time
    assert _proposed() == ["drain_node"]
    _diagnosed(t)
    assert _proposed() == ["drain_node", "restart_group"]
    drain = Action.objects.get(kind="drain_node")
    assert drain.incident.group is None  # the node's incident proposed it
    restart = Action.objects.get(kind="restart_group")
    assert restart.params["job"] == "4242" and restart.incident.root_incident == drain.incident


def test_a_rejected_drain_is_not_proposed_again_by_the_other_incident(post_batch, cast) -> None:
    t = _place(post_batch, "ranks")
    assert t is not None
    t.add(NODE, t.at(40), _fault("xid79", _gpu("ranks"))[0])
    _diagnosed(t)  # the group's diagnosis first
    drain = Action.objects.get(kind="drain_node")
    actions.vote_on_action(action_id=drain.pk, actor=cast["approver"], approve=False,
                           now=timezone.now(), reason="not this node")  # fmt: skip
    actions.remediate_nodes(now=timezone.now())
    assert not Action.objects.filter(kind="drain_node", state="proposed").exists()


def test_a_condition_that_clears_before_a_decision_withdraws_the_drain(post_batch) -> None:
    _place(post_batch, "idle")
    assert post_batch(make_batch(_fault("nic_down", ""), node=NODE)).status_code == 202
    assert actions.remediate_nodes(now=timezone.now()) == []  # a flap is not a NIC down
    (incident,) = Incident.objects.filter(kind="nic_down")
    assert (
        "a node is taken out once it has lasted 30 s" in incident.timeline["remediation_waits"][0]
    )
    (made,) = actions.remediate_nodes(now=timezone.now() + LATER)
    up = {"kind": "net_sample", "port": "mlx5_0/1", "link": "ib", "state": "ACTIVE"}
    assert post_batch(make_batch([up], node=NODE)).status_code == 202
    assert actions.settle_conditions(now=timezone.now()) == [NODE]
    actions.remediate_nodes(now=timezone.now() + LATER)
    assert Action.objects.get(pk=made).state == "cancelled"
    incident.refresh_from_db()
    assert incident.state == "resolved"


def test_a_full_checkpoint_root_shared_by_several_nodes_is_no_nodes_condition(
    post_batch,
) -> None:
    """The same root full on two nodes is a shared filesystem (a network mount whose
    source looks local): neither node is taken out, and each incident says why."""
    for node in (NODE, "node-9"):
        records = [_sample(f"GPU-{node}-1"), *_fault("disk_full", "")]
        assert post_batch(make_batch(records, node=node)).status_code == 202
    assert actions.remediate_nodes(now=timezone.now() + LATER) == []
    for incident in Incident.objects.filter(kind="disk_full"):
        assert "a shared filesystem" in incident.timeline["remediation_waits"][0]


def test_a_network_filesystem_full_opens_nothing(post_batch) -> None:
    nfs = {"kind": "host_sample", "disks": [{"root": "/ckpt", "device": "nas:/export/ckpt",
                                             "free_bytes": 0, "total_bytes": 2**40}]}  # fmt: skip
    assert post_batch(make_batch([nfs], node=NODE)).status_code == 202
    assert not Incident.objects.filter(kind="disk_full").exists()


def test_the_node_sweep_at_rest_and_with_a_planned_incident_costs_a_few_queries(
    post_batch,
) -> None:
    """Every second on the housekeeping worker: a fleet at rest is a handful of queries,
    and a node incident already planned (nothing waiting) is not planned again."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from console.tasks import sweep_nodes

    for i in range(8):
        assert post_batch(make_batch([_sample(f"GPU-r{i}")], node=f"rest-{i}")).status_code == 202
    sweep_nodes()  # settles anything the batches left
    with CaptureQueriesContext(connection) as rest:
        sweep_nodes()
    # Seven: silent nodes, an open fleet silence, node conditions, node incidents, the
    # policy's open proposals on them, actions waiting for an agent, validated nodes.
    assert len(_queries(rest)) == 7, _queries(rest)
    assert post_batch(make_batch(_fault("xid79", "GPU-r0"), node="rest-0")).status_code == 202
    sweep_nodes()
    assert Action.objects.filter(kind="drain_node").count() == 1
    with CaptureQueriesContext(connection) as planned:
        sweep_nodes()
    assert len(_queries(planned)) <= 8, _queries(planned)  # planned once: not again
    assert Action.objects.count() == 1


def _queries(captured: Any) -> list[str]:
    """The statements a sweep sent (a test's savepoints are its transaction's, not the
    sweep's: in production each atomic block is its own transaction)."""
    return [
        q["sql"][:100]
        for q in captured.captured_queries
        if not q["sql"].startswith(("SAVEPOINT", "RELEASE SAVEPOINT"))
    ]


def test_a_groups_drain_cancelled_as_stale_does_not_keep_the_node_in_service(
    post_batch,
) -> None:
    """The group's incident proposed the drain first (it carries the group's generation);
    the group restarts elsewhere before it runs, so the dispatch re-check cancels it as
    stale. The node's own incident still takes the broken node out."""
    t = _place(post_batch, "ranks")
    assert t is not None
    t.add(NODE, t.at(40), _fault("xid79", _gpu("ranks"))[0])
    _diagnosed(t)  # the group's diagnosis first: its drain names the group
    drain = Action.objects.get(kind="drain_node")
    assert drain.group is not None and drain.incident.group is not None
    Action.objects.filter(pk=drain.pk).update(state="cancelled")  # stale at dispatch
    (again,) = actions.remediate_nodes(now=timezone.now())
    redo = Action.objects.get(pk=again)
    assert (redo.kind, redo.target, redo.group) == ("drain_node", f"node:{NODE}", None)
    assert redo.incident.group is None
