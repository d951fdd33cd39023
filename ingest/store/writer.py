"""One batch's rows and live-state changes, collected per record and written in bulk.

`BatchWriter` reads the groups and ranks a batch names (ingest.store.batch_state), hands
each record to its kind's handler (ingest.store.handlers: one module per record family,
each fencing its records through ingest.store.fences and formatting one COPY line of its
table), then `flush` COPYs the rows and sends every live-state write in one
multi-statement round trip. Must not commit or open transactions: `batch.ingest_batch`
owns the transaction.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import msgspec
from django.conf import settings
from django.db import transaction
from psycopg.types.json import Jsonb

from agents.gpu_health import CRITICAL, sample_health
from console.choices import ACTION_LIVE_STATES
from ingest import fencing
from ingest.auth import CREDENTIAL_LIVE, CredentialRevokedError
from ingest.models import ContractViolation
from ingest.rawsql import send
from ingest.scrub import scrub_record
from ingest.store.batch_state import plain
from ingest.store.fences import Fences
from ingest.store.fleet_card import NODE_CARD, node_card
from ingest.store.handlers import HANDLERS
from ingest.store.live_state import (
    ACTIONS_PENDING,
    ACTIVITY_STEP,
    ACTIVITY_UPDATE,
    DEVICE_UPSERT,
    EVENT_DEVICE_UPSERT,
    GROUP_JSON,
    GROUP_UPDATE,
    GROUP_UPDATE_FORMING,
    GROUP_WRITTEN,
    KIND_UPDATE,
    MEMBERS_DECLARE,
    MEMBERS_JOIN,
    NODE_UPDATE,
    RANK_UPSERT,
    recent_activity,
)
from ingest.store.receipts import AGENT_UPDATE
from ingest.store.tables import copy_rows

# msgspec encodes contract Structs straight to JSON bytes, 5-10x faster than json.dumps of
# their to_builtins() copies; the JSON is the same (omit_defaults, ISO times with "Z").
_JSON = msgspec.json.Encoder()


_NO_GROUP = {"gpu", "node"}


class BatchWriter(Fences):
    """Collects rows and live-state changes for one batch, then writes them in bulk."""

    # -- collection --------------------------------------------------------------------
    def add(self, records: list[Any]) -> None:
        self._load_groups(records)
        if self.refused_groups:
            refused = self.refused_groups
            records = [r for r in records if getattr(r, "group", None) not in refused]
        shift = self.shift if self.shift else None
        last_seen = self.last_seen
        for rec in records:
            ts = rec.ts if shift is None else rec.ts - shift
            if last_seen is None or ts > last_seen:
                last_seen = ts
            # Once, here: every row, latched fault, incident and audit entry below reads it.
            scrub_record(rec)
            HANDLERS[type(rec)](self, rec, ts)
        # A launcher's records are its job's, not proof that the node it runs on is alive.
        self.last_seen = None if self.claimant.launcher_group else last_seen

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
            "delivery_delay_s": None,  # ingest.store.batch sets it with the agent's update
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
            sample = plain(info["rec"])
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
            self.claim(
                kind,
                f"gpu:{uuid}",
                0,
                {
                    "owner_node_id": owner[0] if owner else None,
                    "max_gpus_per_node": settings.INGEST_MAX_GPUS_PER_NODE,
                },
            )

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
                self.start_rendezvous(gname, owner)
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
