"""Fleet health as durable state, through the real ingest path (agent tokens, batches).

An Xid 48 on a node that runs no job latches a fault on its GPU and node and opens a
node incident at once; clean samples never clear it; a reboot (new boot_id) starts the
validation window; once it passes the sweep proposes the node's return; repeat faults
flag it for replacement instead; ownership keeps Faultline's hands off someone else's
cordon.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
import time_machine
from django.utils import timezone

from console import actions
from console.models import Action, AuditLog, Device, HealthEvent, Incident, Node
from tests.conftest import make_batch

pytestmark = pytest.mark.django_db

NODE = "spare-1"
GPU = "GPU-spare-1-0003"


def _batch(records: list[dict[str, Any]], *, boot: str) -> dict[str, Any]:
    batch = make_batch(records, node=NODE)
    batch["agent"]["boot_id"] = boot
    return batch


def _sample(**fields: Any) -> dict[str, Any]:
    return {"kind": "device_sample", "gpu": GPU, "index": 3, "temp_c": 55.0, "power_w": 90.0,
            "util_pct": 0.0, "sm_clock_mhz": 1400.0, **fields}  # fmt: skip


def _xid(code: int = 48) -> dict[str, Any]:
    return {"kind": "device_event", "gpu": GPU, "event": "xid", "code": code,
            "detail": "DBE"}  # fmt: skip


def _post(post_batch, records: list[dict[str, Any]], *, boot: str = "boot-a") -> None:
    response = post_batch(_batch(records, boot=boot))
    assert response.status_code == 202, response.content


def _gpu() -> Device:
    return Device.objects.get(uuid=GPU)


def _node() -> Node:
    return Node.objects.get(name=NODE)


def _node_incidents() -> list[Incident]:
    return list(Incident.objects.filter(node__name=NODE, group=None).exclude(state="resolved"))


def _reboot(post_batch, boot: str) -> None:
    """The node comes back with a new boot id, and its GPU reports after the repair."""
    _post(post_batch, [_sample()], boot=boot)
    _post(post_batch, [_sample()], boot=boot)


def _fault_and_repair(post_batch, boot_before: str, boot_after: str) -> None:
    _post(post_batch, [_sample(), _xid()], boot=boot_before)
    _reboot(post_batch, boot_after)


def test_it_latches_an_xid_48_on_an_idle_node_and_clean_samples_never_clear_it(post_batch):
    _post(post_batch, [_sample()])
    assert _gpu().lifecycle == "healthy"
    _post(post_batch, [_sample(), _xid(48)])
    (incident,) = _node_incidents()
    assert (incident.kind, incident.subject, incident.severity) == ("xid", f"gpu:{GPU}", "critical")
    assert incident.group is None and "needs gpu reset" in incident.summary
    for _ in range(5):
        _post(post_batch, [_sample()])
    gpu, node = _gpu(), _node()
    assert (gpu.lifecycle, node.lifecycle) == ("faulted", "faulted")
    assert (gpu.health, node.health) == ("critical", "critical")
    assert gpu.lifecycle_evidence["code"] == 48 and gpu.lifecycle_by == f"agent:{NODE}"
    assert gpu.repair_needed == "gpu_reset"
    # History and audit: one fault episode, whatever the repeats.
    _post(post_batch, [_xid(48)])
    assert HealthEvent.objects.filter(node=node, gpu=GPU, kind="fault").count() == 1
    assert AuditLog.objects.filter(verb="gpu.lifecycle", object_id=GPU).exists()
    assert len(_node_incidents()) == 1


def test_it_does_not_latch_an_application_xid(post_batch):
    _post(post_batch, [_sample(), _xid(13)])
    assert _gpu().lifecycle == "healthy"
    assert _node_incidents() == []


def test_it_proposes_a_return_only_after_a_reboot_and_a_clean_validation_window(post_batch):
    _post(post_batch, [_sample(), _xid(48)])
    now = timezone.now()
    assert actions.propose_returns(now=now + timedelta(hours=1)) == []  # no repair yet
    _reboot(post_batch, "boot-b")  # the node rebooted
    gpu, node = _gpu(), _node()
    assert (gpu.lifecycle, node.lifecycle) == ("validating", "validating")
    assert HealthEvent.objects.filter(node=node, kind="repair").count() == 2
    assert actions.propose_returns(now=timezone.now() + timedelta(minutes=9)) == []
    (action_id,) = actions.propose_returns(now=timezone.now() + timedelta(minutes=11))
    action = Action.objects.get(pk=action_id)
    assert (action.kind, action.target, action.proposed_by_rule) == (
        "uncordon_node", f"node:{NODE}", "fleet_health")  # fmt: skip
    assert action.incident == _node_incidents()[0]
    # Proposed once per validation, not every sweep.
    assert actions.propose_returns(now=timezone.now() + timedelta(minutes=12)) == []


def test_it_starts_over_when_a_fault_comes_back_inside_the_validation_window(post_batch):
    _fault_and_repair(post_batch, "boot-a", "boot-b")
    _post(post_batch, [_xid(48)], boot="boot-b")
    assert _gpu().lifecycle == "faulted"
    assert actions.propose_returns(now=timezone.now() + timedelta(minutes=11)) == []


def test_it_returns_the_node_when_the_uncordon_succeeds_and_resolves_its_incident(
    post_batch, client
):
    _fault_and_repair(post_batch, "boot-a", "boot-b")
    (action_id,) = actions.propose_returns(now=timezone.now() + timedelta(minutes=11))
    action = Action.objects.get(pk=action_id)
    Action.objects.filter(pk=action_id).update(state="dispatched")  # an approver approved it
    actions.record_action_result(
        action_id=action.pk, node=_node(), status="succeeded", exit_code=0, output="",
        now=timezone.now(), outcome={"state": "already", "taken_out_by": ""},
    )  # fmt: skip
    assert (_gpu().lifecycle, _node().lifecycle) == ("healthy", "healthy")
    assert Action.objects.get(pk=action_id).outcome["state"] == "already"
    assert _node_incidents() == []
    _post(post_batch, [_sample()], boot="boot-b")
    assert _gpu().health == "ok"


def test_it_flags_a_repeat_offender_for_replacement_instead_of_proposing_it(post_batch):
    start = timezone.now()
    for i in range(3):  # three faults within the week: the third flags it
        with time_machine.travel(start + timedelta(days=i), tick=True):
            _fault_and_repair(post_batch, f"boot-{i}", f"boot-{i + 1}")
            if i < 2:
                assert not _gpu().replace_flagged
                (aid,) = actions.propose_returns(now=timezone.now() + timedelta(minutes=11))
                Action.objects.filter(pk=aid).update(state="dispatched")
                actions.record_action_result(
                    action_id=aid, node=_node(), status="succeeded", exit_code=0, output="",
                    now=timezone.now(), outcome={"state": "applied"},
                )  # fmt: skip
    gpu, node = _gpu(), _node()
    assert gpu.replace_flagged and node.replace_flagged
    assert HealthEvent.objects.filter(node=node, kind="flagged").exists()
    assert "flagged for replacement" in _node_incidents()[0].summary
    later = start + timedelta(days=2, minutes=30)
    assert actions.propose_returns(now=later) == []
    assert HealthEvent.objects.filter(node=node, kind="held").exists()


def test_it_holds_a_return_of_a_flagged_node_for_an_approver_and_an_approver_returns_it(
    post_batch, cast
):
    _fault_and_repair(post_batch, "boot-a", "boot-b")
    Node.objects.filter(name=NODE).update(replace_flagged=True)
    out = actions.propose_action(
        kind="uncordon_node", target=f"node:{NODE}", reason="put it back", actor=cast["operator"],
        now=timezone.now(),
    )  # fmt: skip
    assert out.action.state == "proposed"
    assert any("flagged for replacement" in r for r in out.reasons)
    with pytest.raises(actions.NotAllowed):
        actions.return_to_service(
            node_name=NODE, actor=cast["operator"], reason="reseated", now=timezone.now()
        )
    node = actions.return_to_service(
        node_name=NODE,
        actor=cast["approver"],
        reason="GPU 3 replaced under RMA",
        now=timezone.now(),
    )
    assert (node.lifecycle, node.replace_flagged) == ("healthy", False)
    assert AuditLog.objects.filter(actor="approver", verb="node.lifecycle").exists()


def test_it_never_puts_back_a_node_someone_else_took_out(post_batch, cast):
    _post(post_batch, [_sample(), _xid(79)])
    out = actions.propose_action(
        kind="cordon_node", target=f"node:{NODE}", reason="Xid 79", actor=cast["operator"],
        now=timezone.now(),
    )  # fmt: skip
    Action.objects.filter(pk=out.action.pk).update(state="dispatched")
    actions.record_action_result(
        action_id=out.action.pk, node=_node(), status="succeeded", exit_code=0, output="",
        now=timezone.now(), outcome={"state": "held_by_other", "taken_out_by": "other"},
    )  # fmt: skip
    node = _node()
    assert (node.lifecycle, node.taken_out_by, node.cordoned) == (
        "out_of_service", "scheduler", True)  # fmt: skip
    _reboot(post_batch, "boot-b")  # Xid 79 needs a reboot: here it is
    (aid,) = actions.propose_returns(now=timezone.now() + timedelta(minutes=11))
    action = Action.objects.get(pk=aid)
    assert action.state == "proposed"  # never auto-approved: an approver decides
    assert any("taken out by the scheduler" in r for r in action.gate_reasons)


def test_a_cordon_a_person_proposed_is_the_operators_and_returns_only_through_an_approver(
    post_batch, cast
):
    _post(post_batch, [_sample(), _xid(79)])
    out = actions.propose_action(
        kind="cordon_node", target=f"node:{NODE}", reason="looks flaky", actor=cast["operator"],
        now=timezone.now(),
    )  # fmt: skip
    Action.objects.filter(pk=out.action.pk).update(state="dispatched")
    actions.record_action_result(
        action_id=out.action.pk, node=_node(), status="succeeded", exit_code=0, output="",
        now=timezone.now(), outcome={"state": "applied", "taken_out_by": "faultline"},
    )  # fmt: skip
    assert (_node().lifecycle, _node().taken_out_by) == ("out_of_service", "operator")
    _reboot(post_batch, "boot-b")
    (aid,) = actions.propose_returns(now=timezone.now() + timedelta(minutes=11))
    action = Action.objects.get(pk=aid)
    assert action.state == "proposed"
    assert any("taken out by the operator" in r for r in action.gate_reasons)


def test_it_links_a_group_incident_to_the_node_incident_and_resolves_them_apart(post_batch):
    from tests.server.scenarios.timeline import Timeline

    t = Timeline(post=post_batch)
    t.boot(at=0)
    t.good_checkpoint("ckpt-10", at=10.5, step=10)
    t.steps(first=0, count=30, at=1)
    t.heartbeats(until=90)
    t.add(t.node(5), t.at(30.5), {"kind": "device_event", "gpu": t.gpu(5), "event": "xid",
                                  "code": 79, "detail": "fell off the bus"})  # fmt: skip
    t.collectives(seq=30, at=31, entered=[r for r in range(t.ranks) if r != 5])
    group_incidents = t.diagnose(at=31.5)
    xid_incident = next(i for i in group_incidents if i.kind == "xid")
    node_incident = Incident.objects.get(node__name=t.node(5), group=None)
    assert xid_incident.root_incident == node_incident
    # The job moves on (restarted as generation 2 on a spare): the group's incident settles
    # and resolves; the node's stays open, and the GPU stays faulted.
    t.add(t.node(0), t.at(40), {"kind": "transition", "group": t.group, "generation": 2,
                                "from_state": "recovering", "to_state": "running",
                                "restart_count": 1})  # fmt: skip
    t.send()
    t.generation = 2
    t.steps(first=31, count=40, at=41)
    t.send()
    for at in (60, 80):
        t.diagnose(at=at)
    xid_incident.refresh_from_db()
    node_incident.refresh_from_db()
    assert xid_incident.state == "resolved"
    assert node_incident.state == "open"
    assert Device.objects.get(uuid=t.gpu(5)).lifecycle == "faulted"


def test_it_opens_a_node_incident_for_a_silent_node_and_resolves_it_when_it_reports(post_batch):
    from console import pipeline

    _post(post_batch, [_sample()])
    Node.objects.filter(name=NODE).update(last_seen=timezone.now() - timedelta(minutes=1))
    assert pipeline.mark_silent_nodes(now=timezone.now()) == [NODE]
    (incident,) = _node_incidents()
    assert (incident.kind, incident.severity, incident.group) == ("node_silent", "major", None)
    pipeline.mark_silent_nodes(now=timezone.now())
    assert len(_node_incidents()) == 1
    _post(post_batch, [_sample()])
    assert _node_incidents() == []


def _report(post_batch, names: list[str]) -> None:
    for name in names:
        sample = {"kind": "device_sample", "gpu": f"GPU-{name}-0", "index": 0, "temp_c": 50.0}
        assert post_batch(make_batch([sample], node=name)).status_code == 202


def test_many_nodes_silent_together_are_one_fleet_incident_and_the_rest_their_own_after(
    post_batch, client, cast
):
    """The path to Faultline breaks (its ingest, a proxy, the network): 20 of 24 nodes go
    quiet in one sweep. Each is marked down and audited, but one fleet incident names
    them, not 20 node incidents and 20 pages (a 16k bench whose nodes' liveness paused
    had one sweep open 1,345). When the path is back and 18 report again it resolves; the 2 still
    silent are then each a node incident of their own."""
    from console import pipeline

    names = [f"rack-{i:02d}" for i in range(24)]
    _report(post_batch, names)
    quiet = names[:20]
    Node.objects.filter(name__in=quiet).update(last_seen=timezone.now() - timedelta(minutes=1))
    assert sorted(pipeline.mark_silent_nodes(now=timezone.now())) == quiet
    assert sorted(Node.objects.filter(health="down").values_list("name", flat=True)) == quiet
    downs = AuditLog.objects.filter(verb="node.health", object_type="node")
    assert downs.count() == 20
    assert not Incident.objects.filter(kind="node_silent").exists()
    (fleet,) = Incident.objects.filter(kind="fleet_silent")
    assert (fleet.group, fleet.node, fleet.severity, fleet.state) == (
        None, None, "critical", "open"
    )  # fmt: skip
    assert fleet.root_cause["nodes"] == quiet
    assert "20 nodes stopped reporting together" in fleet.summary
    pipeline.mark_silent_nodes(now=timezone.now())  # the next sweep: nothing new, it holds
    assert Incident.objects.filter(kind="fleet_silent").exclude(state="resolved").count() == 1
    # Shown and paged like any incident: no group, no node.
    client.force_login(cast["viewer"])
    page = client.get(f"/incidents/{fleet.pk}/")
    assert page.status_code == 200 and "20 nodes stopped reporting" in page.content.decode()
    api = client.get(f"/api/v1/incidents/{fleet.pk}/")
    assert api.status_code == 200 and api.json()["kind"] == "fleet_silent"
    from console.actions.notifications import incident_labels

    labels = incident_labels(fleet)
    assert labels == {"kind": "fleet_silent", "severity": "critical"}

    _report(post_batch, quiet[2:])
    assert pipeline.mark_silent_nodes(now=timezone.now()) == []
    fleet.refresh_from_db()
    assert fleet.state == "resolved"
    assert AuditLog.objects.get(verb="incident.resolved", object_id=str(fleet.pk)).reason == (
        "18 of 20 nodes report again; 2 still silent, each with an incident of its own"
    )
    alone = Incident.objects.filter(kind="node_silent", state="open")
    assert sorted(i.node.name for i in alone) == quiet[:2]


def test_a_few_nodes_silent_together_are_each_their_own_incident(post_batch):
    """Below the fleet's threshold (16 nodes and a quarter of those reporting) silence is
    each node's own: 15 of 24 quiet at once is 15 node incidents, no fleet incident."""
    from console import pipeline

    names = [f"row-{i:02d}" for i in range(24)]
    _report(post_batch, names)
    Node.objects.filter(name__in=names[:15]).update(last_seen=timezone.now() - timedelta(minutes=1))
    assert len(pipeline.mark_silent_nodes(now=timezone.now())) == 15
    assert Incident.objects.filter(kind="node_silent", state="open").count() == 15
    assert not Incident.objects.filter(kind="fleet_silent").exists()


def test_it_reads_a_recorded_gpu_reset_as_repair_of_a_reset_need_but_not_of_a_reboot_need(
    post_batch,
):
    reset = {"kind": "device_event", "gpu": GPU, "event": "gpu_reset", "detail": "nvidia-smi -r"}
    _post(post_batch, [_sample(), _xid(48)])
    _post(post_batch, [reset])
    assert (_gpu().lifecycle, _node().lifecycle) == ("validating", "validating")
    _post(post_batch, [_xid(79)])  # a fault that needs a reboot: a reset is not enough
    _post(post_batch, [reset])
    assert (_gpu().lifecycle, _gpu().repair_needed) == ("faulted", "node_reboot")


def test_a_repaired_nodes_old_xid_is_not_the_root_cause_of_the_next_generation_on_it(post_batch):
    """After the repair (a reboot: new boot_id) the Xid before it is history: a generation
    placed on the repaired GPU must not be paged for it, nor the node taken out again."""
    from tests.server.scenarios.timeline import Timeline

    boots: dict[str, str] = {}

    def post(batch: dict[str, Any]) -> Any:  # every node's agent says which boot it runs
        batch["agent"]["boot_id"] = boots.setdefault(batch["agent"]["node"], "boot-1")
        return post_batch(batch)

    t = Timeline(post=post)
    t.boot(at=0)
    t.good_checkpoint("ckpt-10", at=10.5, step=10)
    t.steps(first=0, count=30, at=1)
    t.heartbeats(until=120)
    t.add(t.node(5), t.at(30.5), {"kind": "device_event", "gpu": t.gpu(5), "event": "xid",
                                  "code": 79, "detail": "fell off the bus"})  # fmt: skip
    t.collectives(seq=30, at=31, entered=[r for r in range(t.ranks) if r != 5])
    (xid,) = [i for i in t.diagnose(at=31.5) if i.kind == "xid"]
    assert xid.generation == 1
    # The node reboots (its agent reports a new boot id): the repair.
    boots[t.node(5)] = "boot-2"
    assert (
        post(make_batch([{"kind": "heartbeat", "uptime_s": 3.0}], node=t.node(5))).status_code
        == 202
    )
    assert HealthEvent.objects.filter(node__name=t.node(5), kind="repair").exists()
    # Generation 2 starts on the same GPUs, the repaired one included, and steps cleanly.
    t.generation = 2
    t.boot(at=40, from_state="recovering", restart_count=1)
    t.steps(first=10, count=30, at=41)
    later = t.diagnose(at=70)
    assert [i for i in later if i.kind == "xid" and i.generation == 2] == []
    xid.refresh_from_db()
    assert xid.clear_since is not None  # its finding is gone: the incident settles
    # A fault after the repair is news: the same GPU's next Xid is generation 2's root cause.
    now = (timezone.now() - t.start).total_seconds()  # the repair was seen before this
    t.add(t.node(5), t.at(now + 0.2), {"kind": "device_event", "gpu": t.gpu(5), "event": "xid",
                                       "code": 79, "detail": "fell off the bus again"})  # fmt: skip
    t.collectives(seq=40, at=now + 0.4, entered=[r for r in range(t.ranks) if r != 5])
    (again,) = [i for i in t.diagnose(at=now + 1.5) if i.kind == "xid" and i.generation == 2]
    assert (again.subject, again.clear_since) == (f"gpu:{t.gpu(5)}", None)


def _silent_job(post_batch, group: str) -> Any:
    from tests.server.scenarios.timeline import Timeline

    t = Timeline(post=post_batch, group=group, ranks=64)  # 16 nodes of 4 GPUs
    t.boot(at=0)
    t.steps(first=0, count=30, at=1)
    t.heartbeats(until=30)
    t.send()
    return t


def test_a_fleet_silence_holds_the_node_down_incidents_of_the_groups_on_its_nodes(
    post_batch, client, cast
):
    """Every node of a 64-rank job goes quiet together with the path to Faultline. Each
    group's diagnosis finds each of its nodes down: 16 critical node_down incidents per
    job, each paging, each blaming a node that may be fine. They name the fleet silence
    as their root incident, whether they opened before the sweep saw it or after, and
    only the fleet incident pages while it is open. Once it resolves, what is still open
    pages as usual."""
    from console import pipeline
    from console.models import EscalationPolicy, NotificationChannel

    NotificationChannel.objects.create(name="hook", kind="webhook", url="https://pager.test/h")
    EscalationPolicy.objects.create(
        name="all", severities=["critical"], steps=[{"delay_s": 0, "channels": ["hook"]}]
    )
    first = _silent_job(post_batch, "job-a")
    _report(post_batch, [f"spare-{i}" for i in range(4)])
    before = first.diagnose(at=125)  # before the sweep: nothing to link to yet
    quiet = sorted({first.node(r) for r in range(first.ranks)})
    assert sorted(i.subject for i in before) == sorted(f"node:{n}" for n in quiet)
    assert {i.kind for i in before} == {"node_down"}
    Node.objects.filter(name__in=quiet).update(last_seen=timezone.now() - timedelta(minutes=1))

    assert sorted(pipeline.mark_silent_nodes(now=timezone.now())) == quiet
    fleet = Incident.objects.get(kind="fleet_silent")
    second = _silent_job(post_batch, "job-b")  # the same nodes; diagnosed after the sweep
    Node.objects.filter(name__in=quiet).update(last_seen=timezone.now() - timedelta(minutes=1))
    after = second.diagnose(at=125)
    groups = Incident.objects.filter(group__isnull=False)
    assert groups.count() == 32 and {i.kind for i in after} == {"node_down"}
    assert set(groups.values_list("root_incident", flat=True)) == {fleet.pk}

    soon = timezone.now() + timedelta(minutes=1)  # the diagnoses ran at the timeline's +125 s
    paged = {incident for incident, *_ in actions.schedule_due(now=soon)}
    assert paged == {fleet.pk}
    client.force_login(cast["viewer"])  # the group incident's page says what it is part of
    page = client.get(f"/incidents/{after[0].pk}/").content.decode()
    assert f'Part of <a href="/incidents/{fleet.pk}/">#{fleet.pk}</a> (<code>fleet_silent' in page
    assert actions.schedule_due(now=soon + timedelta(seconds=30)) == []

    # The path is back for 14 of the 16 nodes: the fleet silence resolves (2 quiet nodes
    # are no mass), and the group incidents still open page now.
    _report(post_batch, quiet[2:])
    pipeline.mark_silent_nodes(now=timezone.now())
    fleet.refresh_from_db()
    assert fleet.state == "resolved"
    paged = {incident for incident, *_ in actions.schedule_due(now=soon + timedelta(minutes=1))}
    assert paged == {fleet.pk, *groups.exclude(state="resolved").values_list("pk", flat=True)}
    assert len(paged) == 33  # the fleet's resolve, and each group incident's first page


# -- a GPU's return, repair evidence, repeat faults across GPUs, a silent node's groups ------


def _release(cast, gpu: str) -> None:
    """A release_gpu of `gpu` that its agent reports done."""
    out = actions.propose_action(
        kind="release_gpu", target=f"gpu:{gpu}", reason="back to work", actor=cast["operator"],
        now=timezone.now(),
    )  # fmt: skip
    Action.objects.filter(pk=out.action.pk).update(state="dispatched")
    actions.record_action_result(
        action_id=out.action.pk, node=_node(), status="succeeded", exit_code=0, output="",
        now=timezone.now(), outcome={"state": "applied"},
    )  # fmt: skip


def test_releasing_a_healthy_gpu_never_returns_a_node_with_a_fault_of_its_own(post_batch, cast):
    """A node-level Xid 79 (no GPU named, as from Alertmanager) latches the node; Faultline
    drained it and a repeat flag is on it. Releasing one of its GPUs, healthy all along,
    must leave the node faulted, cordoned, flagged and its incident open."""
    _post(post_batch, [_sample()])
    actions.latch_fault(node_id=_node().pk, event="xid", code=79, actor="alertmanager",
                        now=timezone.now(), detail="node-level")  # fmt: skip
    Node.objects.filter(name=NODE).update(cordoned=True, replace_flagged=True)
    (incident,) = _node_incidents()
    assert incident.fingerprint == f"hardware:{NODE}"
    _release(cast, GPU)
    node = _node()
    assert (node.lifecycle, node.cordoned, node.replace_flagged) == ("faulted", True, True)
    assert node.repair_needed == "node_reboot"
    assert [i.pk for i in _node_incidents()] == [incident.pk]
    assert _gpu().lifecycle == "healthy"


def test_releasing_a_repaired_gpu_returns_that_gpu_and_its_incident_only(post_batch, cast):
    _post(post_batch, [_sample(), _xid(48)])
    reset = {"kind": "device_event", "gpu": GPU, "event": "gpu_reset", "detail": "nvidia-smi -r"}
    _post(post_batch, [reset])
    Device.objects.filter(uuid=GPU).update(isolated=True)
    _release(cast, GPU)
    gpu, node = _gpu(), _node()
    assert (gpu.lifecycle, gpu.isolated) == ("healthy", False)
    assert node.lifecycle == "validating"  # the node returns by its own uncordon
    assert _node_incidents() == []  # the GPU's incident resolved


def test_a_new_boot_id_alone_does_not_validate_a_gpu_that_has_not_reported_since(post_batch):
    """A node "reboots" (a new boot id) but its faulted GPU reports nothing after: no
    return is proposed however long the window runs. Once the GPU reports, it is."""
    _post(post_batch, [_sample(), _xid(79)])
    heartbeat = {"kind": "heartbeat", "uptime_s": 3.0}
    _post(post_batch, [heartbeat], boot="boot-b")
    _post(post_batch, [heartbeat], boot="boot-b")
    assert _gpu().lifecycle == "validating"
    assert actions.propose_returns(now=timezone.now() + timedelta(minutes=11)) == []
    assert actions.propose_returns(now=timezone.now() + timedelta(days=1)) == []
    _post(post_batch, [_sample()], boot="boot-b")
    assert len(actions.propose_returns(now=timezone.now() + timedelta(minutes=11))) == 1


def test_faults_spread_over_a_nodes_gpus_flag_the_node(post_batch):
    """Three faults in the week, each on another GPU: no GPU repeats, the node does."""
    start = timezone.now()
    for i in range(3):
        with time_machine.travel(start + timedelta(days=i), tick=True):
            gpu = f"GPU-spare-1-000{i}"
            sample = {**_sample(), "gpu": gpu, "index": i}
            xid = {**_xid(48), "gpu": gpu}
            _post(post_batch, [sample, xid], boot=f"boot-{i}")
            _reboot(post_batch, f"boot-{i + 1}")
            for aid in actions.propose_returns(now=timezone.now() + timedelta(minutes=11)):
                Action.objects.filter(pk=aid).update(state="dispatched")
                actions.record_action_result(
                    action_id=aid, node=_node(), status="succeeded", exit_code=0, output="",
                    now=timezone.now(), outcome={"state": "applied"},
                )  # fmt: skip
            assert _node().replace_flagged is (i == 2), i
    assert not Device.objects.filter(replace_flagged=True).exists()
    flagged = AuditLog.objects.get(verb="node.flagged_for_replacement")
    assert "3 faults on the node's GPUs in 7 days" in flagged.reason


def test_a_silent_node_hosting_20_young_groups_pages_once(post_batch):
    """A node hosting ranks of 20 young jobs stops reporting: each job's diagnosis finds it
    down. Its own incident (critical, since jobs are down there) pages; the 20 group
    incidents link to it and wait for its page, whichever ran first."""
    from console import pipeline
    from console.models import EscalationPolicy, NotificationChannel
    from tests.server.scenarios.timeline import Timeline

    NotificationChannel.objects.create(name="hook", kind="webhook", url="https://pager.test/h")
    EscalationPolicy.objects.create(
        name="all", severities=["critical"], steps=[{"delay_s": 0, "channels": ["hook"]}]
    )
    jobs = []
    for g in range(20):
        t = Timeline(post=post_batch, group=f"young-{g}", ranks=1)
        t.boot(at=0)
        t.steps(first=0, count=30, at=1)
        t.heartbeats(until=30)
        t.send()
        jobs.append(t)
    _report(post_batch, [f"other-{i}" for i in range(3)])
    for t in jobs[:5]:  # some diagnosed before the sweep saw the silence
        t.diagnose(at=125)
    Node.objects.filter(name="node-0").update(last_seen=timezone.now() - timedelta(minutes=1))
    pipeline.mark_silent_nodes(now=timezone.now())
    for t in jobs[5:]:
        t.diagnose(at=125)
    silent = Incident.objects.get(kind="node_silent", node__name="node-0")
    groups = Incident.objects.filter(group__isnull=False)
    assert groups.count() == 20 and {i.kind for i in groups} == {"node_down"}
    assert set(groups.values_list("root_incident", flat=True)) == {silent.pk}
    silent.refresh_from_db()
    assert silent.severity == "critical"
    soon = timezone.now() + timedelta(minutes=1)
    paged = {incident for incident, *_ in actions.schedule_due(now=soon)}
    assert paged == {silent.pk}
