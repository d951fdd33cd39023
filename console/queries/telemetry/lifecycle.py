"""A group's lifecycle: its state transitions, and the process exits that ended its
generations (a launcher's named root cause). Bounded by time or by row count. Must not
write.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import Min, Model, Q

from console.models import ConsistencyGroup
from console.queries.telemetry.shared import ADVICE_WINDOW, MAX_ADVICE_ROWS, RECOVERY_WINDOW
from ingest import models as m

# The record kinds whose tables this module reads (each kind has a reader: tests/server/ingest/
# test_record_kinds.py).
READS: dict[str, type[Model]] = {"transition": m.TransitionRecord, "process": m.ProcessRecord}


def group_transitions(group: ConsistencyGroup, limit: int = 200) -> list[dict[str, Any]]:
    """The newest `limit` state transitions, oldest first (stale writers excluded)."""
    rows = (
        m.TransitionRecord.objects.filter(group=group, stale=False)
        .order_by("-ts")
        .values("ts", "generation", "from_state", "to_state", "reason", "restart_count")[:limit]
    )
    return list(reversed(rows))


def groups_first_transition(group_ids: list[int], since: datetime) -> dict[int, datetime]:
    """Each group's first transition at or after `since` (when it began running there)."""
    rows = (
        m.TransitionRecord.objects.filter(group_id__in=group_ids, ts__gte=since)
        .values("group_id")
        .annotate(first=Min("ts"))
    )
    return {r["group_id"]: r["first"] for r in rows}


def recovery_transitions(group: ConsistencyGroup, since: datetime) -> list[dict[str, Any]]:
    """Transitions from `since` on, oldest first (stale writers excluded), bounded."""
    return list(
        m.TransitionRecord.objects.filter(
            group=group, stale=False, ts__gte=since, ts__lt=since + RECOVERY_WINDOW
        )
        .order_by("ts")
        .values("ts", "generation", "from_state", "to_state", "world_size", "data_cursor")[:200]
    )


def advice_transitions(group: ConsistencyGroup, *, now: datetime) -> list[dict[str, Any]]:
    """The group's transitions of the last week (ts, to_state), oldest first, bounded."""
    rows = (
        m.TransitionRecord.objects.filter(group=group, ts__gte=now - ADVICE_WINDOW, stale=False)
        .order_by("-ts")
        .values("ts", "to_state")[:MAX_ADVICE_ROWS]
    )
    return list(reversed(list(rows)))


_LAUNCHER_ROOT_FIELDS = (
    "group_id",
    "generation",
    "rank",
    "ts",
    "exit_code",
    "signal",
    "reason",
    "error_type",
    "message",
    "launcher_root_cause",
)


def generation_endings(
    group: ConsistencyGroup, *, after: int, since: datetime
) -> list[dict[str, Any]]:
    """The group's generations from `after` up to (not including) its current one that
    ended at or after `since`, oldest first: {generation, ended_at: the first transition of
    a later generation, state: what the generation's own last transition before that left
    it in ("running" if none)}. One query for the ends, one per ended generation."""
    if group.generation <= after:
        return []
    firsts = dict(
        m.TransitionRecord.objects.filter(group=group, generation__gt=after, stale=False)
        .values("generation")
        .annotate(first=Min("ts"))
        .values_list("generation", "first")
    )
    out: list[dict[str, Any]] = []
    for generation in range(after, group.generation):
        later = [ts for g, ts in firsts.items() if g > generation]
        if not later or min(later) < since:
            continue
        ended_at = min(later)
        last = (
            m.TransitionRecord.objects.filter(
                group=group, generation=generation, stale=False, ts__lte=ended_at
            )
            .order_by("-ts")
            .values_list("to_state", flat=True)
            .first()
        )
        out.append({"generation": generation, "ended_at": ended_at, "state": last or "running"})
    return out


def launcher_root_causes(keys: set[tuple[int, int]]) -> dict[tuple[int, int], dict[str, Any]]:
    """(group id, generation) -> the exit a launcher named that generation's root cause
    (torchrun's first observed failure), the earliest where several launcher agents (one
    per node) each named one. One query for any number of keys."""
    if not keys:
        return {}
    which = Q()
    for gid, generation in sorted(keys):
        which |= Q(group_id=gid, generation=generation)
    rows = (
        m.ProcessRecord.objects.filter(which, event="exited", launcher_root_cause__isnull=False)
        .order_by("ts", "rank")
        .values(*_LAUNCHER_ROOT_FIELDS)
    )
    out: dict[tuple[int, int], dict[str, Any]] = {}
    for row in rows:
        out.setdefault((row["group_id"], row["generation"]), row)
    return out
