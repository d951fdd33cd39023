"""Handler of checkpoint records: fenced like a rank's, and checked for order within a
generation (ingest.fencing); a committed one moves the group's last checkpoint step.
"""

from __future__ import annotations

from datetime import datetime

from agents import protocol as p
from ingest import fencing
from ingest.copytext import flag, num, text, when
from ingest.copytext import json as cjson
from ingest.store.fences import Fences
from ingest.store.kinds import Keep, Kind


def on_checkpoint(w: Fences, rec: p.Checkpoint, ts: datetime) -> None:
    applied = w.fence(rec, ts)
    group, view = w.groups[rec.group]
    w.rows["checkpointrecord"].append(
        f"{when(ts)}{w.node_cell}{group.pk}\t{rec.generation}\t{flag(not applied)}\t"
        f"{text(rec.checkpoint_id)}\t{num(rec.step)}\t{text(rec.phase)}\t"
        f"{cjson(rec.manifest)}\t{num(rec.duration_ms)}\t{text(rec.detail)}\t"
        f"{num(rec.data_cursor)}\n"
    )
    if applied:
        violation = fencing.check_checkpoint_order(view, rec)
        if violation:
            w.violations.append(violation)
        elif rec.phase == "committed" and rec.step is not None:
            view.last_checkpoint_step = rec.step
            group.last_checkpoint_step = rec.step


# This family's kinds (ingest.store.kinds): each handler writes its table's COPY columns
# in this order.
KINDS = (
    Kind(
        p.Checkpoint,
        on_checkpoint,
        table="checkpointrecord",
        columns=(
            "ts",
            "node_id",
            "group_id",
            "generation",
            "stale",
            "checkpoint_id",
            "step",
            "phase",
            "manifest",
            "duration_ms",
            "detail",
            "data_cursor",
        ),
        keep=Keep.GROUP_EVENTS,
    ),
)
