"""Handlers of the per-rank records: steps, collective windows, process-groups reports and
process events. Each is fenced (ingest.store.fences); an applied one moves its rank's live
state (last step, data cursor, process state, GPU). A process naming the scheduler job may
bind the group to it.
"""

from __future__ import annotations

from datetime import datetime

from agents import protocol as p
from ingest.copytext import flag, num, text, when
from ingest.copytext import json as cjson
from ingest.store.fences import Fences
from ingest.store.kinds import Keep, Kind


def on_step(w: Fences, rec: p.Step, ts: datetime) -> None:
    applied = w.fence(rec, ts)
    group, _ = w.groups[rec.group]
    w.rows["steprecord"].append(
        f"{when(ts)}{w.node_cell}{group.pk}\t{rec.generation}\t{flag(not applied)}\t"
        f"{rec.rank}\t{rec.step}\t{rec.tokens}\t{num(rec.data_cursor)}\t"
        f"{num(rec.duration_ms)}\t{cjson(rec.phases)}\t{num(rec.loss)}\t"
        f"{num(rec.grad_norm)}\t{num(rec.loss_scale)}\t{flag(rec.overflow)}\t"
        f"{num(rec.model_flops)}\t{num(rec.hw_flops)}\t{num(rec.lr)}\n"
    )
    if applied:
        entry = w.rank(group, rec.rank, rec.generation)
        if entry.get("last_step") is None or rec.step >= entry["last_step"]:
            entry.update(last_step=rec.step, last_step_at=ts)
        if rec.data_cursor is not None:
            entry["cursor_seen"] = [*entry.get("cursor_seen", []), rec.data_cursor]


def on_collective(w: Fences, rec: p.Collective, ts: datetime) -> None:
    applied = w.fence(rec, ts)
    group, _ = w.groups[rec.group]
    w.rows["collectivewindow"].append(
        f"{when(ts)}{w.node_cell}{group.pk}\t{rec.generation}\t{flag(not applied)}\t"
        f"{rec.rank}\t{cjson(rec.entries)}\n"
    )
    if applied:
        w.rank(group, rec.rank, rec.generation)


def on_process_groups(w: Fences, rec: p.ProcessGroups, ts: datetime) -> None:
    applied = w.fence(rec, ts)
    group, _ = w.groups[rec.group]
    w.rows["processgroupsrecord"].append(
        f"{when(ts)}{w.node_cell}{group.pk}\t{rec.generation}\t{flag(not applied)}\t"
        f"{rec.rank}\t{cjson(rec.groups)}\n"
    )
    if applied:
        w.rank(group, rec.rank, rec.generation)


def on_process(w: Fences, rec: p.Process, ts: datetime) -> None:
    if rec.job is not None:
        w.take_name(rec.job, rec.group, rec.generation, ts)
    applied = w.fence(rec, ts)
    group, _ = w.groups[rec.group]
    w.rows["processrecord"].append(
        f"{when(ts)}{w.node_cell}{group.pk}\t{rec.generation}\t{flag(not applied)}\t"
        f"{rec.rank}\t{text(rec.event)}\t{num(rec.pid)}\t{text(rec.gpu)}\t"
        f"{num(rec.exit_code)}\t{num(rec.signal)}\t{text(rec.reason)}\t"
        f"{text(rec.error_type)}\t{text(rec.message)}\t{text(rec.launcher_root_cause)}\n"
    )
    if not applied:
        return
    if not w.claimant.launches(group.name):  # a launcher hosts no rank: evidence only
        entry = w.rank(group, rec.rank, rec.generation)
        entry["process_state"] = rec.event
        if rec.gpu:
            entry["gpu"] = rec.gpu
    if rec.job is not None:
        w.set_job(rec.job, group)


# This family's kinds (ingest.store.kinds): each handler writes its table's COPY columns
# in this order.
KINDS = (
    Kind(
        p.Step,
        on_step,
        table="steprecord",
        columns=(
            "ts",
            "node_id",
            "group_id",
            "generation",
            "stale",
            "rank",
            "step",
            "tokens",
            "data_cursor",
            "duration_ms",
            "phases",
            "loss",
            "grad_norm",
            "loss_scale",
            "overflow",
            "model_flops",
            "hw_flops",
            "lr",
        ),
        keep=Keep.PARTITIONS,
    ),
    Kind(
        p.Collective,
        on_collective,
        table="collectivewindow",
        columns=(
            "ts",
            "node_id",
            "group_id",
            "generation",
            "stale",
            "rank",
            "entries",
        ),
        keep=Keep.PARTITIONS,
    ),
    Kind(
        p.ProcessGroups,
        on_process_groups,
        table="processgroupsrecord",
        columns=(
            "ts",
            "node_id",
            "group_id",
            "generation",
            "stale",
            "rank",
            "groups",
        ),
        keep=Keep.GROUP_EVENTS,
    ),
    Kind(
        p.Process,
        on_process,
        table="processrecord",
        columns=(
            "ts",
            "node_id",
            "group_id",
            "generation",
            "stale",
            "rank",
            "event",
            "pid",
            "gpu",
            "exit_code",
            "signal",
            "reason",
            "error_type",
            "message",
            "launcher_root_cause",
        ),
        keep=Keep.GROUP_EVENTS,
    ),
)
