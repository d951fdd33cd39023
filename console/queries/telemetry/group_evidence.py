"""A group's evidence for a diagnosis snapshot that is sized by events and workers, not by
ranks x steps: checkpoints, transitions, serving windows, probes, contract violations.
Every pass reads it whole (console.snapshots). Must not write.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import Model

from console.models import ConsistencyGroup
from console.queries.telemetry.shared import EVENT_WINDOW, HISTORY_WINDOW, contract_rows
from ingest import models as m

# The record kinds whose tables this module reads (each kind has a reader: tests/server/ingest/
# test_record_kinds.py).
READS: dict[str, type[Model]] = {
    "checkpoint": m.CheckpointRecord,
    "transition": m.TransitionRecord,
    "serving": m.ServingWindow,
    "probe": m.ProbeRecord,
}

MAX_PROBE_ROWS = 20_000


def evidence_records(
    group: ConsistencyGroup, *, node_names: dict[int, str], now: datetime
) -> list[dict[str, Any]]:
    """The group's checkpoints, transitions, serving windows and probes: sized by events and
    workers, not by ranks x steps, so every pass reads them whole."""
    records: list[dict[str, Any]] = []
    ckpts = m.CheckpointRecord.objects.filter(group=group, ts__gte=now - HISTORY_WINDOW)
    records += contract_rows(
        ckpts,
        "checkpoint",
        [
            "generation",
            "checkpoint_id",
            "step",
            "phase",
            "manifest",
            "duration_ms",
            "detail",
            "data_cursor",
        ],
        node_names,
    )
    transitions = m.TransitionRecord.objects.filter(
        group=group, ts__gte=now - HISTORY_WINDOW, stale=False
    )
    records += contract_rows(
        transitions,
        "transition",
        [
            "generation",
            "from_state",
            "to_state",
            "reason",
            "restart_count",
            "world_size",
            "data_cursor",
            "model_version",
        ],
        node_names,
    )
    serving = (
        m.ServingWindow.objects.filter(group=group, ts__gte=now - EVENT_WINDOW)
        .order_by("worker", "-ts")
        .distinct("worker")
    )
    records += contract_rows(
        serving,
        "serving",
        [
            "generation",
            "worker",
            "model_version",
            "adapter_version",
            "kv_schema",
            "ready",
            "draining",
            "window",
        ],
        node_names,
    )
    # Correctness probes: compared across ranks at one step and over time.
    probes = m.ProbeRecord.objects.filter(
        group=group, generation=group.generation, stale=False, ts__gte=now - EVENT_WINDOW
    ).order_by("-ts")[:MAX_PROBE_ROWS]
    records += contract_rows(
        probes,
        "probe",
        ["generation", "probe", "rank", "worker", "step", "value", "checksum", "model_version"],
        node_names,
    )
    return records


def contract_violations(group: ConsistencyGroup, now: datetime) -> list[dict[str, Any]]:
    """The group's contract violations of the last EVENT_WINDOW, oldest first."""
    return [
        {
            "kind": c.kind,
            "subject": c.subject,
            "evidence": c.evidence,
            "ts": c.ts,
            "generation": c.generation,
        }
        for c in m.ContractViolation.objects.filter(
            group=group, ts__gte=now - EVENT_WINDOW
        ).order_by("ts")
    ]
