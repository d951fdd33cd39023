"""Store one validated batch atomically: receipt, telemetry (COPY), live state, contracts.

Either everything of a batch is written or nothing is. The (agent_id, seq) receipt is
inserted first, so a replayed batch stops there and changes nothing. Telemetry goes in
with COPY (no ORM objects per record: the hot path budget is validation and encoding).
Owns the transaction and the order of the round trips; the SQL lives beside it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import psycopg
from django.db import connection, transaction

from agents import protocol as p
from console import actions
from console.models import Node
from ingest.rawsql import send
from ingest.store.errors import check_future, check_shift, out_of_range
from ingest.store.fleet_card import NODE_CARD, node_card
from ingest.store.receipts import AGENT_DUPLICATE, agent_update, claim_receipt
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
    card: dict[str, Any] | None = None  # the node's fleet card as committed, when asked for


def _fleet_health(
    node: Node, batch: p.Batch, agent: dict[str, Any], writer: BatchWriter, now: datetime
) -> bool:
    """In the batch's transaction (rare: a reboot, a fault, a node back from silence),
    through the write path: a silent node's incident resolves; a new boot_id is repair
    evidence, then each fault that needs repair latches (a fault of the new boot latches
    again). Stored iff the batch is. True when it changed anything the node card shows."""
    who = f"agent:{node.name}"
    if node.health == "down":  # the sweep marked it silent (as authenticated this batch)
        actions.node_reporting(node_id=node.pk, actor=who, now=now)
    before, after = agent.get("boot_id") or "", batch.agent.boot_id or ""
    rebooted = bool(before and after and before != after)
    if rebooted:
        actions.record_repair_evidence(
            node_id=node.pk, evidence="node_reboot", actor=who, now=now,
            detail={"boot_id_before": before, "boot_id": after, "agent": batch.agent.id},
        )  # fmt: skip
    for gpu in dict.fromkeys(writer.resets):
        actions.record_repair_evidence(
            node_id=node.pk, evidence="gpu_reset", gpu=gpu, actor=who, now=now,
            detail={"event": "gpu_reset", "gpu": gpu, "agent": batch.agent.id},
        )  # fmt: skip
    for fault in writer.faults:
        actions.latch_fault(
            node_id=node.pk, gpu=fault["gpu"], event=fault["event"], code=fault["code"],
            recovery_action=fault["recovery_action"], detail=fault["detail"], actor=who,
            now=now, evidence={"ts": fault["ts"], "agent": batch.agent.id, "seq": batch.seq},
        )  # fmt: skip
    return rebooted or bool(writer.resets or writer.faults)


def ingest_batch(
    *,
    node: Node,
    batch: p.Batch,
    now: datetime,
    max_future_s: int,
    want_card: bool = False,
    launcher_group: str = "",
) -> IngestResult:
    """Store one batch in one transaction and about five round trips, whatever its size.

    Round trips: receipt + agent state; groups + the ranks the batch names; one COPY per
    record table; then every live-state write in one multi-statement send. Raw SQL here
    because the ORM's statement compilation cost more than Postgres did (docs/performance.md).
    With `want_card` (or a critical device event) the last send also reads the node's
    fleet card, so the live push after commit costs no query of its own.

    Ownership (docs/security.md): the receipt's round trip also reads who owns the GPUs the
    batch names, and the groups' round trip which of them this node hosts ranks of; what
    the node may not claim is stored as telemetry, not applied, and recorded as a
    contract violation. `launcher_group` is the group a launcher token may transition.
    """
    skew = batch.sent_at - now
    shift = skew if abs(skew) > timedelta(seconds=5) else timedelta(0)
    check_future(batch, max_future_s)
    if shift:
        check_shift(batch, shift)
    # Raw psycopg throughout: map its errors to Django's (OperationalError -> 503 in the
    # view); a number out of range for its column becomes a 400 naming the record.
    with transaction.atomic(), connection.wrap_database_errors:
        gpus = {r.gpu for r in batch.records if isinstance(r, _GPU_RECORDS) and r.gpu}
        claim = claim_receipt(batch, node, now, gpus)
        agent = claim.agent
        if agent is None:
            send(AGENT_DUPLICATE, {"agent": batch.agent.id, "now": now}).close()
            return IngestResult(ack_seq=batch.seq, duplicate=True)
        writer = BatchWriter(
            node=node, agent_id=batch.agent.id, now=now, shift=shift, want_card=want_card
        )
        writer.device_owners, writer.node_gpus = claim.device_owners, claim.node_gpus
        writer.launcher_group = launcher_group
        writer.agent_update = agent_update(agent, node, batch, now, skew)
        writer.add(batch.records)
        try:
            writer.flush()
        except psycopg.errors.DataError as exc:
            raise out_of_range(exc, batch) from None
        if _fleet_health(node, batch, agent, writer, now) and writer.card is not None:
            # The card was read before the lifecycle moved: read it again (rare).
            with send(NODE_CARD, {"node": node.pk}) as cur:
                row = cur.fetchone()
            if row is not None:
                writer.card = node_card(row)
        return IngestResult(
            ack_seq=batch.seq,
            duplicate=False,
            records=len(batch.records),
            groups=sorted(writer.touched_groups),
            new_groups=writer.created,
            nodes=[node.name],
            violations=writer.violation_count,
            device_events=writer.critical_events,
            actions_pending=writer.actions_pending,
            card=writer.card,
        )
