"""Telemetry upkeep, run hourly by the Celery task `console.maintain_telemetry` (ingest/tasks.py).

Creates the coming days' partitions, drops whole days older than `keep_days` (O(1), no
dead tuples), deletes 5 s step bins older than a day, trims the DEFAULT partitions, prunes
batch receipts (the agent's high-water mark answers for them), deletes minute rollups and
event rows past their own, longer retention in batches, and refolds the last hour of
minute rollups as a backstop for a missed per-minute run. Never touches console tables:
the audit log is append-only by database role and is never pruned.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import connection
from django.db.backends.utils import CursorWrapper

from console.choices import TERMINAL_GROUP_STATES, IncidentState
from ingest import partitions, rollups, step_bins
from ingest.store.handlers import kept
from ingest.store.kinds import Keep

# An hourly run refolds a little more than an hour, so no minute falls between two runs.
BACKSTOP_MINUTES = 70
STEP_BINS_KEEP = timedelta(days=1)
HOST_SAMPLES_KEEP = timedelta(days=1)
# Rows per DELETE: each batch is its own short transaction, so ingest's row locks and
# autovacuum keep up, and a run stopped half way has still removed whole batches.
DELETE_BATCH = 10_000

# Event-sized tables: deleted by age in batches. Group-scoped ones keep every row of a
# group that is still live or has an open incident (its checkpoints, transitions and exits
# are what recovery and the incident page read).
# Which tables each rule covers is each record kind's `keep` (ingest.store.handlers);
# contract violations are ingest's own rows, kept as group events.
NODE_EVENTS = kept(Keep.NODE_EVENTS)
GROUP_EVENTS = (*kept(Keep.GROUP_EVENTS), "ingest_contractviolation")
SAMPLES = kept(Keep.A_DAY)
ROLLUPS = ("ingest_steprollup", "ingest_devicerollup")  # by `minute`
_TERMINAL = TERMINAL_GROUP_STATES
_OPEN = (IncidentState.OPEN, IncidentState.ACKNOWLEDGED)


@dataclass(frozen=True)
class Policy:
    """How long each kind of row is kept (settings, from the environment)."""

    keep_days: int  # raw partitioned telemetry (FAULTLINE_RETENTION_DAYS)
    receipts: timedelta = timedelta(hours=24)  # FAULTLINE_RECEIPT_RETENTION_HOURS
    rollup_days: int = 90  # FAULTLINE_ROLLUP_RETENTION_DAYS
    event_days: int = 90  # FAULTLINE_EVENT_RETENTION_DAYS


def run(*, now: datetime, keep_days: int, policy: Policy | None = None) -> dict[str, int]:
    """Returns rows removed per table."""
    policy = policy or Policy(keep_days=keep_days)
    partitions.ensure_partitions(days_ahead=2, now=now)
    cutoff = now - timedelta(days=policy.keep_days)
    removed = partitions.drop_partitions_before(cutoff)
    # The 5 s step bins feed only the group page's 10-minute charts (longer ranges read
    # the minute rollups): keep one day of them, not the raw retention. At 16k ranks that
    # is ~4.4M small rows, removed by an hourly DELETE by bucket.
    removed["ingest_stepbinrollup"] = step_bins.trim(before=max(cutoff, now - STEP_BINS_KEEP))
    # Host and network samples feed only the snapshot's newest row per node and
    # port: a day of them is plenty (their events are kept).
    for table in SAMPLES:
        removed[table] = delete_samples(table, before=now - HOST_SAMPLES_KEEP)
    removed["ingest_batchreceipt"] = prune_receipts(before=now - policy.receipts)
    rollup_cutoff = now - timedelta(days=max(policy.rollup_days, policy.keep_days))
    for table in ROLLUPS:
        removed[table] = delete_batched(table, "minute", rollup_cutoff)
    event_cutoff = now - timedelta(days=max(policy.event_days, policy.keep_days))
    for table in NODE_EVENTS:
        removed[table] = delete_batched(table, "ts", event_cutoff)
    for table in GROUP_EVENTS:
        removed[table] = delete_batched(table, "ts", event_cutoff, keep_live_groups=True)
    rollups.rollup(now=now, minutes=BACKSTOP_MINUTES)
    return removed


# One statement per batch: the receipts of an id range go, and each agent's watermark
# rises to the highest seq removed, atomically (a replay of a pruned seq that arrives
# while this runs waits on the delete, then reads the new watermark under its row lock).
_PRUNE_LOCK = 0x5245_4345_4950_5453 >> 1  # "RECEIPTS", as a bigint advisory lock key
_PRUNE = """
WITH gone AS (
    DELETE FROM ingest_batchreceipt WHERE id >= %(lo)s AND id < %(hi)s
    RETURNING agent_id, seq
), top AS (
    SELECT agent_id, max(seq) AS seq, count(*) AS n FROM gone GROUP BY agent_id
), raised AS (
    UPDATE ingest_agentstate a
    SET receipts_pruned_through = greatest(a.receipts_pruned_through, top.seq)
    FROM top WHERE a.agent_id = top.agent_id RETURNING 1
)
SELECT coalesce(sum(n), 0)::bigint, (SELECT count(*) FROM raised) FROM top
"""


def prune_receipts(*, before: datetime, batch: int = DELETE_BATCH) -> int:
    """Delete receipts received before `before`; raise each agent's watermark. Rows removed.

    Receipts are inserted with the request's time and a rising id, so the old ones are
    an id prefix: found by a binary search on the primary key (no index on the hot insert
    path for this), then deleted id range by id range.
    """
    with connection.cursor() as cur:
        # One prune at a time (a doubled hourly task must not race itself on agent rows).
        cur.execute("SELECT pg_try_advisory_lock(%s)", [_PRUNE_LOCK])
        if not cur.fetchone()[0]:
            return 0
        try:
            cur.execute("SELECT min(id), max(id) FROM ingest_batchreceipt")
            lo, hi = cur.fetchone()
            if lo is None:
                return 0
            boundary = _first_id_at_or_after(cur, before, lo, hi)
            removed = 0
            while lo < boundary:
                top = min(lo + batch, boundary)
                cur.execute(_PRUNE, {"lo": lo, "hi": top})
                removed += cur.fetchone()[0]
                lo = top
            return removed
        finally:
            cur.execute("SELECT pg_advisory_unlock(%s)", [_PRUNE_LOCK])


def _first_id_at_or_after(
    cur: CursorWrapper,
    before: datetime,
    lo: int,
    hi: int,
    *,
    table: str = "ingest_batchreceipt",
    column: str = "received_at",
) -> int:
    """The lowest id whose `column` is not before `before` (hi + 1 if none), by binary
    search on the primary key: the table's rows are appended in about time order."""
    probe = f"SELECT id, {column} FROM {table} WHERE id >= %s ORDER BY id LIMIT 1"  # noqa: S608 - our names
    end = hi + 1
    while lo < end:
        mid = (lo + end) // 2
        cur.execute(probe, [mid])
        row = cur.fetchone()
        if row is None or row[1] >= before:
            end = mid
        else:
            lo = row[0] + 1
    return end


def delete_batched(
    table: str,
    column: str,
    before: datetime,
    *,
    keep_live_groups: bool = False,
    batch: int = DELETE_BATCH,
) -> int:
    """Delete `table`'s rows with `column` < `before`, one id range of `batch` a transaction.

    Rows are appended in about time order, so the old ones are an id prefix (found by a
    binary search on the primary key): each DELETE is a primary-key range scan, and no
    time index is needed however large the table. A row stamped late (an agent's spool)
    goes in a later run. With `keep_live_groups`, rows of a group that is not finished, or
    that has an open or acknowledged incident, stay. Returns the rows removed.
    """
    keep = ""
    params: dict[str, object] = {"before": before}
    if keep_live_groups:
        keep = (
            " AND (t.group_id IS NULL OR t.group_id IN (SELECT id FROM console_consistencygroup"
            " WHERE state = ANY(%(terminal)s::text[]))"
            " AND NOT EXISTS (SELECT 1 FROM console_incident i"
            " WHERE i.group_id = t.group_id AND i.state = ANY(%(open)s::text[])))"
        )
        params |= {"terminal": [str(s) for s in _TERMINAL], "open": [str(s) for s in _OPEN]}
    sql = (
        f"DELETE FROM {table} t WHERE t.id >= %(lo)s AND t.id < %(hi)s "  # noqa: S608 - our names
        f"AND t.{column} < %(before)s{keep}"
    )
    removed = 0
    with connection.cursor() as cur:
        cur.execute(f"SELECT min(id), max(id) FROM {table}")  # noqa: S608 - our names
        lo, hi = cur.fetchone()
        if lo is None:
            return 0
        boundary = _first_id_at_or_after(cur, before, lo, hi, table=table, column=column)
        while lo < boundary:
            top = min(lo + batch, boundary)
            cur.execute(sql, {**params, "lo": lo, "hi": top})
            removed += cur.rowcount
            lo = top
    return removed


def delete_samples(table: str, *, before: datetime) -> int:
    """Delete `table`'s rows stamped before `before` in one statement (a day of per-round
    samples at most an hour old past the cut: an hourly run removes about an hour's rows)."""
    with connection.cursor() as cur:
        cur.execute(f"DELETE FROM {table} WHERE ts < %s", [before])  # noqa: S608 - our names
        return cur.rowcount
