"""Retention: receipts pruned behind a high-water mark, events and rollups by age.

Receipts are the contract's idempotency key; once pruned, the agent's watermark and gap
list must still tell a replay (202, duplicate, nothing stored twice) from a late batch that
fills a gap (stored). Everything goes through the real ingest endpoint.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from console.choices import GroupState
from console.models import ConsistencyGroup
from ingest import retention
from ingest.models import (
    AgentState,
    BatchReceipt,
    CheckpointRecord,
    DeviceEvent,
    DeviceRollup,
    StepRecord,
    TransitionRecord,
)
from tests.conftest import make_batch

pytestmark = pytest.mark.django_db
AGENT = "agent-retention-0001"


def _post(post_batch, seq: int, *, agent: str = AGENT, node: str = "node-1", step: int = 0):
    record = {"kind": "step", "group": f"job-{node}", "generation": 0, "rank": 0,
              "step": step or seq, "tokens": 1}  # fmt: skip
    response = post_batch(make_batch([record], seq=seq, agent_id=agent, node=node))
    assert response.status_code == 202, response.content
    return response.json()


def _steps(node: str = "node-1") -> list[int]:
    return sorted(StepRecord.objects.filter(node__name=node).values_list("step", flat=True))


def test_a_replay_of_a_pruned_batch_is_a_duplicate_and_a_late_gap_fill_is_stored(post_batch):
    for seq in (1, 2, 3, 6):  # 4 and 5 are a gap
        _post(post_batch, seq)
    _post(post_batch, 1, agent="agent-other-0001", node="node-2")
    removed = retention.prune_receipts(before=datetime.now(UTC) + timedelta(hours=1))
    assert removed == 5 and BatchReceipt.objects.count() == 0
    state = AgentState.objects.get(agent_id=AGENT)
    assert (state.receipts_pruned_through, state.gap_ranges) == (6, [[4, 5]])

    for seq in (2, 6):  # their receipts are gone: the watermark answers
        assert _post(post_batch, seq)["duplicate"] is True
    assert _steps() == [1, 2, 3, 6]
    late = _post(post_batch, 4)  # fills the gap: stored
    assert late["duplicate"] is False
    assert _post(post_batch, 4)["duplicate"] is True  # its own receipt now
    retention.prune_receipts(before=datetime.now(UTC) + timedelta(hours=1))
    assert _post(post_batch, 4)["duplicate"] is True  # and the closed gap, once pruned
    assert _post(post_batch, 7)["duplicate"] is False  # above the watermark: new
    assert _steps() == [1, 2, 3, 4, 6, 7]
    state.refresh_from_db()
    assert (state.duplicates, state.gaps, state.gap_ranges, state.last_seq) == (4, 1, [[5, 5]], 7)
    # The other agent's watermark is its own.
    assert _post(post_batch, 2, agent="agent-other-0001", node="node-2")["duplicate"] is False


def test_only_receipts_older_than_the_cutoff_are_pruned(post_batch):
    for seq in range(1, 6):
        _post(post_batch, seq)
    now = datetime.now(UTC)
    old = list(BatchReceipt.objects.order_by("id").values_list("id", flat=True)[:3])
    BatchReceipt.objects.filter(id__in=old).update(received_at=now - timedelta(days=2))
    assert retention.prune_receipts(before=now - timedelta(hours=24), batch=2) == 3
    assert sorted(BatchReceipt.objects.values_list("seq", flat=True)) == [4, 5]
    assert AgentState.objects.get(agent_id=AGENT).receipts_pruned_through == 3
    assert _post(post_batch, 3)["duplicate"] is True
    assert _post(post_batch, 5)["duplicate"] is True
    assert _steps() == [1, 2, 3, 4, 5]


def test_the_hourly_run_prunes_receipts_rollups_and_events_past_their_own_retention(post_batch):
    now = datetime.now(UTC)
    for seq, node in ((1, "node-1"), (1, "node-2")):
        record = {"kind": "checkpoint", "group": f"job-{node}", "generation": 0,
                  "checkpoint_id": "c1", "step": 1, "phase": "committed"}  # fmt: skip
        transition = {"kind": "transition", "group": f"job-{node}", "generation": 0,
                      "to_state": "running"}  # fmt: skip
        batch = make_batch([transition, record], seq=seq, node=node, agent_id=f"a-{node}-001")
        assert post_batch(batch).status_code == 202
    post_batch(make_batch([{"kind": "device_event", "gpu": "GPU-1", "event": "xid", "code": 79}]))
    ConsistencyGroup.objects.filter(name="job-node-2").update(state=GroupState.COMPLETED)
    long_ago = now - timedelta(days=120)
    for model in (CheckpointRecord, TransitionRecord, DeviceEvent):
        model.objects.update(ts=long_ago)
    node = DeviceEvent.objects.get().node
    DeviceRollup.objects.create(node=node, minute=long_ago, samples=1, gpus=1, throttled_gpus=0)
    DeviceRollup.objects.create(node=node, minute=now - timedelta(days=30), samples=1, gpus=1,
                                throttled_gpus=0)  # fmt: skip
    BatchReceipt.objects.update(received_at=now - timedelta(days=2))

    removed = retention.run(now=now, keep_days=14)

    assert removed["ingest_batchreceipt"] == 3 and BatchReceipt.objects.count() == 0
    assert removed["ingest_deviceevent"] == 1
    assert removed["ingest_devicerollup"] == 1 and DeviceRollup.objects.count() == 1
    # The live group keeps its old checkpoints and transitions; the finished one does not.
    assert list(CheckpointRecord.objects.values_list("group__name", flat=True)) == ["job-node-1"]
    assert list(TransitionRecord.objects.values_list("group__name", flat=True)) == ["job-node-1"]


def test_events_and_rollups_are_never_kept_shorter_than_raw_telemetry(post_batch):
    now = datetime.now(UTC)
    post_batch(make_batch([{"kind": "device_event", "gpu": "GPU-1", "event": "xid", "code": 79}]))
    DeviceEvent.objects.update(ts=now - timedelta(days=10))
    policy = retention.Policy(keep_days=14, event_days=1, rollup_days=1)
    assert retention.run(now=now, keep_days=14, policy=policy)["ingest_deviceevent"] == 0
    policy = retention.Policy(keep_days=7, event_days=1, rollup_days=1)
    assert retention.run(now=now, keep_days=7, policy=policy)["ingest_deviceevent"] == 1


def test_batched_deletes_walk_the_old_id_prefix_and_keep_newer_rows(post_batch):
    now = datetime.now(UTC)
    events = [{"kind": "device_event", "gpu": "GPU-1", "event": "xid", "code": c}
              for c in range(1, 6)]  # fmt: skip
    assert post_batch(make_batch(events)).status_code == 202
    ids = list(DeviceEvent.objects.order_by("id").values_list("id", flat=True))
    for age, pk in zip((100, 99, 98, 1, 0), ids, strict=True):
        DeviceEvent.objects.filter(id=pk).update(ts=now - timedelta(days=age))
    assert retention.delete_batched("ingest_deviceevent", "ts", now - timedelta(days=90),
                                    batch=2) == 3  # fmt: skip
    assert sorted(DeviceEvent.objects.values_list("code", flat=True)) == [4, 5]
