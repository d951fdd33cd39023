"""One batch's state as the writer collects it, and the read of the groups and ranks it names.

`BatchState` holds what the record handlers (ingest.store.handlers) fold a batch into: COPY
lines per table, the newest state per GPU, rank and group, violations and claims. It reads
the groups a batch names (creating new ones, within the node's hourly limit) and the live
state of the ranks it names, in one round trip, or in the receipt's (`group_read`). Must
not commit or open transactions: `batch.ingest_batch` owns the transaction.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import msgspec
from django.conf import settings

from agents import protocol as p
from console import events
from console.choices import GroupKind
from console.models import ConsistencyGroup, Node
from ingest import fencing, ownership, ratelimit
from ingest.rawsql import from_row, send
from ingest.store.live_state import (
    GROUP_KIND,
    GROUP_NAME,
    GROUPS_AND_RANKS,
    GROUPS_AND_RANKS_LOCKED,
    RANK_STATE,
)
from ingest.store.receipts import Receipts

# Records that change a group's state: a batch holding one locks its groups FOR UPDATE
# (`BatchWriter._load_groups`); every other batch shares them FOR KEY SHARE. A process
# record naming the scheduler job may bind the group to it (ingest.ownership).
GROUP_LOCKING = (p.Transition, p.Checkpoint)


def locks_group(rec: Any) -> bool:
    return isinstance(rec, GROUP_LOCKING) or (type(rec) is p.Process and rec.job is not None)


def plain(struct: Any) -> Any:
    return msgspec.to_builtins(struct) if struct is not None else None


class BatchState:
    """What one batch's records fold into, and the groups and ranks they name."""

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
        self.receipts = Receipts()  # the agent's as the batch found them, for its 202
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

    def rank(self, group: ConsistencyGroup, rank: int, generation: int) -> dict[str, Any]:
        return self.ranks.setdefault((group.name, rank), {"generation": generation})
