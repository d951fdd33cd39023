"""Ingest → snapshot → engine → incidents, on the real database."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from console import pipeline
from console.models import Incident
from tests.conftest import iso, make_batch

pytestmark = pytest.mark.django_db

GROUP = "llm-a"


def _history(post_batch, *, ranks: int, per_node: int, start: datetime, steps: int) -> None:
    """Healthy steps for every rank, each node's agent reporting its own ranks."""
    for node_index in range(ranks // per_node):
        node = f"node-{node_index}"
        records = []
        for local in range(per_node):
            rank = node_index * per_node + local
            gpu = f"GPU-{node}-{local}"
            records.append(
                {
                    "kind": "process",
                    "group": GROUP,
                    "generation": 1,
                    "rank": rank,
                    "event": "started",
                    "pid": 1000 + rank,
                    "gpu": gpu,
                    "ts": iso(start),
                }
            )
            records.append(
                {
                    "kind": "device_sample",
                    "gpu": gpu,
                    "index": local,
                    "temp_c": 60.0,
                    "ts": iso(start),
                }
            )
            for s in range(steps):
                ts = start + timedelta(seconds=s)
                records.append(
                    {
                        "kind": "step",
                        "group": GROUP,
                        "generation": 1,
                        "rank": rank,
                        "step": s,
                        "tokens": 2048,
                        "duration_ms": 1000.0,
                        "phases": {"compute": 700.0, "collective": 250.0, "input": 50.0},
                        "loss": 2.5,
                        "ts": iso(ts),
                    }
                )
        post_batch(make_batch(records, node=node, sent_at=start + timedelta(seconds=steps)))


def test_it_names_one_xid_root_cause_and_folds_the_waiting_ranks_under_it(post_batch):
    start = datetime.now(UTC) - timedelta(seconds=40)
    _history(post_batch, ranks=8, per_node=4, start=start, steps=20)
    xid_at = start + timedelta(seconds=21)
    post_batch(
        make_batch(
            [
                {
                    "kind": "device_event",
                    "gpu": "GPU-node-1-1",
                    "event": "xid",
                    "code": 79,
                    "ts": iso(xid_at),
                }
            ],
            node="node-1",
            sent_at=xid_at,
        )
    )
    for node_index in range(2):
        node = f"node-{node_index}"
        windows = []
        for local in range(4):
            rank = node_index * 4 + local
            if rank == 5:
                continue  # the rank on the lost GPU never enters seq 21
            windows.append(
                {
                    "kind": "collective",
                    "group": GROUP,
                    "generation": 1,
                    "rank": rank,
                    "ts": iso(xid_at),
                    "entries": [
                        {
                            "seq": 21,
                            "pg": "0",
                            "op": "all_reduce",
                            "numel": 1024,
                            "dtype": "bfloat16",
                            "state": "started",
                            "started_ts": iso(xid_at),
                        }
                    ],
                }
            )
        post_batch(make_batch(windows, node=node, sent_at=xid_at))

    pipeline.diagnose(group_name=GROUP, now=xid_at + timedelta(seconds=10))

    # The GPU's fault is the node's own (fleet-scope) incident; the group's names it.
    (node_incident,) = Incident.objects.filter(group=None, node__name="node-1")
    incidents = list(Incident.objects.filter(group__isnull=False))
    assert len(incidents) == 1, [i.summary for i in incidents]
    incident = incidents[0]
    assert incident.kind == "xid"
    assert incident.subject == "gpu:GPU-node-1-1"
    assert incident.root_incident == node_incident
    assert incident.recovery["auto_restart_safe"] in (True, False)
    symptoms = incident.alerts.filter(role="symptom")
    assert symptoms.count() >= 7 - 1
    assert {a.kind for a in symptoms} <= {
        "collective_timeout",
        "rank_hang",
        "group_stall",
        "process_exit",
        "straggler",
    }


def test_it_is_idempotent_when_diagnosis_runs_twice(post_batch):
    start = datetime.now(UTC) - timedelta(seconds=30)
    _history(post_batch, ranks=4, per_node=4, start=start, steps=10)
    post_batch(
        make_batch(
            [
                {
                    "kind": "step",
                    "group": GROUP,
                    "generation": 1,
                    "rank": 0,
                    "step": 11,
                    "loss": "NaN",
                    "tokens": 10,
                    "ts": iso(start + timedelta(seconds=11)),
                }
            ],
            node="node-0",
            sent_at=start + timedelta(seconds=11),
        )
    )
    now = start + timedelta(seconds=12)
    pipeline.diagnose(group_name=GROUP, now=now)
    pipeline.diagnose(group_name=GROUP, now=now)
    incident = Incident.objects.get()
    assert incident.kind == "nan_loss"
    assert incident.recovery["auto_restart_safe"] is False


def test_it_resolves_an_incident_after_its_root_cause_stays_clear(post_batch):
    start = datetime.now(UTC) - timedelta(seconds=30)
    _history(post_batch, ranks=4, per_node=4, start=start, steps=10)
    post_batch(
        make_batch(
            [
                {
                    "kind": "step",
                    "group": GROUP,
                    "generation": 1,
                    "rank": 0,
                    "step": 11,
                    "loss": "NaN",
                    "tokens": 10,
                    "ts": iso(start + timedelta(seconds=11)),
                }
            ],
            node="node-0",
            sent_at=start + timedelta(seconds=11),
        )
    )
    pipeline.diagnose(group_name=GROUP, now=start + timedelta(seconds=12))
    # A new generation restarts cleanly from a checkpoint: the NaN is no longer current.
    restart = start + timedelta(seconds=13)
    post_batch(
        make_batch(
            [
                {
                    "kind": "transition",
                    "group": GROUP,
                    "generation": 2,
                    "to_state": "running",
                    "restart_count": 1,
                    "ts": iso(restart),
                }
            ],
            node="node-0",
            sent_at=restart,
        )
    )
    later = restart + timedelta(seconds=1)
    pipeline.diagnose(group_name=GROUP, now=later)
    pipeline.diagnose(group_name=GROUP, now=later + timedelta(seconds=30))
    incident = Incident.objects.get()
    assert incident.state == "resolved"
    assert incident.resolved_at is not None
