"""Store one validated batch atomically: receipt, telemetry (COPY), live state, contracts.

Either everything of a batch is written or nothing is. The (agent_id, seq) receipt is
inserted first, so a replayed batch stops there and changes nothing. Telemetry goes in
with COPY (no ORM objects per record: the hot path budget is validation and encoding).
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import msgspec
import psycopg
from django.db import connection, transaction
from psycopg.types.json import Jsonb

from agents import protocol as p
from console.choices import ACTION_LIVE_STATES, GroupKind, Health
from console.models import ConsistencyGroup, Node
from ingest import fencing
from ingest.copytext import flag, num, text, when
from ingest.copytext import json as cjson
from ingest.models import ContractViolation
from ingest.rawsql import columns, from_row, send
from ingest.scrub import scrub_text

# Names as agents/nvml.py decodes them (hw_power_brake_slowdown; the short form is legacy).
THROTTLE_WARN = {
    "hw_slowdown",
    "hw_thermal_slowdown",
    "sw_thermal_slowdown",
    "hw_power_brake",
    "hw_power_brake_slowdown",
}
CRITICAL_EVENTS = {"xid", "ecc_dbe", "gpu_lost"}


@dataclass
class IngestResult:
    ack_seq: int
    duplicate: bool
    records: int = 0
    groups: list[str] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)
    violations: int = 0
    device_events: int = 0  # Xid/DBE/GPU-lost records: push and diagnose without delay
    actions_pending: bool = True  # the node has actions in flight: dispatch on the response
    card: dict[str, Any] | None = None  # the node's fleet card as committed, when asked for


class RecordError(ValueError):
    """A record that passed the contract but cannot be stored; 400 naming record and field."""

    def __init__(self, message: str, *, index: int | None = None, field: str | None = None):
        super().__init__(message)
        self.message, self.index, self.field = message, index, field

    def as_dict(self) -> dict[str, Any]:
        return {"error": self.message, "record": self.index, "field": self.field}


class FutureRecordError(RecordError):
    """A record stamped too far ahead of the batch's own send time."""


def ingest_batch(
    *, node: Node, batch: p.Batch, now: datetime, max_future_s: int, want_card: bool = False
) -> IngestResult:
    """Store one batch in one transaction and about five round trips, whatever its size.

    Round trips: receipt + agent state; groups + the ranks the batch names; one COPY per
    record table; then every live-state write in one multi-statement send. Raw SQL here
    because the ORM's statement compilation cost more than Postgres did (docs/performance.md).
    With `want_card` (or a critical device event) the last send also reads the node's
    fleet card, so the live push after commit costs no query of its own.
    """
    skew = batch.sent_at - now
    shift = skew if abs(skew) > timedelta(seconds=5) else timedelta(0)
    _check_future(batch, max_future_s)
    # Raw psycopg throughout: map its errors to Django's (OperationalError -> 503 in the
    # view); a number out of range for its column becomes a 400 naming the record.
    with transaction.atomic(), connection.wrap_database_errors:
        agent = _claim_receipt(batch, node, now)
        if agent is None:
            send(_AGENT_DUPLICATE, {"agent": batch.agent.id, "now": now}).close()
            return IngestResult(ack_seq=batch.seq, duplicate=True)
        writer = _Writer(
            node=node, agent_id=batch.agent.id, now=now, shift=shift, want_card=want_card
        )
        writer.agent_update = _agent_update(agent, node, batch, now, skew)
        writer.add(batch.records)
        try:
            writer.flush()
        except psycopg.errors.DataError as exc:
            raise _out_of_range(exc, batch) from None
        return IngestResult(
            ack_seq=batch.seq,
            duplicate=False,
            records=len(batch.records),
            groups=sorted(writer.touched_groups),
            nodes=[node.name],
            violations=writer.violation_count,
            device_events=writer.critical_events,
            actions_pending=writer.actions_pending,
            card=writer.card,
        )


def _check_future(batch: p.Batch, max_future_s: int) -> None:
    limit = batch.sent_at + timedelta(seconds=max_future_s)
    for index, rec in enumerate(batch.records):
        if rec.ts > limit:
            raise FutureRecordError(
                f'record {index}: field "ts": {rec.ts.isoformat()} is more than '
                f"{max_future_s} s after the batch's sent_at {batch.sent_at.isoformat()}",
                index=index,
                field="ts",
            )


_COPY_CONTEXT = re.compile(r"COPY ingest_(\w+), line (\d+), column (\w+)")
_KIND_OF_TABLE = {
    "devicesample": "device_sample",
    "deviceevent": "device_event",
    "steprecord": "step",
    "collectivewindow": "collective",
    "processrecord": "process",
    "checkpointrecord": "checkpoint",
    "transitionrecord": "transition",
    "servingwindow": "serving",
    "proberecord": "probe",
}


def _out_of_range(exc: psycopg.errors.DataError, batch: p.Batch) -> RecordError:
    """Name the record behind a COPY row Postgres refused (a number beyond its column).

    The contract bounds most numbers; the rest (generation, codes, counters) are bounded by
    their columns. Line N of a table's COPY is the N-th record of that kind, so the index
    is found again only on this error path, at no cost to good batches.
    """
    match = _COPY_CONTEXT.search(getattr(exc.diag, "context", None) or "")
    if match is None:
        return RecordError(
            f"batch: a value is out of range for storage ({exc.diag.message_primary})"
        )
    table, line, column = match.group(1), int(match.group(2)), match.group(3)
    kind = _KIND_OF_TABLE.get(table)
    field = column.removesuffix("_id")
    same_kind = [i for i, r in enumerate(batch.records) if r.__struct_config__.tag == kind]
    index = same_kind[line - 1] if 0 < line <= len(same_kind) else None
    where = f"record {index}" if index is not None else f"a {kind} record"
    return RecordError(
        f'{where}: field "{field}": value is out of range for storage ({exc.diag.message_primary})',
        index=index,
        field=field,
    )


_AGENT_COLUMNS = (
    "node_id", "last_seq", "gaps", "gap_ranges", "batches", "records", "spool_depth", "dropped",
)  # fmt: skip

# Receipt first: a replay stops here. The agent's row is created if new and locked, so two
# batches of one agent (a retry racing its original) count gaps and batches one at a time.
_CLAIM = f"""
INSERT INTO ingest_batchreceipt (agent_id, seq, received_at, records)
VALUES (%(agent)s, %(seq)s, %(now)s, %(records)s)
ON CONFLICT (agent_id, seq) DO NOTHING RETURNING id;
INSERT INTO ingest_agentstate (agent_id, node_id, version, boot_id, batches, records,
    duplicates, gaps, gap_ranges, spool_depth, dropped)
VALUES (%(agent)s, %(node)s, '', '', 0, 0, 0, 0, '[]', 0, 0)
ON CONFLICT (agent_id) DO NOTHING;
SELECT {", ".join(_AGENT_COLUMNS)} FROM ingest_agentstate WHERE agent_id = %(agent)s FOR UPDATE
"""  # noqa: S608 - constant column names

_AGENT_DUPLICATE = """
UPDATE ingest_agentstate SET duplicates = duplicates + 1, last_seen = %(now)s
WHERE agent_id = %(agent)s
"""

_AGENT_UPDATE = """
UPDATE ingest_agentstate SET node_id = %(a_node)s, version = %(a_version)s,
    boot_id = %(a_boot)s, last_seq = %(a_last_seq)s, batches = %(a_batches)s,
    records = %(a_records)s, gaps = %(a_gaps)s, gap_ranges = %(a_gap_ranges)s,
    last_seen = %(now)s, clock_skew_ms = %(a_skew)s, spool_depth = %(a_spool)s,
    dropped = %(a_dropped)s
WHERE agent_id = %(a_id)s
"""


def _claim_receipt(batch: p.Batch, node: Node, now: datetime) -> dict[str, Any] | None:
    """Insert the (agent, seq) receipt and lock the agent's row; None for a replay."""
    params = {"agent": batch.agent.id, "seq": batch.seq, "now": now,
              "records": len(batch.records), "node": node.pk}  # fmt: skip
    with send(_CLAIM, params) as cur:
        claimed = cur.fetchone() is not None
        cur.nextset()
        cur.nextset()
        row = cur.fetchone()
    if not claimed or row is None:
        return None
    state = dict(zip(_AGENT_COLUMNS, row, strict=True))
    if isinstance(state["gap_ranges"], str):  # Django's connections load jsonb as text
        state["gap_ranges"] = msgspec.json.decode(state["gap_ranges"])
    return state


def _agent_update(
    state: dict[str, Any], node: Node, batch: p.Batch, now: datetime, skew: timedelta
) -> dict[str, Any]:
    """The agent's counters after this batch: gaps opened by a jump, closed by a late seq."""
    seq, last_seq = batch.seq, state["last_seq"]
    gaps, gap_ranges = state["gaps"], state["gap_ranges"]
    if last_seq is None:
        pass
    elif seq > last_seq + 1:
        gaps += seq - last_seq - 1
        gap_ranges = [*gap_ranges, [last_seq + 1, seq - 1]][-100:]
    elif seq < last_seq:
        gap_ranges, filled = _fill_gap(gap_ranges, seq)
        gaps -= filled
    spool, dropped = state["spool_depth"], state["dropped"]
    for rec in batch.records:
        if isinstance(rec, p.Heartbeat):
            spool, dropped = rec.spool_depth, rec.dropped
    return {
        "a_id": batch.agent.id,
        "a_node": node.pk,
        "a_version": batch.agent.version,
        "a_boot": batch.agent.boot_id or "",
        "a_last_seq": max(seq, last_seq if last_seq is not None else seq),
        "a_batches": state["batches"] + 1,
        "a_records": state["records"] + len(batch.records),
        "a_gaps": gaps,
        "a_gap_ranges": Jsonb(gap_ranges),
        "a_skew": round(skew.total_seconds() * 1000, 1),
        "a_spool": spool,
        "a_dropped": dropped,
    }


def _fill_gap(ranges: list[list[int]], seq: int) -> tuple[list[list[int]], int]:
    out: list[list[int]] = []
    filled = 0
    for first, last in ranges:
        if first <= seq <= last:
            filled = 1
            if first < seq:
                out.append([first, seq - 1])
            if seq < last:
                out.append([seq + 1, last])
        else:
            out.append([first, last])
    return out, filled


# msgspec encodes contract Structs straight to JSON bytes, 5-10x faster than json.dumps of
# their to_builtins() copies; the JSON is the same (omit_defaults, ISO times with "Z").
_JSON = msgspec.json.Encoder()


def _plain(struct: Any) -> Any:
    return msgspec.to_builtins(struct) if struct is not None else None


class _Writer:
    """Collects rows and live-state changes for one batch, then writes them in bulk."""

    def __init__(
        self, *, node: Node, agent_id: str, now: datetime, shift: timedelta, want_card: bool
    ) -> None:
        self.node, self.agent_id, self.now, self.shift = node, agent_id, now, shift
        self.node_id = node.pk
        self.rows: dict[str, list[str]] = defaultdict(list)  # COPY text lines per table
        self.node_cell = f"\t{self.node_id}\t"  # every row's node_id, between its neighbours
        self.devices: dict[str, dict[str, Any]] = {}
        self.device_events: dict[str, str] = {}
        self.ranks: dict[tuple[str, int], dict[str, Any]] = {}
        self.groups: dict[str, tuple[ConsistencyGroup, fencing.GroupView]] = {}
        self.violations: list[fencing.Violation] = []
        self.touched_groups: set[str] = set()
        self.violation_count = 0
        self.critical_events = 0
        self.last_seen: datetime | None = None  # newest record time: when the node was alive
        self.agent_update: dict[str, Any] = {}
        self.existing_ranks: dict[tuple[str, int], dict[str, Any]] = {}
        self.summary_changed: set[str] = set()
        self.locked: set[str] = set()  # groups locked FOR UPDATE: their state may change
        self.kind_read: dict[str, str] = {}
        self.activity_read: dict[str, datetime | None] = {}
        self.activity_written: dict[int, datetime] = {}
        self.actions_pending = True
        self.want_card = want_card  # read the node's fleet card in the last send
        self.card: dict[str, Any] | None = None

    # -- collection --------------------------------------------------------------------
    def add(self, records: list[Any]) -> None:
        self._load_groups(records)
        handlers = {
            p.Heartbeat: self._on_heartbeat,
            p.DeviceSample: self._on_device_sample,
            p.DeviceEvent: self._on_device_event,
            p.Process: self._on_process,
            p.Step: self._on_step,
            p.Collective: self._on_collective,
            p.Checkpoint: self._on_checkpoint,
            p.Transition: self._on_transition,
            p.Serving: self._on_serving,
            p.Probe: self._on_probe,
        }
        shift = self.shift if self.shift else None
        last_seen = self.last_seen
        for rec in records:
            ts = rec.ts if shift is None else rec.ts - shift
            if last_seen is None or ts > last_seen:
                last_seen = ts
            handlers[type(rec)](rec, ts)
        self.last_seen = last_seen

    def _load_groups(self, records: list[Any]) -> None:
        """Read the groups the batch names, creating new ones, and the live state of the
        ranks it names: one round trip when the groups exist.

        A batch that changes group state (a transition or a checkpoint) locks the group rows
        FOR UPDATE (name order: no deadlocks), and so does creating a group. Steps, collectives and
        serving windows take FOR KEY SHARE: they never wait for each other, so the thousands
        of nodes of one job do not queue on their group's row, yet a transition still waits
        for them and they for it, so fencing sees the generation that commits. They may
        only move `last_activity` forward (`_groups`).
        """
        wanted: dict[str, str] = {}
        ranks: set[tuple[str, int]] = set()
        lock = False
        for rec in records:
            name = getattr(rec, "group", None)
            if name is None:
                continue
            serving = isinstance(rec, p.Serving) or getattr(rec, "worker", None) is not None
            kind = GroupKind.SERVING if serving else GroupKind.TRAINING
            if isinstance(rec, p.Transition | p.Checkpoint):
                lock = True
                if isinstance(rec, p.Transition):
                    kind = wanted.get(name, GroupKind.UNKNOWN)
            wanted.setdefault(name, kind)
            if wanted[name] == GroupKind.UNKNOWN:
                wanted[name] = kind
            rank = getattr(rec, "rank", None)
            if rank is not None:
                ranks.add((name, rank))
        if not wanted:
            return
        names = sorted(wanted)
        rows = self._select_groups(names, ranks, lock=lock)
        self.locked = set(names) if lock else set()
        new_names: set[str] = set()
        if len(rows) < len(names):
            # Only the new rows are locked FOR UPDATE: upgrading a row this batch already
            # holds FOR KEY SHARE could deadlock with another batch doing the same.
            found = {row[_GROUP_NAME] for row in rows}
            missing = [
                ConsistencyGroup(name=n, kind=wanted[n], state_since=self.now)
                for n in names
                if n not in found
            ]
            ConsistencyGroup.objects.bulk_create(missing, ignore_conflicts=True)
            new_names = {g.name for g in missing}
            rows = [*rows, *self._select_groups(sorted(new_names), set(), lock=True)]
            self.locked |= new_names
        for row in rows:
            group = from_row(ConsistencyGroup, row)
            if group.kind == GroupKind.UNKNOWN and wanted[group.name] != GroupKind.UNKNOWN:
                group.kind = wanted[group.name]
            view = fencing.GroupView(
                name=group.name,
                generation=group.generation,
                fenced_at=group.state_since,
                restart_count=group.restart_count,
                data_cursor=group.data_cursor,
                model_version=group.model_version,
                last_checkpoint_step=group.last_checkpoint_step,
                is_new=group.name in new_names and group.last_activity is None,
                versions_seen=list(group.summary.get("versions_seen", [])),
            )
            self.groups[group.name] = (group, view)
            self.activity_read[group.name] = group.last_activity
            self.kind_read[group.name] = row[_GROUP_KIND]

    def _select_groups(
        self, names: list[str], ranks: set[tuple[str, int]], *, lock: bool
    ) -> list[Any]:
        params = {"names": names, "ranks": sorted({r for _, r in ranks})}
        with send(_GROUPS_AND_RANKS_LOCKED if lock else _GROUPS_AND_RANKS, params) as cur:
            rows = cur.fetchall()
            cur.nextset()
            for gname, rank, *values in cur.fetchall():
                self.existing_ranks[(gname, rank)] = dict(zip(_RANK_STATE, values, strict=True))
        return rows

    def _fence(self, rec: Any, ts: datetime, *, is_transition: bool = False) -> bool:
        """True when the record may move live state; flags stale writers."""
        group, view = self.groups[rec.group]
        self.touched_groups.add(group.name)
        verdict = fencing.classify_generation(view, rec.generation, is_transition=is_transition)
        if verdict == "stale":
            violation = fencing.stale_violation(view, rec.__struct_config__.tag, rec.generation, ts)
            if violation is not None:
                self.violations.append(violation)
            return False
        if verdict == "ahead":
            return False
        if view.is_new:
            view.generation = rec.generation
            group.generation = rec.generation
            view.is_new = False
        group.last_activity = max(group.last_activity or ts, ts)
        return True

    def _on_heartbeat(self, rec: p.Heartbeat, ts: datetime) -> None:
        return  # heartbeats only prove liveness (self.last_seen) and spool state

    # Each handler appends one COPY text line in the column order of COLUMNS[table].
    def _on_device_sample(self, rec: p.DeviceSample, ts: datetime) -> None:
        self.rows["devicesample"].append(
            f"{when(ts)}{self.node_cell}{text(rec.gpu)}\t{rec.index}\t{num(rec.temp_c)}\t"
            f"{num(rec.power_w)}\t{num(rec.sm_clock_mhz)}\t{num(rec.mem_clock_mhz)}\t"
            f"{num(rec.util_pct)}\t{num(rec.mem_used_bytes)}\t{num(rec.ecc_sbe)}\t"
            f"{num(rec.ecc_dbe)}\t{num(rec.retired_or_remapped_pending)}\t"
            f"{cjson(rec.throttle_reasons)}\t{num(rec.nvlink_errors)}\t{num(rec.pcie_replays)}\n"
        )
        # Only the newest sample per GPU becomes live state: turn it into a dict at flush.
        self.devices[rec.gpu] = {"index": rec.index, "rec": rec, "ts": ts}

    def _on_device_event(self, rec: p.DeviceEvent, ts: datetime) -> None:
        self.rows["deviceevent"].append(
            f"{when(ts)}{self.node_cell}{text(rec.gpu)}\t{text(rec.event)}\t{num(rec.code)}\t"
            f"{text(scrub_text(rec.detail))}\n"
        )
        if rec.event in CRITICAL_EVENTS:
            self.device_events[rec.gpu] = rec.event
            self.critical_events += 1

    def _on_step(self, rec: p.Step, ts: datetime) -> None:
        applied = self._fence(rec, ts)
        group, _ = self.groups[rec.group]
        self.rows["steprecord"].append(
            f"{when(ts)}{self.node_cell}{group.pk}\t{rec.generation}\t{flag(not applied)}\t"
            f"{rec.rank}\t{rec.step}\t{rec.tokens}\t{num(rec.data_cursor)}\t"
            f"{num(rec.duration_ms)}\t{cjson(rec.phases)}\t{num(rec.loss)}\t"
            f"{num(rec.grad_norm)}\t{num(rec.loss_scale)}\t{flag(rec.overflow)}\n"
        )
        if applied:
            entry = self._rank(group, rec.rank, rec.generation)
            if entry.get("last_step") is None or rec.step >= entry["last_step"]:
                entry.update(last_step=rec.step, last_step_at=ts)
            if rec.data_cursor is not None:
                entry["cursor_seen"] = [*entry.get("cursor_seen", []), rec.data_cursor]

    def _on_collective(self, rec: p.Collective, ts: datetime) -> None:
        applied = self._fence(rec, ts)
        group, _ = self.groups[rec.group]
        self.rows["collectivewindow"].append(
            f"{when(ts)}{self.node_cell}{group.pk}\t{rec.generation}\t{flag(not applied)}\t"
            f"{rec.rank}\t{cjson(rec.entries)}\n"
        )
        if applied:
            self._rank(group, rec.rank, rec.generation)

    def _on_process(self, rec: p.Process, ts: datetime) -> None:
        applied = self._fence(rec, ts)
        group, _ = self.groups[rec.group]
        self.rows["processrecord"].append(
            f"{when(ts)}{self.node_cell}{group.pk}\t{rec.generation}\t{flag(not applied)}\t"
            f"{rec.rank}\t{text(rec.event)}\t{num(rec.pid)}\t{text(rec.gpu)}\t"
            f"{num(rec.exit_code)}\t{num(rec.signal)}\t{text(scrub_text(rec.reason, limit=64))}\t"
            f"{text(scrub_text(rec.error_type, limit=128))}\n"
        )
        if applied:
            entry = self._rank(group, rec.rank, rec.generation)
            entry["process_state"] = rec.event
            if rec.gpu:
                entry["gpu"] = rec.gpu

    def _on_checkpoint(self, rec: p.Checkpoint, ts: datetime) -> None:
        applied = self._fence(rec, ts)
        group, view = self.groups[rec.group]
        self.rows["checkpointrecord"].append(
            f"{when(ts)}{self.node_cell}{group.pk}\t{rec.generation}\t{flag(not applied)}\t"
            f"{text(rec.checkpoint_id)}\t{num(rec.step)}\t{text(rec.phase)}\t"
            f"{cjson(rec.manifest)}\t{num(rec.duration_ms)}\t{text(scrub_text(rec.detail))}\n"
        )
        if applied:
            violation = fencing.check_checkpoint_order(view, rec)
            if violation:
                self.violations.append(violation)
            elif rec.phase == "committed" and rec.step is not None:
                view.last_checkpoint_step = rec.step
                group.last_checkpoint_step = rec.step

    def _on_transition(self, rec: p.Transition, ts: datetime) -> None:
        group, view = self.groups[rec.group]
        self.violations.extend(fencing.check_transition(view, rec))
        applied = self._fence(rec, ts, is_transition=True)
        self.rows["transitionrecord"].append(
            f"{when(ts)}{self.node_cell}{group.pk}\t{rec.generation}\t{flag(not applied)}\t"
            f"{text(rec.from_state)}\t{text(rec.to_state)}\t"
            f"{text(scrub_text(rec.reason, limit=64))}\t{num(rec.restart_count)}\t"
            f"{num(rec.world_size)}\t{cjson(rec.topology)}\t{num(rec.data_cursor)}\t"
            f"{text(rec.model_version)}\n"
        )
        if not applied:
            return
        if rec.generation > view.generation:
            view.generation = group.generation = rec.generation
            view.fenced_at = ts
            view.versions_seen = []
        group.state = rec.to_state
        group.state_since = ts
        if rec.restart_count is not None:
            view.restart_count = group.restart_count = max(view.restart_count, rec.restart_count)
        if rec.world_size is not None:
            group.world_size = rec.world_size
        if rec.topology is not None:
            group.topology = _plain(rec.topology)
        if rec.data_cursor is not None:
            view.data_cursor = group.data_cursor = rec.data_cursor
        if rec.model_version:
            if view.model_version and view.model_version not in view.versions_seen:
                view.versions_seen.append(view.model_version)
            view.model_version = group.model_version = rec.model_version
        group.summary = {**group.summary, "versions_seen": view.versions_seen[-20:]}
        self.summary_changed.add(group.name)

    def _on_serving(self, rec: p.Serving, ts: datetime) -> None:
        group, view = self.groups[rec.group]
        generation = rec.generation
        if generation is None:
            # A worker outside generation fencing (most serving stacks) follows the group.
            generation, applied = view.generation, True
            self.touched_groups.add(group.name)
            group.last_activity = max(group.last_activity or ts, ts)
        else:
            applied = self._fence(rec, ts)
        self.rows["servingwindow"].append(
            f"{when(ts)}{self.node_cell}{group.pk}\t{generation}\t{flag(not applied)}\t"
            f"{text(rec.worker)}\t{text(rec.model_version)}\t{text(rec.adapter_version)}\t"
            f"{text(rec.kv_schema)}\t{flag(rec.ready)}\t{flag(rec.draining)}\t"
            f"{cjson(rec.window)}\n"
        )

    def _on_probe(self, rec: p.Probe, ts: datetime) -> None:
        """Stored as evidence only: a probe moves no live state (issue 23)."""
        group, view = self.groups[rec.group]
        if rec.generation is None:  # a serving worker follows the group's generation
            generation, applied = view.generation, True
            self.touched_groups.add(group.name)
        else:
            generation, applied = rec.generation, self._fence(rec, ts)
        self.rows["proberecord"].append(
            f"{when(ts)}{self.node_cell}{group.pk}\t{generation}\t{flag(not applied)}\t"
            f"{text(rec.probe)}\t{num(rec.rank)}\t{text(rec.worker)}\t{num(rec.step)}\t"
            f"{num(rec.value)}\t{text(rec.checksum)}\t{num(rec.duration_ms)}\t"
            f"{text(rec.model_version)}\n"
        )

    def _rank(self, group: ConsistencyGroup, rank: int, generation: int) -> dict[str, Any]:
        return self.ranks.setdefault((group.name, rank), {"generation": generation})

    # -- writing -------------------------------------------------------------------------
    def flush(self) -> None:
        self._copy_rows()
        sql: list[str] = []
        params: dict[str, Any] = {
            "node": self.node_id, "now": self.now, "live": list(ACTION_LIVE_STATES),
            **self.agent_update,
        }  # fmt: skip
        self._devices_and_node(sql, params)
        self._ranks(sql, params)
        self._groups(sql, params)
        if self.agent_update:
            sql.append(_AGENT_UPDATE)
        sql.append(_ACTIONS_PENDING)
        card = self.want_card or self.critical_events > 0
        if card:
            sql.append(_NODE_CARD)
        selected = []  # the rows of the SELECTs, in order: actions pending, then the card
        with send(";".join(sql), params) as cur:
            while True:
                if cur.description is not None:
                    selected.append(cur.fetchone())
                if not cur.nextset():
                    break
        self.actions_pending = bool(selected[0][0])
        if card:
            self.card = _card(selected[1])
        self._write_violations()
        transaction.on_commit(lambda: _activity.update(self.activity_written))

    def _copy_rows(self) -> None:
        with connection.connection.cursor() as raw:
            for table, rows in self.rows.items():
                with raw.copy(_COPY_SQL[table]) as copy:
                    copy.write("".join(rows))

    def _devices_and_node(self, sql: list[str], params: dict[str, Any]) -> None:
        """The GPUs this batch saw, then the node's health and last_seen (worst GPU's: the
        node update runs after the GPU upserts, so it sees this batch's GPUs)."""
        devices = []
        for uuid, info in self.devices.items():
            sample = _plain(info["rec"])
            sample.pop("kind", None)
            sample["ts"] = info["ts"].isoformat()
            health = Health.CRITICAL if uuid in self.device_events else sample_health(sample)
            devices.append(
                {"uuid": uuid, "index": info["index"], "sample": sample, "seen": sample["ts"],
                 "health": health}
            )  # fmt: skip
        events_only = [u for u in self.device_events if u not in self.devices]
        params.update(
            devices=Jsonb(devices, dumps=_JSON.encode),
            events_only=Jsonb(events_only, dumps=_JSON.encode),
            seen=self.last_seen,
            touched=bool(devices or events_only),
        )
        if devices:
            sql.append(_DEVICE_UPSERT)
        if events_only:
            sql.append(_EVENT_DEVICE_UPSERT)
        sql.append(_NODE_UPDATE)

    def _ranks(self, sql: list[str], params: dict[str, Any]) -> None:
        """Rank live state: a new generation resets the cursor; steps never go backwards
        within one; every cursor the batch carries is checked against the one before."""
        if not self.ranks:
            return
        out = []
        for (gname, rank), entry in self.ranks.items():
            old = self.existing_ranks.get((gname, rank))
            generation = entry["generation"]
            new_generation = old is None or old["generation"] != generation
            last_step = None if old is None else old["last_step"]
            last_step_at = None if old is None else old["last_step_at"]
            cursor = None if new_generation or old is None else old["data_cursor"]
            if "last_step" in entry and (
                new_generation or last_step is None or entry["last_step"] >= last_step
            ):
                last_step, last_step_at = entry["last_step"], entry["last_step_at"]
            for seen in entry.get("cursor_seen", []):
                violation = fencing.check_rank_cursor(gname, rank, generation, cursor, seen)
                if violation:
                    self.violations.append(violation)
                cursor = seen
            out.append(
                {"group_id": self.groups[gname][0].pk, "rank": rank, "generation": generation,
                 "last_step": last_step, "last_step_at": last_step_at, "data_cursor": cursor,
                 "process_state": entry.get("process_state", old and old["process_state"]),
                 "gpu": entry.get("gpu", old and old["gpu"])}
            )  # fmt: skip
        params["ranks"] = Jsonb(out, dumps=_JSON.encode)
        sql.append(_RANK_UPSERT)

    def _groups(self, sql: list[str], params: dict[str, Any]) -> None:
        for i, (group, _view) in enumerate(self.groups.values()):
            params[f"g{i}_id"] = group.pk
            params[f"g{i}_last_activity"] = group.last_activity
            if group.name not in self.locked:
                # FOR KEY SHARE: write only what needs no lock to be right. A kind learned
                # from this batch's records, once (an UPDATE takes the row lock until
                # commit; a second writer re-checks `kind = 'unknown'` after it); activity
                # once it moved a second past what this process last wrote.
                if group.kind != self.kind_read.get(group.name):
                    params[f"g{i}_kind"] = group.kind
                    sql.append(_KIND_UPDATE.replace("%(g_", f"%(g{i}_"))
                now = group.last_activity
                was = max(
                    filter(None, (self.activity_read.get(group.name), _activity.get(group.pk))),
                    default=None,
                )
                if now is not None and (was is None or now - was >= ACTIVITY_STEP):
                    sql.append(_ACTIVITY_UPDATE.replace("%(g_", f"%(g{i}_"))
                    self.activity_written[group.pk] = now
                continue
            for field_name in _GROUP_WRITTEN:
                value = getattr(group, field_name)
                params[f"g{i}_{field_name}"] = Jsonb(value) if field_name in _GROUP_JSON else value
            params[f"g{i}_versions"] = (
                Jsonb(group.summary.get("versions_seen", []))
                if group.name in self.summary_changed
                else None
            )
            sql.append(_GROUP_UPDATE.replace("%(g_", f"%(g{i}_"))

    def _write_violations(self) -> None:
        seen: set[tuple[str, str, int]] = set()
        rows = []
        for v in self.violations:
            key = (v.kind, v.subject, v.generation)
            if key in seen:
                continue  # one finding per batch per contract breach, not one per record
            seen.add(key)
            group_name = v.subject.split(":", 1)[1].split("/", 1)[0]
            group = self.groups[group_name][0]
            rows.append(
                ContractViolation(
                    ts=self.now,
                    group=group,
                    generation=v.generation,
                    kind=v.kind,
                    subject=v.subject,
                    evidence=v.evidence,
                    agent_id=self.agent_id,
                )
            )
        if rows:
            ContractViolation.objects.bulk_create(rows)
        self.violation_count = len(rows)


def sample_health(sample: dict[str, Any]) -> str:
    """A GPU's health from its newest sample: DBE or pending remaps are critical."""
    if (sample.get("ecc_dbe") or 0) > 0 or (sample.get("retired_or_remapped_pending") or 0) > 0:
        return Health.CRITICAL
    temp = sample.get("temp_c")
    if set(sample.get("throttle_reasons") or []) & THROTTLE_WARN or (
        temp is not None and not math.isnan(temp) and temp >= 85
    ):
        return Health.WARNING
    return Health.OK


_ORDER = [Health.OK, Health.UNKNOWN, Health.WARNING, Health.CRITICAL, Health.DOWN]


def node_health(healths: list[str]) -> str:
    return max(healths, key=_ORDER.index, default=Health.OK)


_DEVICE_UPSERT = """
INSERT INTO console_device (uuid, node_id, index, last_sample, last_seen, health, isolated)
SELECT x.uuid, %(node)s, x.index, x.sample, x.seen, x.health, false
FROM jsonb_to_recordset(%(devices)s)
    AS x(uuid text, index int, sample jsonb, seen timestamptz, health text)
ON CONFLICT (uuid) DO UPDATE SET node_id = EXCLUDED.node_id, index = EXCLUDED.index,
    last_sample = EXCLUDED.last_sample, last_seen = EXCLUDED.last_seen, health = EXCLUDED.health
"""

# A GPU named only by an event (Xid, gpu_lost) keeps its last sample; it turns critical.
_EVENT_DEVICE_UPSERT = """
INSERT INTO console_device (uuid, node_id, index, last_sample, last_seen, health, isolated)
SELECT x.uuid, %(node)s, 0, '{}'::jsonb, %(now)s, 'critical', false
FROM jsonb_array_elements_text(%(events_only)s) AS x(uuid)
ON CONFLICT (uuid) DO UPDATE SET node_id = EXCLUDED.node_id, health = 'critical'
"""

# last_seen never moves backwards (a replayed backlog); health is the worst GPU's, and is
# recomputed only when this batch touched a GPU.
_NODE_UPDATE = """
UPDATE console_node SET
    last_seen = CASE WHEN %(seen)s::timestamptz IS NULL THEN last_seen
                     ELSE greatest(coalesce(last_seen, %(seen)s::timestamptz), %(seen)s) END,
    health = CASE WHEN NOT %(touched)s THEN health ELSE coalesce((
        SELECT o.h FROM (VALUES ('ok', 0), ('unknown', 1), ('warning', 2), ('critical', 3),
                                ('down', 4)) AS o(h, r)
        WHERE o.h IN (SELECT d.health FROM console_device d WHERE d.node_id = %(node)s)
        ORDER BY o.r DESC LIMIT 1), 'ok') END
WHERE id = %(node)s
"""

_RANK_STATE = ("generation", "last_step", "last_step_at", "data_cursor", "process_state", "gpu")

_RANK_UPSERT = """
INSERT INTO console_rank (group_id, rank, node_id, gpu, generation, last_step, last_step_at,
    data_cursor, process_state)
SELECT x.group_id, x.rank, %(node)s, coalesce(x.gpu, ''), x.generation, x.last_step,
    x.last_step_at, x.data_cursor, coalesce(x.process_state, '')
FROM jsonb_to_recordset(%(ranks)s) AS x(group_id bigint, rank int, gpu text, generation int,
    last_step bigint, last_step_at timestamptz, data_cursor bigint, process_state text)
ON CONFLICT (group_id, rank) DO UPDATE SET node_id = EXCLUDED.node_id, gpu = EXCLUDED.gpu,
    generation = EXCLUDED.generation, last_step = EXCLUDED.last_step,
    last_step_at = EXCLUDED.last_step_at, data_cursor = EXCLUDED.data_cursor,
    process_state = EXCLUDED.process_state
"""

# What ingest may change on a group; diagnosis owns the rest of `summary`, so only the
# versions seen are merged into it, and only when a transition changed them.
_GROUP_WRITTEN = (
    "kind", "state", "generation", "restart_count", "world_size", "topology", "data_cursor",
    "model_version", "last_checkpoint_step", "state_since", "last_activity",
)  # fmt: skip
_GROUP_JSON = {"topology"}
_GROUP_SET = ", ".join(f"{f} = %(g_{f})s" for f in _GROUP_WRITTEN)
_GROUP_UPDATE = f"""
UPDATE console_consistencygroup SET {_GROUP_SET},
    summary = CASE WHEN %(g_versions)s::jsonb IS NULL THEN summary
        ELSE summary || jsonb_build_object('versions_seen', %(g_versions)s::jsonb) END
WHERE id = %(g_id)s
"""  # noqa: S608 - constant column names

_KIND_UPDATE = """
UPDATE console_consistencygroup SET kind = %(g_kind)s WHERE id = %(g_id)s AND kind = 'unknown'
"""

ACTIVITY_STEP = timedelta(seconds=1)
# Per process: the newest last_activity this process committed for each group id.
_activity: dict[int, datetime] = {}
# Forward only; a concurrent writer's newer value wins (re-checked after its commit).
_ACTIVITY_UPDATE = """
UPDATE console_consistencygroup SET last_activity = %(g_last_activity)s
WHERE id = %(g_id)s AND (last_activity IS NULL OR last_activity < %(g_last_activity)s)
"""


def forget_recent() -> None:
    """Drop this process's memory of the activity it wrote (tests)."""
    _activity.clear()


def _card(row: tuple[Any, ...]) -> dict[str, Any]:
    """A node card as `console.queries.node_payloads` builds it, from `_NODE_CARD`'s row."""
    name, health, last_seen, quarantined, cordoned, devices = row
    return {
        "name": name,
        "health": health,
        "last_seen": last_seen.isoformat() if last_seen else None,
        "quarantined": quarantined,
        "cordoned": cordoned,
        "devices": msgspec.json.decode(devices) if isinstance(devices, str) else devices,
    }


# Read last in the transaction: the node and GPU rows this batch just wrote.
_NODE_CARD = """
SELECT n.name, n.health, n.last_seen, n.quarantined, n.cordoned, coalesce((
    SELECT jsonb_agg(jsonb_build_object(
        'uuid', d.uuid, 'index', d.index, 'health', d.health,
        'temp_c', d.last_sample -> 'temp_c', 'power_w', d.last_sample -> 'power_w',
        'util_pct', d.last_sample -> 'util_pct', 'sm_clock_mhz', d.last_sample -> 'sm_clock_mhz',
        'throttle_reasons', coalesce(d.last_sample -> 'throttle_reasons', '[]'::jsonb)
    ) ORDER BY d.index, d.id) FROM console_device d WHERE d.node_id = n.id), '[]'::jsonb)
FROM console_node n WHERE n.id = %(node)s
"""

_ACTIONS_PENDING = """
SELECT EXISTS (SELECT 1 FROM console_action WHERE node_id = %(node)s AND state = ANY(%(live)s))
"""

COLUMNS: dict[str, tuple[str, ...]] = {
    "devicesample": (
        "ts", "node_id", "gpu", "index", "temp_c", "power_w", "sm_clock_mhz", "mem_clock_mhz",
        "util_pct", "mem_used_bytes", "ecc_sbe", "ecc_dbe", "retired_or_remapped_pending",
        "throttle_reasons", "nvlink_errors", "pcie_replays",
    ),
    "deviceevent": ("ts", "node_id", "gpu", "event", "code", "detail"),
    "steprecord": (
        "ts", "node_id", "group_id", "generation", "stale", "rank", "step", "tokens",
        "data_cursor", "duration_ms", "phases", "loss", "grad_norm", "loss_scale", "overflow",
    ),
    "collectivewindow": ("ts", "node_id", "group_id", "generation", "stale", "rank", "entries"),
    "processrecord": (
        "ts", "node_id", "group_id", "generation", "stale", "rank", "event", "pid", "gpu",
        "exit_code", "signal", "reason", "error_type",
    ),
    "checkpointrecord": (
        "ts", "node_id", "group_id", "generation", "stale", "checkpoint_id", "step", "phase",
        "manifest", "duration_ms", "detail",
    ),
    "transitionrecord": (
        "ts", "node_id", "group_id", "generation", "stale", "from_state", "to_state", "reason",
        "restart_count", "world_size", "topology", "data_cursor", "model_version",
    ),
    "servingwindow": (
        "ts", "node_id", "group_id", "generation", "stale", "worker", "model_version",
        "adapter_version", "kv_schema", "ready", "draining", "window",
    ),
    "proberecord": (
        "ts", "node_id", "group_id", "generation", "stale", "probe", "rank", "worker", "step",
        "value", "checksum", "duration_ms", "model_version",
    ),
}  # fmt: skip

_COPY_SQL = {
    # Columns quoted: "window" is reserved.
    table: "COPY ingest_{} ({}) FROM STDIN".format(table, ", ".join(f'"{c}"' for c in cols))
    for table, cols in COLUMNS.items()
}

_GROUP_ATTNAMES = [f.attname for f in ConsistencyGroup._meta.concrete_fields]
_GROUP_NAME, _GROUP_KIND = _GROUP_ATTNAMES.index("name"), _GROUP_ATTNAMES.index("kind")

_GROUPS_AND_RANKS = f"""
SELECT {columns(ConsistencyGroup, "g")} FROM console_consistencygroup g
WHERE g.name = ANY(%(names)s) ORDER BY g.name FOR KEY SHARE;
SELECT g.name, r.rank, {", ".join(f"r.{c}" for c in _RANK_STATE)}
FROM console_consistencygroup g JOIN console_rank r ON r.group_id = g.id
WHERE g.name = ANY(%(names)s) AND r.rank = ANY(%(ranks)s)
"""  # noqa: S608 - constant column names
# The ranks read are every named group's ranks among the numbers named (a superset of the
# pairs, looked up by pair): both lists are tiny and go through (name) and (group, rank)
# indexes. A join on a jsonb_to_recordset of the pairs was planned as a scan of all ranks.
_GROUPS_AND_RANKS_LOCKED = _GROUPS_AND_RANKS.replace("FOR KEY SHARE;", "FOR UPDATE;")
