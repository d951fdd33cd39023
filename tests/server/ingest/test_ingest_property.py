"""Property: whatever a broken or hostile agent posts, ingest never answers 5xx, and a
rejected batch stores nothing (every ingest table keeps its row count)."""

from __future__ import annotations

import copy
import itertools
import json
from datetime import UTC, datetime
from typing import Any

import pytest
from django.test import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from console.models import ConsistencyGroup, Device, Rank
from ingest import models as m
from ingest.auth import issue_token
from tests.conftest import iso

pytestmark = pytest.mark.django_db

TABLES = [
    m.BatchReceipt, m.AgentState, m.DeviceSample, m.DeviceEvent, m.StepRecord,
    m.CollectiveWindow, m.ProcessRecord, m.CheckpointRecord, m.TransitionRecord,
    m.ServingWindow, m.ContractViolation, ConsistencyGroup, Device, Rank,
]  # fmt: skip
_seq = itertools.count(1)


def valid_records() -> list[dict[str, Any]]:
    ts = iso(datetime.now(UTC))
    g = {"group": "prop-job", "generation": 1}
    return [
        {"kind": "heartbeat", "ts": ts, "uptime_s": 12.5, "spool_depth": 0, "dropped": 0},
        {"kind": "device_sample", "ts": ts, "gpu": "GPU-a", "index": 0, "temp_c": 60.0,
         "throttle_reasons": ["sw_power_cap"], "ecc_dbe": 0},
        {"kind": "device_event", "ts": ts, "gpu": "GPU-a", "event": "xid", "code": 79,
         "detail": "fell off the bus"},
        {"kind": "transition", "ts": ts, **g, "to_state": "running", "restart_count": 0,
         "topology": {"dp": 2, "tp": 1, "pp": 1, "ep": 1}, "model_version": "m1"},
        {"kind": "step", "ts": ts, **g, "rank": 0, "step": 5, "tokens": 4096,
         "duration_ms": 850.0, "phases": {"compute": 600.0, "collective": 200.0},
         "loss": "NaN", "overflow": False},
        {"kind": "collective", "ts": ts, **g, "rank": 0,
         "entries": [{"seq": 9, "op": "allreduce", "numel": 1024, "dtype": "bf16",
                      "state": "started", "started_ts": ts}]},
        {"kind": "process", "ts": ts, **g, "rank": 0, "event": "exited", "exit_code": 1,
         "reason": "oom", "error_type": "OutOfMemoryError"},
        {"kind": "checkpoint", "ts": ts, **g, "checkpoint_id": "ck-5", "phase": "committed",
         "step": 5, "manifest": {"shards": [{"path": "s0", "bytes": 10, "sha256": "a" * 64}],
                                 "total_bytes": 10, "format": "dcp"}},
        {"kind": "serving", "ts": ts, "group": "prop-serve", "worker": "w0", "ready": True,
         "window": {"seconds": 10.0, "requests": 5, "slo_met": 5, "ttft_ms_p99": 80.0}},
    ]  # fmt: skip


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.sampled_from([-1, 2**31, 2**63 - 1, 2**63, 2**64])  # column edges
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from(["NaN", "Infinity", "-Infinity", "", "2026-13-45T99:00:00Z"])
    | st.text(max_size=300),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=6,
)


@st.composite
def mutated_batches(draw: st.DrawFn) -> dict[str, Any]:
    records = valid_records()
    batch = {
        "agent": {"id": "agent-prop-0001", "node": "node-prop", "version": "test"},
        "seq": next(_seq),
        "sent_at": iso(datetime.now(UTC)),
        "records": records,
    }
    for _ in range(draw(st.integers(min_value=0, max_value=3))):
        op = draw(st.sampled_from(["set", "delete", "add", "drop_record", "duplicate", "top"]))
        rec = draw(st.sampled_from(records)) if records else {}
        if op == "set" and rec:
            rec[draw(st.sampled_from(sorted(rec)))] = draw(json_values)
        elif op == "delete" and rec:
            rec.pop(draw(st.sampled_from(sorted(rec))))
        elif op == "add" and rec:
            rec[draw(st.text(min_size=1, max_size=12))] = draw(json_values)
        elif op == "drop_record" and records:
            records.remove(rec)
        elif op == "duplicate" and records:
            records.append(copy.deepcopy(rec))
        elif op == "top":
            key = draw(st.sampled_from(["seq", "sent_at", "agent", "records"]))
            batch[key] = draw(json_values)
    return batch


def _counts() -> list[int]:
    return [model.objects.count() for model in TABLES]


@settings(
    max_examples=120,
    deadline=None,
    # The db fixture's transaction is shared by examples on purpose: each example compares
    # counts before and after itself, so state carried between examples is harmless.
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(batch=mutated_batches())
def test_it_never_answers_5xx_and_stores_nothing_of_a_rejected_batch(batch, django_settings):
    client = Client()
    token = issue_token(node_name="node-prop")
    before = _counts()
    response = client.post(
        "/api/v1/ingest",
        data=json.dumps(batch),
        content_type="application/json",
        headers={"Authorization": f"Bearer {token}"},
    )
    assert response.status_code < 500, response.content
    if response.status_code != 202:
        assert _counts() == before, response.content
        assert "error" in response.json()


@pytest.fixture
def django_settings(settings):
    settings.INGEST_RATE_PER_MIN = 1_000_000  # this test posts far faster than any agent
    return settings
