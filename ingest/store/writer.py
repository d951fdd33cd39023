"""One batch's rows and live-state changes, collected per record and written in bulk.

`BatchWriter` reads the groups and ranks a batch names (fencing each record against its
group's generation), formats every record as a COPY line of its table, and folds the
newest state per GPU, rank and group; `flush` then COPYs the rows and sends every
live-state write in one multi-statement round trip. Must not commit or open transactions:
`batch.ingest_batch` owns the transaction.

Ownership is decided here, over what the batch's two reads already returned (no query per
record): a GPU, a rank's placement and a group's transitions belong to the node that
first reported them. A claim without evidence is stored as telemetry, never applied, and
recorded as a contract violation (as fencing treats a stale record); so is a node's GPU or
new group beyond its limit (settings INGEST_MAX_GPUS_PER_NODE, INGEST_NEW_GROUPS_PER_HOUR).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import msgspec
from django.conf import settings
from django.db import transaction
from psycopg.types.json import Jsonb

from agents import protocol as p
from agents import xid
from agents.gpu_health import CRITICAL, CRITICAL_EVENTS, sample_health
from console import events
from console.choices import ACTION_LIVE_STATES, GroupKind
from console.models import ConsistencyGroup, Node
from console.policy import fleet_health
from ingest import fencing, ratelimit
from ingest.auth import CREDENTIAL_LIVE, CredentialRevokedError
from ingest.copytext import flag, num, text, when
from ingest.copytext import json as cjson
from ingest.models import ContractViolation
from ingest.rawsql import from_row, send
from ingest.scrub import scrub_record
from ingest.store.fleet_card import NODE_CARD, node_card
from ingest.store.live_state import (
    ACTIONS_PENDING,
    ACTIVITY_STEP,
    ACTIVITY_UPDATE,
    DEVICE_UPSERT,
    EVENT_DEVICE_UPSERT,
    GROUP_JSON,
    GROUP_KIND,
    GROUP_NAME,
    GROUP_UPDATE,
    GROUP_WRITTEN,
    GROUPS_AND_RANKS,
    GROUPS_AND_RANKS_LOCKED,
    KIND_UPDATE,
    NODE_UPDATE,
    RANK_STATE,
    RANK_UPSERT,
    recent_activity,
)
from ingest.store.receipts import AGENT_UPDATE
from ingest.store.tables import copy_rows

# The progress (steps, checkpoints) an older generation stored past a new fence, newest
# first per generation: read once per fence, a restart's worth of rows at most.
WRITTEN_PAST_FENCE = """
SELECT 'step', generation, max(ts) FROM ingest_steprecord
 WHERE group_id = %(g)s AND generation < %(gen)s AND ts > %(fence)s GROUP BY generation
UNION ALL
SELECT 'checkpoint', generation, max(ts) FROM ingest_checkpointrecord
 WHERE group_id = %(g)s AND generation < %(gen)s AND ts > %(fence)s GROUP BY generation
"""

# Kernel events that end or endanger a rank's process: diagnose without waiting (issue 18).
HOST_URGENT = p.URGENT_HOST_EVENTS

# msgspec encodes contract Structs straight to JSON bytes, 5-10x faster than json.dumps of
# their to_builtins() copies; the JSON is the same (omit_defaults, ISO times with "Z").
_JSON = msgspec.json.Encoder()


_NO_GROUP = {"gpu", "node"}

# Records that change a group's state: a batch holding one locks its groups FOR UPDATE
# (`BatchWriter._load_groups`); every other batch shares them FOR KEY SHARE.
GROUP_LOCKING = (p.Transition, p.Checkpoint)


def _plain(struct: Any) -> Any:
    return msgspec.to_builtins(struct) if struct is not None else None


def _shape(topology: Any) -> dict[str, int] | None:
    """A world's whole shape, defaults included: `to_builtins` omits a degree of 1 (the
    wire's `omit_defaults`), and `{}` for DP 1 x TP 1 reads as "not reported"."""
    return msgspec.structs.asdict(topology) if topology is not None else None


class BatchWriter:
    """Collects rows and live-state changes for one batch, then writes them in bulk."""

    def __init__(
        self, *, node: Node, agent_id: str, now: datetime, shift: timedelta, want_card: bool
    ) -> None:
        self.node, self.agent_id, self.now, self.shift = node, agent_id, now, shift
        self.node_id = node.pk
        self.rows: dict[str, list[str]] = defaultdict(list)  # COPY text lines per table
        self.node_cell = f"\t{self.node_id}\t"  # every row's node_id, between its neighbours
        self.devices: dict[str, dict[str, Any]] = {}
        self.throttled: dict[str, dict[str, Any]] = {}  # gpu -> its newest throttled sample
        self.device_events: dict[str, str] = {}
        self.ranks: dict[tuple[str, int], dict[str, Any]] = {}
        self.groups: dict[str, tuple[ConsistencyGroup, fencing.GroupView]] = {}
        self.violations: list[fencing.Violation] = []
        self.touched_groups: set[str] = set()
        self.violation_count = 0
        self.critical_events = 0
        self.faults: list[dict[str, Any]] = []  # events that latch (console.actions.fleet)
        self.resets: list[str] = []  # GPUs the agent reports reset: repair evidence
        self.conditions: list[dict[str, Any]] = []  # a port down, a full disk (the node's)
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
        self.card: events.NodePayload | None = None
        # Ownership: set by ingest_batch from the receipt's round trip.
        self.device_owners: dict[str, tuple[int, datetime | None]] = {}
        self.node_gpus = 0
        self.launcher_group = ""
        self.hosted: set[str] = set()  # named groups this node hosts ranks of
        self.ranked: set[str] = set()  # named groups that have ranks at all
        self.refused_groups: set[str] = set()  # new groups over the node's hourly limit
        self.created: list[str] = []  # groups this batch created
        # A cached credential to confirm live in the last send (ingest.auth), and the
        # node's health that send read before this batch's writes.
        self.credential_id: int | None = None
        self.node_health: str | None = None
        # The group read's plan and rows, when it went with the receipt's round trip.
        self._plan: tuple[dict[str, str], set[tuple[str, int]], bool] | None = None
        self._prefetched: list[Any] | None = None

    # -- collection --------------------------------------------------------------------
    def add(self, records: list[Any]) -> None:
        self._load_groups(records)
        if self.refused_groups:
            refused = self.refused_groups
            records = [r for r in records if getattr(r, "group", None) not in refused]
        handlers: dict[type[Any], Callable[[Any, datetime], None]] = {
            p.Heartbeat: self._on_heartbeat,
            p.DeviceSample: self._on_device_sample,
            p.DeviceEvent: self._on_device_event,
            p.Process: self._on_process,
            p.Step: self._on_step,
            p.Collective: self._on_collective,
            p.Checkpoint: self._on_checkpoint,
            p.Transition: self._on_transition,
            p.Serving: self._on_serving,
            p.HostEvent: self._on_host_event,
            p.NetEvent: self._on_net_event,
            p.NetSample: self._on_net_sample,
            p.HostSample: self._on_host_sample,
            p.ProcessGroups: self._on_process_groups,
            p.Probe: self._on_probe,
        }
        shift = self.shift if self.shift else None
        last_seen = self.last_seen
        for rec in records:
            ts = rec.ts if shift is None else rec.ts - shift
            if last_seen is None or ts > last_seen:
                last_seen = ts
            # Once, here: every row, latched fault, incident and audit entry below reads it.
            scrub_record(rec)
            handlers[type(rec)](rec, ts)
        self.last_seen = last_seen

    def _load_groups(self, records: list[Any]) -> None:
        """Read the groups the batch names, creating new ones, and the live state of the
        ranks it names: no round trip of its own when `group_read` went with the receipt's.

        A batch that changes group state (a transition or a checkpoint) locks the group rows
        FOR UPDATE (name order: no deadlocks), and so does creating a group. Steps, collectives and
        serving windows take FOR KEY SHARE: they never wait for each other, so the thousands
        of nodes of one job do not queue on their group's row, yet a transition still waits
        for them and they for it, so fencing sees the generation that commits. They may
        only move `last_activity` forward (`_groups`).
        """
        if self._plan is None:
            self._plan = self._plan_groups(records)
        wanted, ranks, lock = self._plan
        if not wanted:
            return
        names = sorted(wanted)
        if self._prefetched is None:
            sql, params = self._groups_query(names, ranks, lock=lock)
            with send(sql, params) as cur:
                self._read_groups(cur, lock=lock)
        rows = self._prefetched or []
        self.locked = set(names) if lock else set()
        new_names: set[str] = set()
        if len(rows) < len(names):
            # Only the new rows are locked FOR UPDATE: upgrading a row this batch already
            # holds FOR KEY SHARE could deadlock with another batch doing the same.
            found = {row[GROUP_NAME] for row in rows}
            missing = [
                ConsistencyGroup(
                    name=n, kind=wanted[n], state_since=self.now, created_by_id=self.node_id
                )
                for n in names
                if n not in found
            ]
            missing = self._admit_new_groups(missing)
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
            if view.is_new:
                self.created.append(group.name)
            self.activity_read[group.name] = group.last_activity
            self.kind_read[group.name] = row[GROUP_KIND]

    def _admit_new_groups(self, missing: list[ConsistencyGroup]) -> list[ConsistencyGroup]:
        """The new groups this node may still create this hour; the rest are refused."""
        allowed = ratelimit.take_new_groups(
            self.node_id, len(missing), limit=settings.INGEST_NEW_GROUPS_PER_HOUR
        )
        if allowed >= len(missing):
            return missing
        refused = missing[allowed:]
        self.refused_groups = {g.name for g in refused}
        self.violations.append(
            fencing.Violation(
                "new_group_limit",
                f"node:{self.node.name}",
                0,
                {"refused": len(refused), "groups": sorted(self.refused_groups)[:20],
                 "limit_per_hour": settings.INGEST_NEW_GROUPS_PER_HOUR},
            )
        )  # fmt: skip
        return missing[:allowed]

    def _plan_groups(self, records: list[Any]) -> tuple[dict[str, str], set[tuple[str, int]], bool]:
        """The groups the batch names (with the kind its records imply), the (group, rank)
        pairs, and whether the groups are to be locked FOR UPDATE."""
        wanted: dict[str, str] = {}
        ranks: set[tuple[str, int]] = set()
        lock = False
        for rec in records:
            name = getattr(rec, "group", None)
            if name is None:
                continue
            serving = isinstance(rec, p.Serving) or getattr(rec, "worker", None) is not None
            kind = GroupKind.SERVING if serving else GroupKind.TRAINING
            if isinstance(rec, GROUP_LOCKING):
                lock = True
                if isinstance(rec, p.Transition):
                    kind = wanted.get(name, GroupKind.UNKNOWN)
            wanted.setdefault(name, kind)
            if wanted[name] == GroupKind.UNKNOWN:
                wanted[name] = kind
            rank = getattr(rec, "rank", None)
            if rank is not None:
                ranks.add((name, rank))
        return wanted, ranks, lock

    def group_read(
        self, records: list[Any]
    ) -> tuple[str, dict[str, Any], Callable[[Any], None]] | None:
        """The groups' and ranks' read of `add(records)`, to send in the receipt's round
        trip (ingest.store.receipts): its SQL, its parameters and the reader of its
        results. None when the batch names no group."""
        self._plan = self._plan_groups(records)
        wanted, ranks, lock = self._plan
        if not wanted:
            return None
        sql, params = self._groups_query(sorted(wanted), ranks, lock=lock)
        return sql, params, lambda cur: self._read_groups(cur, lock=lock)

    def _groups_query(
        self, names: list[str], ranks: set[tuple[str, int]], *, lock: bool
    ) -> tuple[str, dict[str, Any]]:
        params = {"names": names, "ranks": sorted({r for _, r in ranks}), "node": self.node_id}
        return GROUPS_AND_RANKS_LOCKED if lock else GROUPS_AND_RANKS, params

    def _read_groups(self, cur: Any, *, lock: bool) -> None:
        """Read `_groups_query`'s results from `cur`, positioned at its first."""
        rows = cur.fetchall()
        cur.nextset()
        for gname, rank, *values in cur.fetchall():
            self.existing_ranks[(gname, rank)] = dict(zip(RANK_STATE, values, strict=True))
        if lock:  # who may transition: the groups this node hosts ranks of
            cur.nextset()
            for gname, hosted, ranked in cur.fetchall():
                if hosted:
                    self.hosted.add(gname)
                if ranked:
                    self.ranked.add(gname)
        self._prefetched = rows

    def _select_groups(
        self, names: list[str], ranks: set[tuple[str, int]], *, lock: bool
    ) -> list[Any]:
        sql, params = self._groups_query(names, ranks, lock=lock)
        with send(sql, params) as cur:
            self._read_groups(cur, lock=lock)
        return self._prefetched or []

    def _written_past_the_fence(self, group: ConsistencyGroup, view: Any, fence: datetime) -> None:
        """An older generation's progress stamped after this fence that reached the service
        before it (the launcher's node delivered the transition late: its agent between
        sends, its spool after an outage) is split brain too, as it is when it arrives
        after the fence: the verdict must not depend on which record came first."""
        with send(
            WRITTEN_PAST_FENCE, {"g": group.pk, "gen": view.generation, "fence": fence}
        ) as cur:
            for kind, generation, at in cur.fetchall():
                violation = fencing.stale_violation(view, kind, generation, at)
                if violation is not None:
                    self.violations.append(violation)

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
            f"{cjson(rec.throttle_reasons)}\t{num(rec.nvlink_errors)}\t{num(rec.pcie_replays)}\t"
            f"{num(rec.mem_util_pct)}\n"
        )
        # Only the newest sample per GPU becomes live state: turn it into a dict at flush.
        self.devices[rec.gpu] = {"index": rec.index, "rec": rec, "ts": ts}
        if rec.throttle_reasons:  # and the newest throttled one, kept after clocks recover
            self.throttled[rec.gpu] = {
                "ts": ts.isoformat(), "throttle_reasons": list(rec.throttle_reasons),
                "temp_c": rec.temp_c, "power_w": rec.power_w, "sm_clock_mhz": rec.sm_clock_mhz,
            }  # fmt: skip

    def _on_device_event(self, rec: p.DeviceEvent, ts: datetime) -> None:
        self.rows["deviceevent"].append(
            f"{when(ts)}{self.node_cell}{text(rec.gpu)}\t{text(rec.event)}\t{num(rec.code)}\t"
            f"{text(rec.detail)}\t{text(rec.recovery_action)}\n"
        )
        if rec.event == fleet_health.GPU_RESET_EVENT:
            self.resets.append(rec.gpu)
        if rec.event in CRITICAL_EVENTS:
            self.critical_events += 1  # diagnose and push at once, whatever its class
            # Only a hardware fault turns the GPU (and so its node) critical: an application
            # Xid (13, 31, 43, 94...) leaves a healthy GPU (agents/xid.py decides).
            if xid.is_hardware_fault(rec.event, rec.code, rec.recovery_action):
                self.device_events[rec.gpu] = rec.event
            # What needs repair latches, after the live-state writes (ingest_batch).
            if fleet_health.repair_needed(rec.event, rec.code, rec.recovery_action) != "none":
                self.faults.append(
                    {"gpu": rec.gpu, "event": rec.event, "code": rec.code,
                     "recovery_action": rec.recovery_action, "detail": rec.detail or "",
                     "ts": ts.isoformat()}
                )  # fmt: skip

    # -- host, network and kernel evidence (issue 18): rows only, no live state ----------
    def _on_host_event(self, rec: p.HostEvent, ts: datetime) -> None:
        self.rows["hostevent"].append(
            f"{when(ts)}{self.node_cell}{text(rec.event)}\t{text(rec.device)}\t{num(rec.code)}\t"
            f"{num(rec.pid)}\t{text(rec.comm)}\t{text(rec.severity)}\n"
        )
        if rec.event in HOST_URGENT:
            self.critical_events += 1  # an OOM kill or a machine check: diagnose at once

    def _on_net_event(self, rec: p.NetEvent, ts: datetime) -> None:
        self.rows["netevent"].append(
            f"{when(ts)}{self.node_cell}{text(rec.port)}\t{text(rec.link)}\t{text(rec.event)}\t"
            f"{text(rec.state)}\t{num(rec.rate_gbps)}\t{num(rec.prev_rate_gbps)}\t"
            f"{cjson(rec.counters)}\n"
        )
        if rec.event == "link_down" and not fleet_health.port_up(rec.state):
            # A port that was up went down and stays down (a flap reads up again).
            self.conditions.append(
                {"kind": "nic_down", "key": rec.port,
                 "summary": f"port {rec.port} ({rec.link}) on {self.node.name} is down "
                            f"(state {rec.state or 'unknown'})",
                 "evidence": {"port": rec.port, "link": rec.link, "state": rec.state,
                              "counters": dict(rec.counters), "ts": ts.isoformat()}}
            )  # fmt: skip

    def _on_net_sample(self, rec: p.NetSample, ts: datetime) -> None:
        self.rows["netsample"].append(
            f"{when(ts)}{self.node_cell}{text(rec.port)}\t{text(rec.link)}\t{text(rec.state)}\t"
            f"{num(rec.rate_gbps)}\t{cjson(rec.counters)}\t{num(rec.interval_s)}\n"
        )

    def _on_host_sample(self, rec: p.HostSample, ts: datetime) -> None:
        self.rows["hostsample"].append(
            f"{when(ts)}{self.node_cell}{num(rec.mem_some_avg10)}\t{num(rec.mem_full_avg10)}\t"
            f"{num(rec.io_full_avg10)}\t{num(rec.swap_used_bytes)}\t"
            f"{num(rec.swap_total_bytes)}\t{num(rec.d_state)}\t{cjson(rec.disks)}\n"
        )
        for disk in rec.disks:
            if fleet_health.local_disk(disk.device) and fleet_health.disk_full(
                disk.free_bytes, disk.total_bytes
            ):
                free, total = disk.free_bytes or 0, disk.total_bytes or 0
                self.conditions.append(
                    {"kind": "disk_full", "key": disk.root,
                     "summary": f"checkpoint disk {disk.device} ({disk.root}) on "
                                f"{self.node.name} is full: {free / 2**30:.1f} GiB free of "
                                f"{total / 2**30:.0f} GiB",
                     "evidence": {"root": disk.root, "device": disk.device, "free_bytes": free,
                                  "total_bytes": total, "ts": ts.isoformat()}}
                )  # fmt: skip

    def _on_step(self, rec: p.Step, ts: datetime) -> None:
        applied = self._fence(rec, ts)
        group, _ = self.groups[rec.group]
        self.rows["steprecord"].append(
            f"{when(ts)}{self.node_cell}{group.pk}\t{rec.generation}\t{flag(not applied)}\t"
            f"{rec.rank}\t{rec.step}\t{rec.tokens}\t{num(rec.data_cursor)}\t"
            f"{num(rec.duration_ms)}\t{cjson(rec.phases)}\t{num(rec.loss)}\t"
            f"{num(rec.grad_norm)}\t{num(rec.loss_scale)}\t{flag(rec.overflow)}\t"
            f"{num(rec.model_flops)}\t{num(rec.hw_flops)}\t{num(rec.lr)}\n"
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

    def _on_process_groups(self, rec: p.ProcessGroups, ts: datetime) -> None:
        applied = self._fence(rec, ts)
        group, _ = self.groups[rec.group]
        self.rows["processgroupsrecord"].append(
            f"{when(ts)}{self.node_cell}{group.pk}\t{rec.generation}\t{flag(not applied)}\t"
            f"{rec.rank}\t{cjson(rec.groups)}\n"
        )
        if applied:
            self._rank(group, rec.rank, rec.generation)

    def _on_process(self, rec: p.Process, ts: datetime) -> None:
        applied = self._fence(rec, ts)
        group, _ = self.groups[rec.group]
        self.rows["processrecord"].append(
            f"{when(ts)}{self.node_cell}{group.pk}\t{rec.generation}\t{flag(not applied)}\t"
            f"{rec.rank}\t{text(rec.event)}\t{num(rec.pid)}\t{text(rec.gpu)}\t"
            f"{num(rec.exit_code)}\t{num(rec.signal)}\t{text(rec.reason)}\t"
            f"{text(rec.error_type)}\t{text(rec.message)}\t{text(rec.launcher_root_cause)}\n"
        )
        if applied:
            entry = self._rank(group, rec.rank, rec.generation)
            entry["process_state"] = rec.event
            if rec.gpu:
                entry["gpu"] = rec.gpu
            if rec.job:
                group.scheduler_job = rec.job

    def _on_checkpoint(self, rec: p.Checkpoint, ts: datetime) -> None:
        applied = self._fence(rec, ts)
        group, view = self.groups[rec.group]
        self.rows["checkpointrecord"].append(
            f"{when(ts)}{self.node_cell}{group.pk}\t{rec.generation}\t{flag(not applied)}\t"
            f"{text(rec.checkpoint_id)}\t{num(rec.step)}\t{text(rec.phase)}\t"
            f"{cjson(rec.manifest)}\t{num(rec.duration_ms)}\t{text(rec.detail)}\t"
            f"{num(rec.data_cursor)}\n"
        )
        if applied:
            violation = fencing.check_checkpoint_order(view, rec)
            if violation:
                self.violations.append(violation)
            elif rec.phase == "committed" and rec.step is not None:
                view.last_checkpoint_step = rec.step
                group.last_checkpoint_step = rec.step

    def _transition_refused(
        self, rec: p.Transition, group: ConsistencyGroup, view: fencing.GroupView
    ) -> bool:
        """True (and a violation recorded) when this node may not make this transition.

        Transitions come from a node that hosts ranks of the group (or places one earlier in
        this batch), the batch that creates it, or the group's launcher token; a group with
        no ranks yet (a serving deployment, a job before its first placement) only from the
        node whose batch created it. A generation moves at most INGEST_MAX_GENERATION_JUMP
        at once.
        """
        name = rec.group
        if view.is_new or name == self.launcher_group:
            allowed = True
        elif name in self.ranked:
            allowed = name in self.hosted or self._places_here(name)
        else:  # nothing placed to check against: the creator (none recorded: nobody)
            allowed = group.created_by_id == self.node_id
        kind = "unauthorized_transition"
        if allowed and not view.is_new:
            jump = rec.generation - view.generation
            if jump > settings.INGEST_MAX_GENERATION_JUMP:
                allowed, kind = False, "generation_jump"
        if allowed:
            return False
        self.violations.append(
            fencing.Violation(
                kind,
                f"group:{name}",
                view.generation,
                {"node": self.node.name, "record_generation": rec.generation,
                 "active_generation": view.generation, "to_state": rec.to_state,
                 "max_jump": settings.INGEST_MAX_GENERATION_JUMP},
            )
        )  # fmt: skip
        return True

    def _places_here(self, name: str) -> bool:
        """True when a record earlier in this batch placed a rank of group `name` on this
        node, and not as a claim `_rank_move_refused` would refuse: a job's rank-0 node
        starts its ranks and announces the job in one batch, while its peers' agents may
        have delivered (and placed their ranks) first."""
        return any(
            gname == name and self._may_place(gname, rank, entry)
            for (gname, rank), entry in self.ranks.items()
        )

    def _on_transition(self, rec: p.Transition, ts: datetime) -> None:
        group, view = self.groups[rec.group]
        if self._transition_refused(rec, group, view):
            self.touched_groups.add(group.name)
            applied = False
        else:
            self.violations.extend(fencing.check_transition(view, rec))
            applied = self._fence(rec, ts, is_transition=True)
        self.rows["transitionrecord"].append(
            f"{when(ts)}{self.node_cell}{group.pk}\t{rec.generation}\t{flag(not applied)}\t"
            f"{text(rec.from_state)}\t{text(rec.to_state)}\t"
            f"{text(rec.reason)}\t{num(rec.restart_count)}\t"
            f"{num(rec.world_size)}\t{cjson(_shape(rec.topology))}\t{num(rec.data_cursor)}\t"
            f"{text(rec.model_version)}\n"
        )
        if not applied:
            return
        if rec.generation > view.generation:
            view.generation = group.generation = rec.generation
            view.fenced_at = ts
            view.versions_seen = []
            self._written_past_the_fence(group, view, ts)
            # Checkpoint order is judged within a generation: a restart may restore from
            # an older checkpoint than the newest (poisoned ones skipped) and commit anew.
            view.last_checkpoint_step = group.last_checkpoint_step = None
        group.state = rec.to_state
        group.state_since = ts
        if rec.restart_count is not None:
            view.restart_count = group.restart_count = max(view.restart_count, rec.restart_count)
        if rec.world_size is not None:
            group.world_size = rec.world_size
        if rec.job:
            group.scheduler_job = rec.job
        if rec.topology is not None:
            group.topology = _shape(rec.topology)
        if rec.data_cursor is not None:
            view.data_cursor = group.data_cursor = rec.data_cursor
        if rec.objectives is not None:
            # Issue 20: the launcher's declaration replaces its previous one key by key; an
            # operator's (console.actions.groups) is kept beside it and wins when merged.
            declared = {**(group.objectives or {}).get("launcher", {}), **_plain(rec.objectives)}
            group.objectives = {**(group.objectives or {}), "launcher": declared}
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
    def flush(self, *, copy: bool = True) -> None:
        """Write the batch; with `copy=False` the caller COPYs `self.rows` later, in the
        same transaction (group commit: one COPY per table for several batches)."""
        if copy:
            copy_rows(self.rows)
        sql: list[str] = []
        params: dict[str, Any] = {
            "node": self.node_id, "now": self.now, "live": list(ACTION_LIVE_STATES),
            **self.agent_update,
        }  # fmt: skip
        if self.credential_id is not None:
            sql.append(CREDENTIAL_LIVE)
            params["credential"] = self.credential_id
        self._devices_and_node(sql, params)
        self._ranks(sql, params)
        self._groups(sql, params)
        if self.agent_update:
            sql.append(AGENT_UPDATE)
        sql.append(ACTIONS_PENDING)
        card = self.want_card or self.critical_events > 0
        if card:
            sql.append(NODE_CARD)
        # The rows of the SELECTs, in order: the credential, actions pending, the card.
        selected: list[Any] = []
        with send(";".join(sql), params) as cur:
            while True:
                if cur.description is not None:
                    selected.append(cur.fetchone())
                if not cur.nextset():
                    break
        if self.credential_id is not None:
            live = selected.pop(0)
            if live is None:
                raise CredentialRevokedError
            self.node_health = live[0]
        self.actions_pending = bool(selected[0][0])
        if card:
            self.card = node_card(selected[1])
        self._write_violations()
        transaction.on_commit(lambda: recent_activity.update(self.activity_written))

    def _devices_and_node(self, sql: list[str], params: dict[str, Any]) -> None:
        """The GPUs this batch saw, then the node's health and last_seen (worst GPU's: the
        node update runs after the GPU upserts, so it sees this batch's GPUs)."""
        self._refuse_foreign_devices()
        params["move_before"] = self.now - timedelta(seconds=settings.INGEST_DEVICE_MOVE_AFTER_S)
        devices = []
        for uuid, info in self.devices.items():
            sample = _plain(info["rec"])
            sample.pop("kind", None)
            sample["ts"] = info["ts"].isoformat()
            if uuid in self.throttled:
                sample["throttled"] = self.throttled[uuid]
            health = CRITICAL if uuid in self.device_events else sample_health(sample)
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
            sql.append(DEVICE_UPSERT)
        if events_only:
            sql.append(EVENT_DEVICE_UPSERT)
        sql.append(NODE_UPDATE)

    def _owned_elsewhere(self, uuid: str) -> bool:
        """True when another node owns this GPU and has reported it recently."""
        owner = self.device_owners.get(uuid)
        if owner is None or owner[0] == self.node_id:
            return False
        seen = owner[1]
        move_after = timedelta(seconds=settings.INGEST_DEVICE_MOVE_AFTER_S)
        return seen is not None and seen >= self.now - move_after

    def _refuse_foreign_devices(self) -> None:
        """Drop GPUs this node may not claim: another node's (still reported by it), and
        new ones beyond the node's limit. Each refusal is a violation; rows stay stored."""
        named = [*self.devices, *(u for u in self.device_events if u not in self.devices)]
        room = settings.INGEST_MAX_GPUS_PER_NODE - self.node_gpus
        refused: dict[str, str] = {}
        for uuid in named:
            if self._owned_elsewhere(uuid):
                refused[uuid] = "device_claim"
            elif uuid not in self.device_owners:
                if room <= 0:
                    refused[uuid] = "device_limit"
                room -= 1
        for uuid, kind in refused.items():
            self.devices.pop(uuid, None)
            self.device_events.pop(uuid, None)
            owner = self.device_owners.get(uuid)
            self.violations.append(
                fencing.Violation(
                    kind,
                    f"gpu:{uuid}",
                    0,
                    {"node": self.node.name, "owner_node_id": owner[0] if owner else None,
                     "max_gpus_per_node": settings.INGEST_MAX_GPUS_PER_NODE},
                )
            )  # fmt: skip

    def _may_place(self, gname: str, rank: int, entry: dict[str, Any]) -> bool:
        """A rank placed on another node moves only with evidence: a new generation (its
        transition re-placed the ranks) or the rank's process exited on the old node."""
        old = self.existing_ranks.get((gname, rank))
        return (
            old is None
            or old["node_id"] == self.node_id
            or entry["generation"] != old["generation"]
            or old["process_state"] == "exited"
        )

    def _rank_move_refused(self, gname: str, rank: int, entry: dict[str, Any]) -> bool:
        """`_may_place`'s refusal, recorded as a `rank_claim`."""
        if self._may_place(gname, rank, entry):
            return False
        old = self.existing_ranks[(gname, rank)]
        self.violations.append(
            fencing.Violation(
                "rank_claim",
                f"rank:{gname}/{rank}",
                entry["generation"],
                {"node": self.node.name, "owner_node_id": old["node_id"],
                 "owner_process_state": old["process_state"]},
            )
        )  # fmt: skip
        return True

    def _ranks(self, sql: list[str], params: dict[str, Any]) -> None:
        """Rank live state: a new generation resets the cursor; steps never go backwards
        within one; every cursor the batch carries is checked against the one before."""
        if not self.ranks:
            return
        out = []
        for (gname, rank), entry in self.ranks.items():
            if self._rank_move_refused(gname, rank, entry):
                continue
            if entry.get("gpu") and self._owned_elsewhere(entry["gpu"]):
                del entry["gpu"]  # a rank names only its own node's GPUs
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
        if not out:
            return
        params["ranks"] = Jsonb(out, dumps=_JSON.encode)
        sql.append(RANK_UPSERT)

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
                    sql.append(KIND_UPDATE.replace("%(g_", f"%(g{i}_"))
                now = group.last_activity
                read, wrote = self.activity_read.get(group.name), recent_activity.get(group.pk)
                was = max(filter(None, (read, wrote)), default=None)
                if now is not None and (was is None or now - was >= ACTIVITY_STEP):
                    sql.append(ACTIVITY_UPDATE.replace("%(g_", f"%(g{i}_"))
                    self.activity_written[group.pk] = now
                continue
            for field_name in GROUP_WRITTEN:
                value = getattr(group, field_name)
                params[f"g{i}_{field_name}"] = Jsonb(value) if field_name in GROUP_JSON else value
            params[f"g{i}_versions"] = (
                Jsonb(group.summary.get("versions_seen", []))
                if group.name in self.summary_changed
                else None
            )
            sql.append(GROUP_UPDATE.replace("%(g_", f"%(g{i}_"))

    def _write_violations(self) -> None:
        seen: set[tuple[str, str, int]] = set()
        rows = []
        for v in self.violations:
            key = (v.kind, v.subject, v.generation)
            if key in seen:
                continue  # one finding per batch per contract breach, not one per record
            seen.add(key)
            scope, _, rest = v.subject.partition(":")
            # gpu: and node: subjects (ownership, limits) name no group.
            entry = self.groups.get(rest.split("/", 1)[0]) if scope not in _NO_GROUP else None
            group = entry[0] if entry else None
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
