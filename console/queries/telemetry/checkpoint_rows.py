"""Checkpoint records: the group page's list, a step's saves for recovery costs, and the week
checkpoint-interval advice is computed from. Must not write.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db.models import Model

from console.models import ConsistencyGroup
from console.queries.telemetry.shared import ADVICE_WINDOW, MAX_ADVICE_ROWS
from ingest import models as m

# The record kinds whose tables this module reads (each kind has a reader: tests/server/ingest/
# test_record_kinds.py).
READS: dict[str, type[Model]] = {"checkpoint": m.CheckpointRecord}

# A checkpoint's first record follows the step it saved within this (an asynchronous
# save's first record is its staging, not its upload's commit).
CHECKPOINT_LAG = timedelta(minutes=15)


def group_checkpoints(group: ConsistencyGroup, limit: int = 300) -> list[dict[str, Any]]:
    return list(
        m.CheckpointRecord.objects.filter(group=group)
        .order_by("-ts")
        .values("ts", "generation", "checkpoint_id", "step", "phase", "detail")[:limit]
    )


def checkpoints_at_step(group: ConsistencyGroup, step: int) -> list[dict[str, Any]]:
    return list(
        m.CheckpointRecord.objects.filter(group=group, step=step)
        .order_by("ts")
        .values("ts", "checkpoint_id", "step", "phase", "data_cursor")[:50]
    )


def checkpoint_history(group: ConsistencyGroup, *, now: datetime) -> list[dict[str, Any]]:
    """The group's checkpoint records of the last week (ts, checkpoint_id, phase,
    duration_ms), oldest first, bounded: what checkpoint-interval advice is computed from."""
    rows = (
        m.CheckpointRecord.objects.filter(group=group, ts__gte=now - ADVICE_WINDOW)
        .order_by("-ts")
        .values("ts", "checkpoint_id", "phase", "duration_ms")[:MAX_ADVICE_ROWS]
    )
    return list(reversed(list(rows)))
