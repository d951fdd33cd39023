"""Store one validated batch atomically: receipt, telemetry (COPY), live state, contracts.

Either everything of a batch is written or nothing is. The (agent_id, seq) receipt is
inserted first, so a replayed batch stops there and changes nothing. Telemetry goes in
with COPY (no ORM objects per record: the hot path budget is validation and encoding).
Owns the transaction and the order of the round trips; the SQL lives beside it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import psycopg
from django.db import connection, transaction

from agents import protocol as p
from agents.vocab import HEALTH_DOWN
from console import actions, events
from console.models import Node
from ingest.auth import CREDENTIAL_LIVE, CredentialRevokedError
from ingest.ownership import Claimant
from ingest.rawsql import send
from ingest.store.delivery import batch_delay_s
from ingest.store.errors import check_future, check_shift, out_of_range
from ingest.store.fleet_card import NODE_CARD, node_card
from ingest.store.receipts import (
    AGENT_DUPLICATE,
    Receipts,
    agent_update,
    attested_jobs,
    claim_receipt,
)
from ingest.store.tables import copy_rows
from ingest.store.writer import BatchWriter

_GPU_RECORDS = (p.DeviceSample, p.DeviceEvent, p.Process)  # the records that name a GPU


@dataclass
class IngestResult:
    ack_seq: int
    duplicate: bool
    records: int = 0
    groups: list[str] = field(default_factory=list)
    new_groups: list[str] = field(default_factory=list)  # created by this batch
    nodes: list[str] = field(default_factory=list)
    violations: int = 0
    device_events: int = 0  # Xid/DBE/GPU-lost records: push and diagnose without delay
    actions_pending: bool = True  # the node has actions in flight: dispatch on the response
    card: events.NodePayload | None = None  # the node's fleet card as committed, when asked for
    receipts: Receipts = field(default_factory=Receipts)  # the agent's, as the batch found them


def _fleet_health(
    node: Node, batch: p.Batch, agent: dict[str, Any], writer: BatchWriter, now: datetime
) -> bool:
    """In the batch's transaction (rare: a reboot, a fault, a node back from silence),
    through the write path: a silent node's incident resolves; a new boot_id is repair
    evidence, then each fault that needs repair latches (a fault of the new boot latches
    again); a port down or a full local disk opens the node's condition incident. Stored
    iff the batch is. True when it changed anything the node card shows."""
    who = f"agent:{node.name}"
    if node.health == HEALTH_DOWN:  # the sweep marked it silent (as authenticated this batch)
        actions.node_reporting(node_id=node.pk, actor=who, now=now)
    before, after = agent.get("boot_id") or "", batch.agent.boot_id or ""
    rebooted = bool(before and after and before != after)
    if rebooted:
        actions.record_repair_evidence(
            node_id=node.pk,
            evidence="node_reboot",
            actor=who,
            now=now,
            detail={"boot_id_before": before, "boot_id": after, "agent": batch.agent.id},
        )
    for gpu in dict.fromkeys(writer.resets):
        actions.record_repair_evidence(
            node_id=node.pk,
            evidence="gpu_reset",
            gpu=gpu,
            actor=who,
            now=now,
            detail={"event": "gpu_reset", "gpu": gpu, "agent": batch.agent.id},
        )
    for fault in writer.faults:
        actions.latch_fault(
            node_id=node.pk,
            gpu=fault["gpu"],
            event=fault["event"],
            code=fault["code"],
            recovery_action=fault["recovery_action"],
            detail=fault["detail"],
            actor=who,
            now=now,
            evidence={"ts": fault["ts"], "agent": batch.agent.id, "seq": batch.seq},
        )
    for condition in writer.conditions:  # a port down, a full disk: the node sweep plans it
        actions.open_condition(node_id=node.pk, actor=who, now=now, **condition)
    return rebooted or bool(writer.resets or writer.faults)


def ingest_batch(
    *,
    node: Node,
    batch: p.Batch,
    now: datetime,
    max_future_s: int,
    want_card: bool = False,
    launcher_group: str = "",
    credential_id: int | None = None,
) -> IngestResult:
    """Store one batch in one transaction and about five round trips, whatever its size.

    Round trips: receipt + agent state + groups + the ranks the batch names; one COPY per
    record table; then every live-state write in one multi-statement send. Raw SQL here
    because the ORM's statement compilation cost more than Postgres did (docs/performance.md).
    With `want_card` (or a critical device event) the last send also reads the node's
    fleet card, so the live push after commit costs no query of its own.

    Ownership (docs/security.md): the receipt's round trip also reads who owns the GPUs the
    batch names, and the groups' round trip which of them this node hosts ranks of; what
    the node may not claim is stored as telemetry, not applied, and recorded as a
    violation about the node. `launcher_group` is the group a launcher token speaks for
    (ingest.ownership; the view refuses its records of anything else).

    With `credential_id` (a credential authenticated from ingest.auth's cache) the last
    send also confirms it is still live and reads the node's health as it is now; a revoked
    one raises CredentialRevokedError and nothing is stored.
    """
    skew, shift = check_batch(batch, now, max_future_s)
    with transaction.atomic(), connection.wrap_database_errors:
        writer = store_batch(
            node=node,
            batch=batch,
            now=now,
            skew=skew,
            shift=shift,
            want_card=want_card,
            launcher_group=launcher_group,
            credential_id=credential_id,
        )
        if isinstance(writer, Receipts):
            return IngestResult(ack_seq=batch.seq, duplicate=True, receipts=writer)
        try:
            copy_rows(writer.rows)
        except psycopg.errors.DataError as exc:
            raise out_of_range(exc, batch) from None
    return writer_result(writer, batch)


def check_batch(batch: p.Batch, now: datetime, max_future_s: int) -> tuple[timedelta, timedelta]:
    """The batch's clock skew and the shift applied to its times; raises a RecordError
    (400) for records too far in the future. No database: run it before the transaction."""
    skew = batch.sent_at - now
    shift = skew if abs(skew) > timedelta(seconds=5) else timedelta(0)
    check_future(batch, max_future_s)
    if shift:
        check_shift(batch, shift)
    return skew, shift


def store_batch(
    *,
    node: Node,
    batch: p.Batch,
    now: datetime,
    skew: timedelta,
    shift: timedelta,
    want_card: bool = False,
    launcher_group: str = "",
    credential_id: int | None = None,
) -> BatchWriter | Receipts:
    """Everything of `ingest_batch` but the transaction and the COPY of the writer's rows
    (the caller's: group commit COPYs several batches' rows at once). For a replay, only
    the agent's receipts as it found them.
    Must run inside a transaction (and `connection.wrap_database_errors`)."""
    gpus = {r.gpu for r in batch.records if isinstance(r, _GPU_RECORDS) and r.gpu}
    writer = BatchWriter(
        node=node, agent_id=batch.agent.id, now=now, shift=shift, want_card=want_card
    )
    # The groups and ranks are read (and locked) in the receipt's round trip.
    claim = claim_receipt(batch, node, now, gpus, then=writer.group_read(batch.records))
    agent = claim.agent
    if agent is None:
        sql, params = AGENT_DUPLICATE, {"agent": batch.agent.id, "now": now}
        if credential_id is not None:
            sql, params = f"{CREDENTIAL_LIVE};{sql}", {**params, "credential": credential_id}
        with send(sql, params) as cur:
            if credential_id is not None and cur.fetchone() is None:
                raise CredentialRevokedError
        return claim.receipts
    writer.receipts = claim.receipts
    writer.device_owners, writer.node_gpus = claim.device_owners, claim.node_gpus
    writer.claimant = Claimant(
        node_id=node.pk,
        node=node.name,
        launcher_group=launcher_group,
        attested=attested_jobs(agent, batch) if writer.groups_named() else None,
    )
    writer.credential_id = credential_id
    writer.agent_update = {
        **agent_update(agent, node, batch, now, skew),
        "delivery_delay_s": batch_delay_s(batch, now, shift),
    }
    writer.add(batch.records)
    try:
        writer.flush(copy=False)
    except psycopg.errors.DataError as exc:
        raise out_of_range(exc, batch) from None
    if writer.node_health is not None and writer.node_health != node.health:
        node = copy.copy(node)  # a cached credential's node is shared by threads
        node.health = writer.node_health
    if launcher_group:  # a launcher's batch says nothing of its node's health
        return writer
    if _fleet_health(node, batch, agent, writer, now) and writer.card is not None:
        # The card was read before the lifecycle moved: read it again (rare).
        with send(NODE_CARD, {"node": node.pk}) as cur:
            row = cur.fetchone()
        if row is not None:
            writer.card = node_card(row)
    return writer


def writer_result(writer: BatchWriter, batch: p.Batch) -> IngestResult:
    """What the view needs of a stored batch, once its transaction committed."""
    return IngestResult(
        ack_seq=batch.seq,
        duplicate=False,
        records=len(batch.records),
        groups=sorted(writer.touched_groups),
        new_groups=writer.created,
        nodes=[writer.node.name],
        violations=writer.violation_count,
        device_events=writer.critical_events,
        actions_pending=writer.actions_pending,
        card=writer.card,
        receipts=writer.receipts,
    )
