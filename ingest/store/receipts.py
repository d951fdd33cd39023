"""The (agent_id, seq) receipt and the agent's bookkeeping: replays stop here, gaps counted.

Owns the first round trip of a batch (receipt insert, the agent's row created if new and
locked, the owners of the GPUs the batch names, and the groups and ranks the writer reads
with it) and the agent's counters after it
(sequence gaps opened by a jump and closed by a late seq, spool depth). Receipts are pruned
after a while (ingest.retention): at or below the agent's `receipts_pruned_through` a seq
that is not in its gap list was stored before, so its replay is still a duplicate, while
a late batch inside a gap is still stored. An agent id belongs
to the node that first used it: a batch naming another node's agent id is refused before
its receipt can count as anyone's duplicate. Must not write telemetry or live state.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import msgspec
from psycopg.types.json import Jsonb

from agents import protocol as p
from console.models import Node
from ingest.rawsql import send

_AGENT_COLUMNS = (
    "node_id",
    "last_seq",
    "gaps",
    "gap_ranges",
    "batches",
    "records",
    "spool_depth",
    "dropped",
    "boot_id",
    "receipts_pruned_through",
    "jobs",
)

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
# Only when the batch names GPUs: who owns them, and how many GPUs this node has.
_DEVICE_OWNERS = """;
SELECT uuid, node_id, last_seen FROM console_device WHERE uuid = ANY(%(gpus)s::text[]);
SELECT count(*) FROM console_device WHERE node_id = %(node)s
"""


class AgentNotOwnedError(Exception):
    """The batch names an agent id another node first used (403: its batches are its own)."""

    def __init__(self, agent_id: str) -> None:
        super().__init__(
            f"agent id {agent_id!r} belongs to another node: each node's agent keeps its own id"
        )


@dataclass(frozen=True)
class Receipts:
    """What the service holds of an agent's seqs as a batch found them: the highest seq
    stored (None: nothing yet) and the ranges at or below it it lacks (the newest 100 gap
    ranges). The 202 carries them so the agent can re-send what it saw acknowledged and the
    service no longer has (a failover to a standby that lagged: agents/replay.py)."""

    high_water: int | None = None
    gaps: tuple[tuple[int, int], ...] = ()


@dataclass
class Claim:
    """The first round trip's answer: the agent's state (None for a replay), its receipts
    as the batch found them, and who owns the GPUs the batch names (uuid -> (node id, last
    seen)) with this node's GPU count."""

    agent: dict[str, Any] | None
    receipts: Receipts = field(default_factory=Receipts)
    device_owners: dict[str, tuple[int, datetime | None]] = field(default_factory=dict)
    node_gpus: int = 0


AGENT_DUPLICATE = """
UPDATE ingest_agentstate SET duplicates = duplicates + 1, last_seen = %(now)s
WHERE agent_id = %(agent)s
"""

AGENT_UPDATE = """
UPDATE ingest_agentstate SET node_id = %(a_node)s, version = %(a_version)s,
    boot_id = %(a_boot)s, last_seq = %(a_last_seq)s, batches = %(a_batches)s,
    records = %(a_records)s, gaps = %(a_gaps)s, gap_ranges = %(a_gap_ranges)s,
    last_seen = %(now)s, clock_skew_ms = %(a_skew)s, spool_depth = %(a_spool)s,
    dropped = %(a_dropped)s, jobs = %(a_jobs)s
WHERE agent_id = %(a_id)s
"""


def claim_receipt(
    batch: p.Batch,
    node: Node,
    now: datetime,
    gpus: set[str],
    then: tuple[str, dict[str, Any], Callable[[Any], None]] | None = None,
) -> Claim:
    """Insert the (agent, seq) receipt, lock the agent's row and read the owners of `gpus`.

    `then` (SQL, its parameters, a reader of its results) goes in the same round trip,
    after the claim: the batch's group read (BatchWriter.group_read), which needs nothing
    from the claim. Its reader runs whatever the claim says (a replay's result is unused).
    `Claim.agent` is None for a replay. Raises AgentNotOwnedError when the agent id is
    another node's (the caller's transaction then rolls the receipt back).
    """
    params = {
        "agent": batch.agent.id,
        "seq": batch.seq,
        "now": now,
        "records": len(batch.records),
        "node": node.pk,
        "gpus": sorted(gpus),
    }
    sql = _CLAIM + _DEVICE_OWNERS if gpus else _CLAIM
    if then is not None:
        sql = f"{sql};{then[0]}"
        params = {**then[1], **params}  # the same "node"; names no key of the claim's
    claim = Claim(agent=None)
    with send(sql, params) as cur:
        claimed = cur.fetchone() is not None
        cur.nextset()
        cur.nextset()
        row = cur.fetchone()
        if gpus:
            cur.nextset()
            claim.device_owners = {u: (n, seen) for u, n, seen in cur.fetchall()}
            cur.nextset()
            count = cur.fetchone()
            claim.node_gpus = count[0] if count else 0
        if then is not None:
            cur.nextset()
            then[2](cur)
    if row is not None and row[0] != node.pk:
        raise AgentNotOwnedError(batch.agent.id)
    if row is None:
        return claim
    state = dict(zip(_AGENT_COLUMNS, row, strict=True))
    for key in ("gap_ranges", "jobs") if claimed else ("gap_ranges",):
        if isinstance(state[key], str):  # Django's connections load jsonb as text
            state[key] = msgspec.json.decode(state[key])
    claim.receipts = Receipts(
        state["last_seq"], tuple((first, last) for first, last in state["gap_ranges"])
    )
    if not claimed:
        return claim
    if replay_of_pruned(batch.seq, state):
        return claim  # the new receipt stays: it records a seq that was seen, as before
    claim.agent = state
    return claim


def replay_of_pruned(seq: int, state: dict[str, Any]) -> bool:
    """True when `seq`'s receipt may have been pruned and the seq was stored before.

    At or below the high-water mark every seq was either stored or is in the gap list, so
    "not in a gap" means "stored". Only the newest 100 gap ranges are kept: a batch that
    fills an older gap after its neighbours' receipts were pruned is taken for a replay
    (docs/operations.md, Retention).
    """
    pruned, last_seq = state["receipts_pruned_through"], state["last_seq"]
    if pruned is None or last_seq is None or seq > min(pruned, last_seq):
        return False
    return not any(first <= seq <= last for first, last in state["gap_ranges"])


def agent_update(
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
    jobs = state["jobs"]
    newest = last_seq is None or seq > last_seq  # a late batch's heartbeat is not the news
    for rec in batch.records:
        if isinstance(rec, p.Heartbeat):
            spool, dropped = rec.spool_depth, rec.dropped
            if newest:
                jobs = rec.jobs
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
        "a_jobs": None if jobs is None else Jsonb(list(jobs)),
    }


def attested_jobs(state: dict[str, Any], batch: p.Batch) -> frozenset[str] | None:
    """The jobs the batch's agent attests run on its node, for this batch's ownership
    checks: what it attested before and what this batch's heartbeats attest (a job that
    started or ended within the batch still speaks for its records); None when it never
    attested (no scheduler to ask)."""
    seen: set[str] | None = None if state["jobs"] is None else set(state["jobs"])
    for rec in batch.records:
        if type(rec) is p.Heartbeat and rec.jobs is not None:
            seen = (seen or set()) | set(rec.jobs)
    return None if seen is None else frozenset(seen)


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
