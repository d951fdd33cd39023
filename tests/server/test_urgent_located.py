"""The urgent lane judges the node that reported the event, not the world.

At 16k ranks a full pass is seconds and the lane's own process held no live state, so its
first run of a big group was a full read: an Xid's incident took 8-12 s
(bench/detect.py --ranks 16384). The lane now runs the same engine over the reporting
node's GPUs and ranks (console.pipeline.diagnose_urgent) and writes only the root causes
located there (console.actions.record_located); the ordinary pass owns the rest.
Real batches through POST /api/v1/ingest, the real engine and database.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from console import pipeline, scheduling, tasks
from console.actions.diagnosis import ADVICE_PENDING
from console.models import Action, ConsistencyGroup, Incident
from tests.conftest import iso, make_batch
from tests.server.test_pipeline import GROUP, _history

pytestmark = pytest.mark.django_db


def _xid(post_batch, gpu: str, node: str, at: datetime) -> None:
    event = {"kind": "device_event", "gpu": gpu, "event": "xid", "code": 79, "ts": iso(at)}
    assert post_batch(make_batch([event], node=node, sent_at=at)).status_code == 202


def _waiting(post_batch, *, ranks: int, per_node: int, lost: int, at: datetime) -> None:
    """Every rank but the lost GPU's blocked in the next all_reduce, as the job hangs."""
    for node_index in range(ranks // per_node):
        windows = [
            {"kind": "collective", "group": GROUP, "generation": 1, "rank": rank, "ts": iso(at),
             "entries": [{"seq": 21, "pg": "0", "op": "all_reduce", "numel": 1024,
                          "dtype": "bfloat16", "state": "started", "started_ts": iso(at)}]}
            for rank in range(node_index * per_node, (node_index + 1) * per_node)
            if rank != lost
        ]  # fmt: skip
        post_batch(make_batch(windows, node=f"node-{node_index}", sent_at=at))


def _group_incidents() -> list[Incident]:
    return list(Incident.objects.filter(group__isnull=False).order_by("pk"))


def test_the_urgent_lane_opens_the_xid_from_its_node_alone_and_the_full_pass_completes_it(
    post_batch,
):
    start = datetime.now(UTC) - timedelta(seconds=40)
    _history(post_batch, ranks=8, per_node=4, start=start, steps=20)
    xid_at = start + timedelta(seconds=21)
    _xid(post_batch, "GPU-node-1-1", "node-1", xid_at)
    _waiting(post_batch, ranks=8, per_node=4, lost=5, at=xid_at)
    now = xid_at + timedelta(seconds=10)
    summary_before = ConsistencyGroup.objects.get(name=GROUP).summary

    tasks.diagnose_group(GROUP, scheduling.URGENT, "node-1")

    (incident,) = _group_incidents()
    assert (incident.kind, incident.subject) == ("xid", "gpu:GPU-node-1-1")
    # Not restart-safe until the full pass has judged the whole group; no proposal yet.
    assert incident.recovery == ADVICE_PENDING
    assert not Action.objects.exists()
    # Only node-1's ranks were read: no symptom of node-0's ranks, no group summary.
    assert all("node-0" not in str(a.evidence) for a in incident.alerts.all())
    assert ConsistencyGroup.objects.get(name=GROUP).summary == summary_before

    pipeline.diagnose(group_name=GROUP, now=now)
    (same,) = _group_incidents()
    assert same.pk == incident.pk  # one incident: the full pass took it over
    assert same.recovery != ADVICE_PENDING and same.recovery["reason"]
    full_symptoms = same.symptom_count
    active = set(same.alerts.filter(active=True).values_list("finding_id", flat=True))
    assert full_symptoms >= 3  # node-0's ranks wait on the lost GPU too

    # A late urgent run (another event on the node) keeps what the full pass wrote.
    tasks.diagnose_group(GROUP, scheduling.URGENT, "node-1")
    (again,) = _group_incidents()
    assert again.recovery == same.recovery
    assert again.symptom_count == full_symptoms
    assert set(again.alerts.filter(active=True).values_list("finding_id", flat=True)) == active


def test_a_full_pass_that_read_before_the_urgent_write_does_not_settle_it(post_batch):
    start = datetime.now(UTC) - timedelta(seconds=40)
    _history(post_batch, ranks=4, per_node=4, start=start, steps=20)
    xid_at = start + timedelta(seconds=21)
    _xid(post_batch, "GPU-node-0-2", "node-0", xid_at)
    pipeline.diagnose_urgent(group_name=GROUP, node="node-0", now=xid_at + timedelta(seconds=2))
    (incident,) = _group_incidents()
    # A full pass whose clock (its read) is older than the urgent write: it cannot have seen
    # the Xid's evidence as the lane did, so it leaves the incident and its alerts alone.
    older = xid_at + timedelta(seconds=1)
    pipeline.diagnose(group_name=GROUP, now=older)
    incident.refresh_from_db()
    assert incident.clear_since is None
    assert incident.alerts.filter(active=True).exists()


def test_without_a_node_that_reported_anything_the_lane_runs_the_full_pass(post_batch):
    start = datetime.now(UTC) - timedelta(seconds=40)
    _history(post_batch, ranks=4, per_node=4, start=start, steps=20)
    xid_at = start + timedelta(seconds=21)
    _xid(post_batch, "GPU-node-0-2", "node-0", xid_at)
    # Older than the lane's scope (a minute) and no node named: nothing to locate, so the
    # run is the whole group's, with its advice.
    pipeline.diagnose_urgent(group_name=GROUP, node=None, now=xid_at + timedelta(minutes=5))
    (incident,) = [i for i in _group_incidents() if i.kind == "xid"]
    assert incident.recovery != ADVICE_PENDING
    assert ConsistencyGroup.objects.get(name=GROUP).summary.get("diagnosed_at")


def test_the_lane_records_nothing_located_elsewhere(post_batch):
    """A node that reported no urgent event is not judged by the lane: a root cause there
    (node-0's GPU thermal-throttling) waits for the full pass, while node-1's Xid opens."""
    start = datetime.now(UTC) - timedelta(seconds=40)
    _history(post_batch, ranks=8, per_node=4, start=start, steps=20)
    at = start + timedelta(seconds=21)
    hot = {"kind": "device_sample", "gpu": "GPU-node-0-0", "index": 0, "temp_c": 93.0,
           "throttle_reasons": ["hw_thermal_slowdown"], "ts": iso(at)}  # fmt: skip
    post_batch(make_batch([hot], node="node-0", sent_at=at))
    _xid(post_batch, "GPU-node-1-3", "node-1", at)
    pipeline.diagnose(group_name=GROUP, now=at)  # the ordinary pass sees both
    kinds = {(i.kind, i.subject) for i in _group_incidents()}
    assert ("thermal_throttle", "gpu:GPU-node-0-0") in kinds, kinds
    Incident.objects.all().delete()
    pipeline.diagnose_urgent(group_name=GROUP, node="node-1", now=at + timedelta(seconds=1))
    assert [(i.kind, i.subject) for i in _group_incidents()] == [("xid", "gpu:GPU-node-1-3")]
