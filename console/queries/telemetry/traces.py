"""The one step or request an incident is about, end to end: a step's record and its
collective calls on the culprit and its neighbours (joined by `step_id`), or a serving
worker's request-id range. Bounded by TRACE_SPAN and a few ranks, whatever the world size.
Must not write.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db.models import Model

from agents.wire import parse_step_id, step_id
from console.models import ConsistencyGroup
from console.queries.telemetry.shared import HISTORY_WINDOW
from ingest import models as m

# The record kinds whose tables this module reads (each kind has a reader: tests/server/ingest/
# test_record_kinds.py).
READS: dict[str, type[Model]] = {
    "step": m.StepRecord,
    "collective": m.CollectiveWindow,
    "checkpoint": m.CheckpointRecord,
    "serving": m.ServingWindow,
}

TRACE_NEIGHBOURS = 8  # ranks either side of the culprit a step trace lists (its node, its TP group)
TRACE_SPAN = timedelta(minutes=10)  # one logical step's records lie within this of each other


def step_trace(
    group: ConsistencyGroup, *, generation: int, rank: int, around: datetime
) -> dict[str, Any] | None:
    """The step a rank's incident is about, end to end: that step's record (duration and
    phases: input, compute, collective, optimizer, checkpoint) and its collective calls on
    the culprit and its neighbouring ranks, joined by `step_id`, and any checkpoint of it.

    The step is the one the culprit's first unfinished collective belongs to (where it
    stopped); without one, the step after its newest step if any neighbour reached it (the
    step it was in when it died or hung), else its newest step. None: the rank reported
    nothing near `around`. Bounded: the culprit's newest rows within HISTORY_WINDOW, then
    TRACE_SPAN around them for 2 x TRACE_NEIGHBOURS + 1 ranks, whatever the world size.
    """
    base = m.StepRecord.objects.filter(group=group, generation=generation, stale=False)
    hi = around + TRACE_SPAN
    newest = (
        base.filter(rank=rank, ts__gte=around - HISTORY_WINDOW, ts__lte=hi)
        .order_by("-ts")
        .values("ts", "step")
        .first()
    )
    windows_qs = m.CollectiveWindow.objects.filter(group=group, generation=generation, stale=False)
    own = (
        windows_qs.filter(rank=rank, ts__gte=around - HISTORY_WINDOW, ts__lte=hi)
        .order_by("-ts")
        .values("ts")
        .first()
    )
    refs = [r["ts"] for r in (newest, own) if r]
    if not refs:
        return None
    lo, hi = max(refs) - TRACE_SPAN, min(hi, max(refs) + TRACE_SPAN)
    shown = list(range(max(0, rank - TRACE_NEIGHBOURS), rank + TRACE_NEIGHBOURS + 1))
    windows: dict[int, list[dict[str, Any]]] = {
        w["rank"]: w["entries"] or []
        for w in windows_qs.filter(rank__in=shown, ts__gte=lo, ts__lte=hi)
        .order_by("rank", "-ts")
        .distinct("rank")
        .values("rank", "entries")
    }

    def calls_of(step: int) -> dict[int, list[dict[str, Any]]]:
        wanted = step_id(generation, step)
        return {
            r: [e for e in entries if e.get("step_id") == wanted]
            for r, entries in windows.items()
            if any(e.get("step_id") == wanted for e in entries)
        }

    step, source = None, ""
    for entry in windows.get(rank, []):
        parsed = parse_step_id(entry.get("step_id"))
        if entry.get("state") != "completed" and parsed and parsed[0] == generation:
            step, source = parsed[1], "its unfinished collective"
            break
    steps = base.filter(rank__in=shown, ts__gte=lo, ts__lte=hi)
    if step is None and newest is not None:
        after = newest["step"] + 1
        if calls_of(after) or steps.filter(step=after).exists():
            step, source = after, "the step after its last reported one"
        else:
            step, source = newest["step"], "its last reported step"
    if step is None:
        return None
    calls = calls_of(step)
    rows = {
        r["rank"]: r
        for r in steps.filter(step=step).values("rank", "ts", "duration_ms", "phases", "loss")
    }
    ranks = []
    for r in shown:
        if r not in rows and r not in calls and r != rank:
            continue
        row = rows.get(r)
        ranks.append(
            {
                "rank": r,
                "culprit": r == rank,
                "committed": row is not None,
                "duration_ms": row["duration_ms"] if row else None,
                "phases": sorted((row["phases"] or {}).items()) if row else [],
                "calls": [
                    {k: e.get(k) for k in ("op", "pg", "seq", "state", "numel", "dtype", "peer")}
                    for e in calls.get(r, [])
                ],
            }
        )
    checkpoints = list(
        m.CheckpointRecord.objects.filter(
            group=group, generation=generation, step=step, ts__gte=lo, ts__lte=hi
        )
        .order_by("ts")
        .values("checkpoint_id", "phase", "ts")[:20]
    )
    return {
        "step_id": step_id(generation, step),
        "step": step,
        "rank": rank,
        "source": source,
        "world_size": group.world_size,
        "ranks": ranks,
        "checkpoints": checkpoints,
    }


def request_trace(
    group: ConsistencyGroup, *, worker: str, around: datetime
) -> dict[str, Any] | None:
    """The serving window a worker's incident is about: its request-id range (the requests
    that were on the worker, end to end), versions and counters. None: no window near."""
    row = (
        m.ServingWindow.objects.filter(
            group=group, worker=worker, ts__gte=around - HISTORY_WINDOW, ts__lte=around + TRACE_SPAN
        )
        .order_by("-ts")
        .values("ts", "window", "model_version", "adapter_version", "kv_schema")
        .first()
    )
    if row is None:
        return None
    window = row["window"] or {}
    return {
        "worker": worker,
        "ts": row["ts"],
        "first_request_id": window.get("first_request_id"),
        "last_request_id": window.get("last_request_id"),
        "requests": window.get("requests"),
        "active": window.get("active"),
        "exited": bool(window.get("exited")),
        "model_version": row["model_version"],
        "adapter_version": row["adapter_version"],
        "kv_schema": row["kv_schema"],
    }
