"""Provisional and settled verdicts through real ingest and the pipeline.

An incident opens from the first evidence; until it settles (one agent send interval
after it opened: Incident.verdict_settled) a later record may revise its root cause in
place, and nothing is proposed from it. The case that needed it: a survivor's gloo error
arrives (and is stamped) before the launcher's report of the rank killed with its node.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import time_machine

from console import pipeline
from console.models import VERDICT_SETTLES_AFTER, Action, ConsistencyGroup, Incident
from tests.server.scenarios.timeline import HEALTHY_S, Timeline

pytestmark = pytest.mark.django_db

KILLED, SURVIVOR = 5, 0


def _job(post_batch) -> Timeline:
    t = Timeline(post=post_batch, start=datetime.now(UTC) - timedelta(seconds=HEALTHY_S + 1))
    t.boot(at=0)
    t.good_checkpoint("ckpt-10", at=10.5, step=10)
    t.steps(first=0, count=HEALTHY_S, at=1)
    t.heartbeats(until=HEALTHY_S + 60)
    t.send()
    return t


def _exit(t: Timeline, rank: int, at: float, **fields) -> None:
    t.add(t.node(rank), t.at(at), {"kind": "process", "group": t.group, "generation": 1,
                                   "rank": rank, "event": "exited", "gpu": t.gpu(rank),
                                   **fields})  # fmt: skip


def _error(t: Timeline, at: float) -> None:
    _exit(t, SURVIVOR, at, exit_code=1, reason="exception", error_type="RuntimeError")


def _kill(t: Timeline, at: float) -> None:
    _exit(t, KILLED, at, exit_code=137, signal=9, reason="killed")


def _open(t: Timeline) -> list[Incident]:
    return list(Incident.objects.filter(group__name=t.group).exclude(state="resolved"))


def _pass(t: Timeline, at: float) -> list[Incident]:
    t.send()
    pipeline.diagnose(group_name=t.group, now=t.at(at))
    return _open(t)


@pytest.mark.parametrize("kill_stamped", [-0.4, 0.6], ids=["kill-stamped-first", "error-first"])
def test_the_survivors_error_is_revised_into_the_death_that_arrives_after_it(
    post_batch, client, cast, kill_stamped
):
    t = _job(post_batch)
    err_at = HEALTHY_S + 1.0
    _error(t, err_at)
    (first,) = _pass(t, err_at + 0.3)
    assert (first.kind, first.subject) == ("exception", f"rank:{t.group}/{SURVIVOR}")
    assert not first.verdict_settled(t.at(err_at + 0.3))

    _kill(t, err_at + kill_stamped)  # reaches the service a moment later
    (revised,) = _pass(t, err_at + 1.5)
    assert revised.pk == first.pk
    assert (revised.kind, revised.subject) == ("process_exit", f"rank:{t.group}/{KILLED}")
    (change,) = revised.timeline["revised"]
    assert change["from"]["kind"] == "exception" and change["to"]["kind"] == "process_exit"
    alerts = {a.kind: a for a in revised.alerts.all()}
    assert (alerts["exception"].role, alerts["exception"].caused_by) == (
        "symptom",
        [revised.root_cause["id"]],
    )

    client.force_login(cast["viewer"])
    with time_machine.travel(revised.opened_at + timedelta(seconds=1), tick=False):
        body = client.get(f"/api/v1/incidents/{revised.pk}/").json()
    assert body["verdict"] == "provisional"
    assert body["settles_at"].startswith(revised.settles_at.isoformat()[:19])
    with time_machine.travel(revised.settles_at, tick=False):
        assert client.get(f"/api/v1/incidents/{revised.pk}/").json()["verdict"] == "settled"


def test_a_settled_verdict_is_not_revised_a_late_death_opens_its_own(post_batch):
    t = _job(post_batch)
    err_at = HEALTHY_S + 1.0
    _error(t, err_at)
    (first,) = _pass(t, err_at + 0.3)
    settled = (first.settles_at - t.start).total_seconds() + 0.5
    _pass(t, settled)  # nothing new: the verdict settles as it is
    _kill(t, err_at + 0.5)  # a spool replay after the settle window
    incidents = _pass(t, settled + 1)
    by_kind = {i.kind: i for i in incidents}
    assert by_kind["exception"].pk == first.pk and "revised" not in by_kind["exception"].timeline
    assert by_kind["exception"].clear_since is not None  # it clears and resolves as before
    assert by_kind["process_exit"].pk != first.pk


def test_two_provisional_incidents_folding_into_one_cause_become_one(post_batch):
    t = _job(post_batch)
    err_at = HEALTHY_S + 1.0
    _error(t, err_at)
    # Another survivor stamped at the same instant: two roots until the death is known.
    _exit(t, 2, err_at, exit_code=1, reason="exception", error_type="RuntimeError")
    before = _pass(t, err_at + 0.3)
    assert sorted(i.kind for i in before) == ["exception", "exception"]
    _kill(t, err_at - 0.2)
    (after,) = _pass(t, err_at + 1.5)
    assert after.kind == "process_exit" and after.pk == min(i.pk for i in before)
    merged = Incident.objects.get(pk=max(i.pk for i in before))
    assert merged.state == "resolved" and merged.timeline["merged_into"] == after.pk


def test_proposals_wait_for_the_settled_verdict_and_the_pass_is_due_then(post_batch):
    t = _job(post_batch)
    ConsistencyGroup.objects.filter(name=t.group).update(scheduler_job="77")
    at = HEALTHY_S + 1.0
    t.add(t.node(KILLED), t.at(at), {"kind": "device_event", "gpu": t.gpu(KILLED),
                                     "event": "xid", "code": 79})  # fmt: skip
    t.send()
    due = pipeline.diagnose(group_name=t.group, now=t.at(at + 0.2))
    (incident,) = _open(t)
    assert incident.kind == "xid" and not Action.objects.exists()
    # A pass is asked for no later than the moment it settles.
    assert due is not None and due <= incident.opened_at + VERDICT_SETTLES_AFTER
    assert pipeline._next_settle(t.group, t.at(at + 0.2)) == incident.settles_at
    pipeline.diagnose(group_name=t.group, now=incident.settles_at)
    assert Action.objects.filter(incident=incident).exists()
