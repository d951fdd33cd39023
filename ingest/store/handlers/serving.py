"""Handlers of serving windows and correctness probes: a worker outside generation fencing
follows its group's generation; probes are stored as evidence only.
"""

from __future__ import annotations

from datetime import datetime

from agents import protocol as p
from ingest.copytext import flag, num, text, when
from ingest.copytext import json as cjson
from ingest.store.fences import Fences
from ingest.store.kinds import Keep, Kind


def on_serving(w: Fences, rec: p.Serving, ts: datetime) -> None:
    group, view = w.groups[rec.group]
    generation = rec.generation
    if generation is None:
        # A worker outside generation fencing (most serving stacks) follows the group.
        generation, applied = view.generation, True
        w.touched_groups.add(group.name)
        group.last_activity = max(group.last_activity or ts, ts)
    else:
        applied = w.fence(rec, ts)
    w.rows["servingwindow"].append(
        f"{when(ts)}{w.node_cell}{group.pk}\t{generation}\t{flag(not applied)}\t"
        f"{text(rec.worker)}\t{text(rec.model_version)}\t{text(rec.adapter_version)}\t"
        f"{text(rec.kv_schema)}\t{flag(rec.ready)}\t{flag(rec.draining)}\t"
        f"{cjson(rec.window)}\n"
    )


def on_probe(w: Fences, rec: p.Probe, ts: datetime) -> None:
    """Stored as evidence only: a probe moves no live state."""
    group, view = w.groups[rec.group]
    if rec.generation is None:  # a serving worker follows the group's generation
        generation, applied = view.generation, True
        w.touched_groups.add(group.name)
    else:
        generation, applied = rec.generation, w.fence(rec, ts)
    w.rows["proberecord"].append(
        f"{when(ts)}{w.node_cell}{group.pk}\t{generation}\t{flag(not applied)}\t"
        f"{text(rec.probe)}\t{num(rec.rank)}\t{text(rec.worker)}\t{num(rec.step)}\t"
        f"{num(rec.value)}\t{text(rec.checksum)}\t{num(rec.duration_ms)}\t"
        f"{text(rec.model_version)}\n"
    )


# This family's kinds (ingest.store.kinds): each handler writes its table's COPY columns
# in this order.
KINDS = (
    Kind(
        p.Serving,
        on_serving,
        table="servingwindow",
        columns=(
            "ts",
            "node_id",
            "group_id",
            "generation",
            "stale",
            "worker",
            "model_version",
            "adapter_version",
            "kv_schema",
            "ready",
            "draining",
            "window",
        ),
        keep=Keep.PARTITIONS,
    ),
    Kind(
        p.Probe,
        on_probe,
        table="proberecord",
        columns=(
            "ts",
            "node_id",
            "group_id",
            "generation",
            "stale",
            "probe",
            "rank",
            "worker",
            "step",
            "value",
            "checksum",
            "duration_ms",
            "model_version",
        ),
        keep=Keep.GROUP_EVENTS,
    ),
)
