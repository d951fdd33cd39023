"""One batch's rows and live-state changes, collected per record and written in bulk.

`BatchWriter` reads the groups and ranks a batch names (fencing each record against its
group's generation), formats every record as a COPY line of its table, and folds the
newest state per GPU, rank and group; `flush` then COPYs the rows and sends every
live-state write in one multi-statement round trip. Must not commit or open transactions:
`batch.ingest_batch` owns the transaction.

Ownership is decided here, over what the batch's two reads already returned (no query per
record): a GPU belongs to the node that first reported it, a group to its job's nodes and
its launcher (ingest.ownership decides who). A claim without evidence is stored as
telemetry, never applied, and recorded as a violation about the claimant, never the
group it claimed (as fencing treats a stale record); so is a node's GPU or new group
beyond its limit (settings INGEST_MAX_GPUS_PER_NODE, INGEST_NEW_GROUPS_PER_HOUR).
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
from agents import vocab, xid
from agents.gpu_health import CRITICAL, CRITICAL_EVENTS, sample_health
from console import events
from console.choices import ACTION_LIVE_STATES, GroupKind
from console.models import ConsistencyGroup, Node
from console.policy import fleet_health
from ingest import fencing, ownership, ratelimit
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
    GROUP_UPDATE_FORMING,
    GROUP_WRITTEN,
    GROUPS_AND_RANKS,
    GROUPS_AND_RANKS_LOCKED,
    KIND_UPDATE,
    MEMBERS_DECLARE,
    MEMBERS_JOIN,
    NODE_UPDATE,
    RANK_STATE,
    RANK_UPSERT,
    RANKS_OF_NON_ATTESTERS_DROP,
    RANKS_OF_UNDECLARED_DROP,
    VIOLATIONS_DETACH,
    recent_activity,
)
from ingest.store.receipts import AGENT_UPDATE
from ingest.store.tables import copy_rows

# The progress (steps, checkpoints) an older generation stored past a new fence, newest
# first per generation: read once per fence, a restart's worth of rows at most.
# Stored but not applied (stale: a stranger's refused progress) is the stranger's claim, not
# the group's split brain.
WRITTEN_PAST_FENCE = """
SELECT 'step', generation, max(ts) FROM ingest_steprecord
 WHERE group_id = %(g)s AND generation < %(gen)s AND ts > %(fence)s AND NOT stale
 GROUP BY generation
UNION ALL
SELECT 'checkpoint', generation, max(ts) FROM ingest_checkpointrecord
 WHERE group_id = %(g)s AND generation < %(gen)s AND ts > %(fence)s AND NOT stale
 GROUP BY generation
"""

# Kernel events that end or endanger a rank's process: diagnose without waiting.
HOST_URGENT = p.URGENT_HOST_EVENTS

# msgspec encodes contract Structs straight to JSON bytes, 5-10x faster than json.dumps of
# their to_builtins() copies; the JSON is the same (omit_defaults, ISO times with "Z").
_JSON = msgspec.json.Encoder()


_NO_GROUP = {"gpu", "node"}

# Records that change a group's state: a batch holding one locks its groups FOR UPDATE
# (`BatchWriter._load_groups`); every other batch shares them FOR KEY SHARE. A process
# record naming the scheduler job may bind the group to it (ingest.ownership).
GROUP_LOCKING = (p.Transition, p.Checkpoint)


def locks_group(rec: Any) -> bool:
    return isinstance(rec, GROUP_LOCKING) or (type(rec) is p.Process and rec.job is not None)


# Records a rank's node sends: from a node that does not own their group (ingest.ownership)
# they are stored as telemetry and never applied.
_RANK_RECORDS = (p.Step, p.Collective, p.Process, p.ProcessGroups, p.Probe, p.Checkpoint)


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
        self.claimant = ownership.Claimant(node_id=node.pk, node=node.name)
        self.owners: dict[str, ownership.Owner] = {}
        self.joins: set[str] = set()  # groups whose first rendezvous this node joins
        # group -> (the nodes a transition declared, the generation they are declared for)
        self.declared: dict[str, tuple[list[str], int]] = {}
        self.drops: dict[str, list[str]] = defaultdict(list)  # group -> a reset's statements
        self._claimed: set[tuple[str, str]] = set()  # (kind, what): one violation each
        self.started: set[str] = set()  # groups whose first rendezvous this batch started
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
        # A launcher's records are its job's, not proof that the node it runs on is alive.
        self.last_seen = None if self.claimant.launcher_group else last_seen

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
                self._read_groups(cur)
        rows = self._prefetched or []
        self.locked = set(names) if lock else set()
        new_names: set[str] = set()
        if len(rows) < len(names):
            # Only the new rows are locked FOR UPDATE: upgrading a row this batch already
            # holds FOR KEY SHARE could deadlock with another batch doing the same.
            found = {row[GROUP_NAME] for row in rows}
            attested = self.claimant.attested or frozenset()
            # A group named after a job this node's agent attests is that job's from the start.
            missing = [
                ConsistencyGroup(
                    name=n,
                    kind=wanted[n],
                    state_since=self.now,
                    created_by_id=self.node_id,
                    owner_job=n if n in attested else "",
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
            membership = row[-2]  # -1: one of its nodes; N: left at generation N; None: never
            self.owners[group.name] = ownership.Owner(
                owner_job=group.owner_job,
                member=membership == -1,
                has_members=row[-1],
                left_generation=membership if membership is not None and membership >= 0 else None,
                rendezvous_until=group.rendezvous_until,
                world_size=group.world_size,
                created_by_id=group.created_by_id,
                window_start=group.generation_window_start,
                window_advance=group.generation_window_advance,
            )
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
                {
                    "refused": len(refused),
                    "groups": sorted(self.refused_groups)[:20],
                    "limit_per_hour": settings.INGEST_NEW_GROUPS_PER_HOUR,
                },
            )
        )
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
            if locks_group(rec):
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

    def groups_named(self) -> bool:
        """The batch names a group (`group_read` planned its read)."""
        return bool(self._plan and self._plan[0])

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
        return sql, params, self._read_groups

    def _groups_query(
        self, names: list[str], ranks: set[tuple[str, int]], *, lock: bool
    ) -> tuple[str, dict[str, Any]]:
        params = {
            "names": names,
            "ranks": sorted({r for _, r in ranks}),
            "node": self.node_id,
            "node_name": self.node.name,
        }
        return GROUPS_AND_RANKS_LOCKED if lock else GROUPS_AND_RANKS, params

    def _read_groups(self, cur: Any) -> None:
        """Read `_groups_query`'s results from `cur`, positioned at its first."""
        rows = cur.fetchall()
        cur.nextset()
        for gname, rank, *values in cur.fetchall():
            self.existing_ranks[(gname, rank)] = dict(zip(RANK_STATE, values, strict=True))
        self._prefetched = rows

    def _select_groups(
        self, names: list[str], ranks: set[tuple[str, int]], *, lock: bool
    ) -> list[Any]:
        sql, params = self._groups_query(names, ranks, lock=lock)
        with send(sql, params) as cur:
            self._read_groups(cur)
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
        """True when the record may move live state; flags stale writers, and refuses the
        rank records of a node that does not own the group (ingest.ownership)."""
        group, view = self.groups[rec.group]
        self.touched_groups.add(group.name)
        owner = self.owners[group.name]
        if not is_transition:
            if rec.generation <= view.generation and self._foreign(rec, owner):
                return False  # a newer generation's is only stored (`ahead`), whoever sent it
            forming = not view.is_new and owner.forming() and getattr(rec, "rank", None) is not None
            if (view.is_new or forming) and rec.generation > settings.INGEST_MAX_GENERATION_JUMP:
                self._claim(
                    "generation_jump",
                    f"group:{group.name}",
                    view.generation,
                    {
                        "record_generation": rec.generation,
                        "active_generation": 0,
                        "max_jump": settings.INGEST_MAX_GENERATION_JUMP,
                    },
                )
                return False
            if forming:  # its first rank: the group's first rendezvous starts at its generation
                if rec.generation != view.generation:
                    self._reset(group, view, owner, rec.generation, ts)
                self._start_rendezvous(group.name, owner)
        verdict = fencing.classify_generation(view, rec.generation, is_transition=is_transition)
        if verdict == "stale":
            violation = fencing.stale_violation(view, rec.__struct_config__.tag, rec.generation, ts)
            if violation is None:
                return False
            # The group's own old generation writing: a host, a node joining its rendezvous
            # earlier in this batch, or one that held the rank in that generation.
            ours = is_transition or ownership.hosts(owner, self.claimant) or self._held_here(rec)
            if ours or (not owner.owner_job and self._places_here(group.name)):
                self.violations.append(violation)
            else:  # a node that is none of its hosts: its claim, not the group's split brain
                self._claim(
                    "rank_claim",
                    f"group:{group.name}",
                    rec.generation,
                    {**violation.evidence, "contract": violation.kind},
                )
            return False
        if verdict == "ahead":
            return False
        if view.is_new:
            view.generation = rec.generation
            group.generation = rec.generation
            view.is_new = False
        group.last_activity = max(group.last_activity or ts, ts)
        return True

    def _foreign(self, rec: Any, owner: ownership.Owner) -> bool:
        """True (and the claim recorded) for a rank's record (or, once the group has
        owners, a checkpoint) from a node that may not write the group. A record of a
        generation the group has not reached is never applied, so no claim: a spare's agent
        may deliver its ranks before the host that declared it delivers the transition."""
        if type(rec) is p.Checkpoint:
            if not (owner.owner_job or owner.has_members):
                return False
        elif not isinstance(rec, _RANK_RECORDS) or getattr(rec, "rank", None) is None:
            return False
        who = self.claimant
        if ownership.hosts(owner, who) or who.launches(rec.group):
            return False
        if ownership.rendezvous_open(owner, self.now):
            # Joining the first rendezvous: only with a rank it may take (decided here, not
            # at flush, so a refused claim's rows are stored as not applied); a checkpoint
            # only from a node that places a rank (or while none is placed).
            rank = getattr(rec, "rank", None)
            if rank is None:
                if not owner.has_members or self._places_here(rec.group):
                    return False
            else:
                old = self.existing_ranks.get((rec.group, rank))
                if ownership.may_place(owner, who, rank, rec.generation, old, self.now):
                    return False
        if self._held_here(rec):  # its old generation, still writing: the group's split brain
            return False
        evidence = {
            "record_kind": rec.__struct_config__.tag,
            "rank": getattr(rec, "rank", None),
            "owner_job": owner.owner_job or None,
        }
        self._claim("rank_claim", f"group:{rec.group}", rec.generation, evidence)
        return True

    def _held_here(self, rec: Any) -> bool:
        """This node held the record's rank in the record's (older) generation: a node the
        group has left since (replaced, its allocation ended) whose old process lives on."""
        rank = getattr(rec, "rank", None)
        if rank is None or rec.generation >= self.groups[rec.group][1].generation:
            return False
        if ownership.was_host(self.owners[rec.group], rec.generation):
            return True
        old = self.existing_ranks.get((rec.group, rank))
        return old is not None and (old["node_id"], old["generation"]) == (
            self.node_id,
            rec.generation,
        )

    def _claim(
        self, kind: str, what: str, generation: int, evidence: dict[str, Any] | None = None
    ) -> None:
        """Record a refused claim: evidence about this node (the claimant), never about the
        group or rank it claimed (no incident of that group cites it). One per claimed
        thing and kind a batch."""
        if (kind, what) in self._claimed:
            return
        self._claimed.add((kind, what))
        self.violations.append(
            fencing.Violation(
                kind, f"node:{self.node.name}", generation, {"claimed": what, **(evidence or {})}
            )
        )

    def _start_rendezvous(self, name: str, owner: ownership.Owner) -> None:
        if owner.rendezvous_until is None:
            owner.rendezvous_until = self.now + timedelta(seconds=settings.INGEST_RENDEZVOUS_S)
            self.started.add(name)

    def _reset(
        self,
        group: ConsistencyGroup,
        view: fencing.GroupView,
        owner: ownership.Owner,
        generation: int,
        ts: datetime,
    ) -> None:
        """Start the group afresh at `generation`: what a node announced before its job's
        ranks came (a name squatted ahead of its job), or what its launcher reclaims."""
        view.generation = group.generation = generation
        view.fenced_at = group.state_since = ts
        group.state = vocab.INITIALIZING
        view.restart_count = group.restart_count = 0
        view.data_cursor = group.data_cursor = None
        view.model_version = group.model_version = ""
        view.versions_seen = []
        view.last_checkpoint_step = group.last_checkpoint_step = None
        view.is_new = False
        group.world_size = owner.world_size = None
        group.topology = {}
        group.objectives = {k: v for k, v in (group.objectives or {}).items() if k != "launcher"}
        owner.window_start, owner.window_advance = None, 0
        group.summary = {**group.summary, "versions_seen": []}
        self.summary_changed.add(group.name)
        if VIOLATIONS_DETACH not in self.drops[group.name]:
            self.drops[group.name].append(VIOLATIONS_DETACH)

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
                "ts": ts.isoformat(),
                "throttle_reasons": list(rec.throttle_reasons),
                "temp_c": rec.temp_c,
                "power_w": rec.power_w,
                "sm_clock_mhz": rec.sm_clock_mhz,
            }

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
                    {
                        "gpu": rec.gpu,
                        "event": rec.event,
                        "code": rec.code,
                        "recovery_action": rec.recovery_action,
                        "detail": rec.detail or "",
                        "ts": ts.isoformat(),
                    }
                )

    # -- host, network and kernel evidence: rows only, no live state ----------
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
                {
                    "kind": "nic_down",
                    "key": rec.port,
                    "summary": f"port {rec.port} ({rec.link}) on {self.node.name} is down "
                    f"(state {rec.state or 'unknown'})",
                    "evidence": {
                        "port": rec.port,
                        "link": rec.link,
                        "state": rec.state,
                        "counters": dict(rec.counters),
                        "ts": ts.isoformat(),
                    },
                }
            )

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
                    {
                        "kind": "disk_full",
                        "key": disk.root,
                        "summary": f"checkpoint disk {disk.device} ({disk.root}) on "
                        f"{self.node.name} is full: {free / 2**30:.1f} GiB free of "
                        f"{total / 2**30:.0f} GiB",
                        "evidence": {
                            "root": disk.root,
                            "device": disk.device,
                            "free_bytes": free,
                            "total_bytes": total,
                            "ts": ts.isoformat(),
                        },
                    }
                )

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
        if rec.job is not None:
            self._take_name(rec.job, rec.group, rec.generation, ts)
        applied = self._fence(rec, ts)
        group, _ = self.groups[rec.group]
        self.rows["processrecord"].append(
            f"{when(ts)}{self.node_cell}{group.pk}\t{rec.generation}\t{flag(not applied)}\t"
            f"{rec.rank}\t{text(rec.event)}\t{num(rec.pid)}\t{text(rec.gpu)}\t"
            f"{num(rec.exit_code)}\t{num(rec.signal)}\t{text(rec.reason)}\t"
            f"{text(rec.error_type)}\t{text(rec.message)}\t{text(rec.launcher_root_cause)}\n"
        )
        if not applied:
            return
        if not self.claimant.launches(group.name):  # a launcher hosts no rank: evidence only
            entry = self._rank(group, rec.rank, rec.generation)
            entry["process_state"] = rec.event
            if rec.gpu:
                entry["gpu"] = rec.gpu
        if rec.job is not None:
            self._set_job(rec.job, group)

    def _set_job(self, job: str, group: ConsistencyGroup) -> None:
        """The group's scheduler job, as a node that may transition it names it (its
        launcher, a host, one placing a rank in this batch, its creator while nothing is
        placed); a host whose agent attests the job binds the group to it
        (ingest.ownership). Anyone else's is a `job_claim` about them."""
        owner, who = self.owners[group.name], self.claimant
        if job == group.scheduler_job and (owner.owner_job or not ownership.binds(owner, who, job)):
            return
        # Whoever may transition the group (a host, its creator while nothing is placed).
        host = self.groups[group.name][1].is_new or ownership.may_transition(
            owner, who, group=group.name, places_here=self._places_here(group.name)
        )
        if not ownership.may_set_job(owner, who, job, group=group.name, host=host):
            attested = sorted(who.attested) if who.attested is not None else None
            evidence = {"job": job, "group_job": group.scheduler_job or None, "attested": attested}
            self._claim("job_claim", f"group:{group.name}", group.generation, evidence)
            return
        group.scheduler_job = job
        if host and ownership.binds(owner, who, job):
            self._bind(group.name, job)

    def _take_name(self, job: str, name: str, generation: int, ts: datetime) -> None:
        """A group named after the job this node's agent attests is that job's: taken from
        whoever held the name (ranks of nodes that do not attest the job are dropped) and
        started afresh at the job's generation, unless it was the job's already."""
        owner, who = self.owners[name], self.claimant
        if who.launches(name) or not ownership.takes_name(owner, who, job, name):
            return
        group, view = self.groups[name]
        if not view.is_new:
            self._reset(group, view, owner, generation, ts)
        group.scheduler_job = job
        self._bind(name, job)

    def _bind(self, name: str, job: str) -> None:
        """Bind the group to `job`: from now on its hosts are the nodes that attest the job,
        and the ranks other nodes hold (a first rendezvous's strangers) are dropped."""
        owner, (group, view) = self.owners[name], self.groups[name]
        owner.owner_job = group.owner_job = job
        owner.member, owner.has_members = False, False
        if not view.is_new:
            self.drops[name].append(RANKS_OF_NON_ATTESTERS_DROP)
            self.existing_ranks = {
                k: v
                for k, v in self.existing_ranks.items()
                if k[0] != name or v["node_id"] == self.node_id
            }

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
        """True (and a claim recorded) when this node may not make this transition.

        Who may is ingest.ownership's `may_transition` (the launcher, a host, a node placing
        a rank earlier in this batch, the batch that creates the group, or its creator while
        nothing is placed). A generation moves at most INGEST_MAX_GENERATION_JUMP at once
        (a new group starts at most that high) and INGEST_GENERATION_ADVANCE_PER_HOUR in an
        hour, whoever moves it.
        """
        name, owner, who = rec.group, self.owners[rec.group], self.claimant
        allowed = view.is_new or ownership.may_transition(owner, who, group=name, places_here=False)
        if not allowed and not owner.owner_job and ownership.rendezvous_open(owner, self.now):
            allowed = self._places_here(name)
        kind = "" if allowed else "unauthorized_transition"
        jump = rec.generation - (0 if view.is_new else view.generation)
        if kind or jump <= 0 or self._reclaims(rec, view):
            pass
        elif jump > settings.INGEST_MAX_GENERATION_JUMP:
            kind = "generation_jump"
        elif not view.is_new and not ownership.within_budget(
            owner, jump, self.now, per_hour=settings.INGEST_GENERATION_ADVANCE_PER_HOUR
        ):
            kind = "generation_rate"
        if not kind:
            return False
        self._claim(
            kind,
            f"group:{name}",
            view.generation,
            {
                "record_generation": rec.generation,
                "active_generation": view.generation,
                "to_state": rec.to_state,
                "max_jump": settings.INGEST_MAX_GENERATION_JUMP,
                "advance_per_hour": settings.INGEST_GENERATION_ADVANCE_PER_HOUR,
            },
        )
        return True

    def _reclaims(self, rec: p.Transition, view: fencing.GroupView) -> bool:
        """The group's launcher declares its nodes at a generation below the group's: it
        reclaims the group (a name a stranger held since its first rendezvous)."""
        return (
            self.claimant.launches(rec.group)
            and rec.nodes is not None
            and not self.owners[rec.group].owner_job
            and not view.is_new
            and rec.generation < view.generation
        )

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
        if rec.job is not None:
            self._take_name(rec.job, rec.group, rec.generation, ts)
        group, view = self.groups[rec.group]
        owner = self.owners[group.name]
        if self._transition_refused(rec, group, view):
            self.touched_groups.add(group.name)
            applied = False
        else:
            if self._reclaims(rec, view):
                self._reset(group, view, owner, rec.generation, ts)
                self.drops[group.name].append(RANKS_OF_UNDECLARED_DROP)
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
            group.world_size = owner.world_size = rec.world_size
        if rec.job is not None:
            self._set_job(rec.job, group)
        if rec.nodes is not None and not owner.owner_job:
            self._declare(group.name, owner, rec.nodes)
        if rec.topology is not None:
            group.topology = _shape(rec.topology)
        if rec.data_cursor is not None:
            view.data_cursor = group.data_cursor = rec.data_cursor
        if rec.objectives is not None:
            # the launcher's declaration replaces its previous one key by key; an
            # operator's (console.actions.groups) is kept beside it and wins when merged.
            declared = {**(group.objectives or {}).get("launcher", {}), **_plain(rec.objectives)}
            group.objectives = {**(group.objectives or {}), "launcher": declared}
        if rec.model_version:
            if view.model_version and view.model_version not in view.versions_seen:
                view.versions_seen.append(view.model_version)
            view.model_version = group.model_version = rec.model_version
        group.summary = {**group.summary, "versions_seen": view.versions_seen[-20:]}
        self.summary_changed.add(group.name)

    def _declare(self, name: str, owner: ownership.Owner, nodes: list[str]) -> None:
        """The nodes of this generation's rendezvous, declared by a host or the launcher:
        they replace the group's nodes, and no other node joins."""
        generation = self.groups[name][0].generation
        self.declared[name] = (sorted(set(nodes)), generation)
        owner.member = self.node.name in nodes
        if not owner.member:
            owner.left_generation = generation
        owner.has_members = bool(nodes)
        if owner.rendezvous_until is None or owner.rendezvous_until > self.now:
            owner.rendezvous_until = self.now

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
        """Stored as evidence only: a probe moves no live state."""
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
            "node": self.node_id,
            "now": self.now,
            "live": list(ACTION_LIVE_STATES),
            **self.agent_update,
        }
        if self.credential_id is not None:
            sql.append(CREDENTIAL_LIVE)
            params["credential"] = self.credential_id
        self._devices_and_node(sql, params)
        self._ownership(sql, params)
        self._ranks(sql, params)
        if self.joins:
            params.update(
                joins=[self.groups[g][0].pk for g in sorted(self.joins)], node_name=self.node.name
            )
            sql.append(MEMBERS_JOIN)
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
                {
                    "uuid": uuid,
                    "index": info["index"],
                    "sample": sample,
                    "seen": sample["ts"],
                    "health": health,
                }
            )
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
            self._claim(
                kind,
                f"gpu:{uuid}",
                0,
                {
                    "owner_node_id": owner[0] if owner else None,
                    "max_gpus_per_node": settings.INGEST_MAX_GPUS_PER_NODE,
                },
            )

    def _may_place(self, gname: str, rank: int, entry: dict[str, Any]) -> bool:
        """A rank's placement on this node (ingest.ownership.may_place): a host moves a rank
        with evidence (a new generation re-placed the ranks, or its process exited on its
        old node); a node that hosts nothing only takes one nobody held, while the group's
        first rendezvous is open."""
        old = self.existing_ranks.get((gname, rank))
        return ownership.may_place(
            self.owners[gname], self.claimant, rank, entry["generation"], old, self.now
        )

    def _rank_move_refused(self, gname: str, rank: int, entry: dict[str, Any]) -> bool:
        """`_may_place`'s refusal, recorded as a `rank_claim` about this node."""
        if self._may_place(gname, rank, entry):
            return False
        old = self.existing_ranks.get((gname, rank))
        self._claim(
            "rank_claim",
            f"rank:{gname}/{rank}",
            entry["generation"],
            {
                "owner_node_id": old["node_id"] if old else None,
                "owner_process_state": old["process_state"] if old else None,
            },
        )
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
            owner = self.owners[gname]
            if not owner.owner_job and not owner.member:  # joins the first rendezvous
                owner.member = owner.has_members = True
                self.joins.add(gname)
                self._start_rendezvous(gname, owner)
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
                {
                    "group_id": self.groups[gname][0].pk,
                    "rank": rank,
                    "generation": generation,
                    "last_step": last_step,
                    "last_step_at": last_step_at,
                    "data_cursor": cursor,
                    "process_state": entry.get("process_state", old and old["process_state"]),
                    "gpu": entry.get("gpu", old and old["gpu"]),
                }
            )
        if not out:
            return
        params["ranks"] = Jsonb(out, dumps=_JSON.encode)
        sql.append(RANK_UPSERT)

    def _ownership(self, sql: list[str], params: dict[str, Any]) -> None:
        """Before the ranks: a reset's ranks dropped, a generation's nodes declared."""
        for i, (name, statements) in enumerate(sorted(self.drops.items())):
            group = self.groups[name][0]
            params[f"x{i}_group"], params[f"x{i}_job"] = group.pk, group.owner_job
            params[f"x{i}_nodes"] = self.declared.get(name, ([], 0))[0]
            sql.extend(s.replace("%(d_", f"%(x{i}_") for s in statements)
        for i, (name, (nodes, generation)) in enumerate(sorted(self.declared.items())):
            params[f"m{i}_group"], params[f"m{i}_nodes"] = self.groups[name][0].pk, nodes
            params[f"m{i}_gen"] = generation
            sql.append(MEMBERS_DECLARE.replace("%(d_", f"%(m{i}_"))

    def _groups(self, sql: list[str], params: dict[str, Any]) -> None:
        for i, (group, _view) in enumerate(self.groups.values()):
            params[f"g{i}_id"] = group.pk
            params[f"g{i}_last_activity"] = group.last_activity
            owner = self.owners[group.name]
            group.owner_job, group.rendezvous_until = owner.owner_job, owner.rendezvous_until
            group.generation_window_start = owner.window_start
            group.generation_window_advance = owner.window_advance
            if group.name not in self.locked and group.name not in self.started:
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
            # Started its first rendezvous under a shared lock: once, by the first to commit.
            update = GROUP_UPDATE if group.name in self.locked else GROUP_UPDATE_FORMING
            sql.append(update.replace("%(g_", f"%(g{i}_"))

    def _write_violations(self) -> None:
        seen: set[tuple[str, str, int, Any]] = set()
        rows = []
        for v in self.violations:
            key = (v.kind, v.subject, v.generation, v.evidence.get("claimed"))
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
