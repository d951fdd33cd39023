"""Daily range partitions of the high-volume telemetry tables (Postgres native partitioning).

Owns the DDL around partitions: converting a table to `PARTITION BY RANGE (ts)` (used by
migration 0002), creating the days around now (`ensure_partitions`) and dropping whole days
for retention (`drop_partitions_before`), and a new day's first statistics
(`analyze_young`: a day read before autovacuum first analyzes it plans badly). Each table
has a DEFAULT partition, so an insert never fails for lack of a day; rows that landed
there move into their day when it is created. Must not hold ORM logic: plain SQL over
the connection it is given.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from django.db import connection as default_connection
from django.db import transaction

# Tables written at 8 rows per GPU per second; the other telemetry tables are event-sized.
PARTITIONED = (
    "ingest_devicesample",
    "ingest_steprecord",
    "ingest_collectivewindow",
    "ingest_servingwindow",
)
_DAY = re.compile(r"_p(\d{8})$")


@dataclass(frozen=True)
class Partition:
    table: str
    name: str
    day: date | None  # None for the DEFAULT partition


def partition_name(table: str, day: date) -> str:
    return f"{table}_p{day:%Y%m%d}"


def default_name(table: str) -> str:
    return f"{table}_default"


def _bounds(day: date) -> tuple[datetime, datetime]:
    start = datetime.combine(day, time(0), tzinfo=UTC)
    return start, start + timedelta(days=1)


def list_partitions(table: str, *, conn: Any = None) -> list[Partition]:
    """The table's partitions, oldest day first, the DEFAULT partition last."""
    conn = conn or default_connection
    with conn.cursor() as cur:
        cur.execute(
            "SELECT c.relname FROM pg_inherits i "
            "JOIN pg_class c ON c.oid = i.inhrelid "
            "JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname = %s",
            [table],
        )
        names = [row[0] for row in cur.fetchall()]
    out = []
    for name in names:
        match = _DAY.search(name)
        day = datetime.strptime(match.group(1), "%Y%m%d").date() if match else None  # noqa: DTZ007 - a date, not a time
        out.append(Partition(table, name, day))
    return sorted(out, key=lambda p: (p.day is None, p.day or date.min))


def ensure_partitions(
    days_ahead: int = 2, *, now: datetime | None = None, days_back: int = 1, conn: Any = None
) -> list[str]:
    """Create the daily partitions from `days_back` before today to `days_ahead` after.

    Idempotent; returns the partitions it created. Yesterday is included so an agent
    replaying its spool after midnight lands in a real day, not in the DEFAULT partition.
    """
    conn = conn or default_connection
    today = (now or datetime.now(UTC)).astimezone(UTC).date()
    days = [today + timedelta(days=d) for d in range(-days_back, days_ahead + 1)]
    created: list[str] = []
    for table in PARTITIONED:
        existing = {p.name for p in list_partitions(table, conn=conn)}
        for day in days:
            name = partition_name(table, day)
            if name not in existing:
                _create_day(conn, table, day)
                created.append(name)
    return created


def _create_day(conn: Any, table: str, day: date) -> None:
    start, end = _bounds(day)
    name = partition_name(table, day)
    with transaction.atomic(using=conn.alias), conn.cursor() as cur:
        # Rows of this day already in DEFAULT would make CREATE ... PARTITION OF fail; move
        # them into a detached table first, then attach it (ATTACH builds the indexes).
        cur.execute(
            f"SELECT EXISTS (SELECT 1 FROM {default_name(table)} "  # noqa: S608 - our names
            "WHERE ts >= %s AND ts < %s)",
            [start, end],
        )
        if not cur.fetchone()[0]:
            cur.execute(
                f"CREATE TABLE IF NOT EXISTS {name} PARTITION OF {table} "
                "FOR VALUES FROM (%s) TO (%s)",
                [start, end],
            )
            return
        # ATTACH demands the parent's CHECK constraints (PositiveIntegerField) on the table.
        cur.execute(f"CREATE TABLE {name} (LIKE {table} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)")
        cur.execute(
            f"WITH moved AS (DELETE FROM {default_name(table)} "  # noqa: S608 - our names
            f"WHERE ts >= %s AND ts < %s RETURNING *) INSERT INTO {name} SELECT * FROM moved",
            [start, end],
        )
        cur.execute(
            f"ALTER TABLE {table} ATTACH PARTITION {name} FOR VALUES FROM (%s) TO (%s)",
            [start, end],
        )


def drop_partitions_before(cutoff: datetime, *, conn: Any = None) -> dict[str, int]:
    """Drop every daily partition that ends at or before `cutoff`; trim DEFAULT likewise.

    Dropping a whole day is O(1) and leaves no dead tuples, unlike DELETE. Returns the
    number of rows removed per table (counted before the drop, for the operator's log).
    """
    conn = conn or default_connection
    removed: dict[str, int] = {}
    for table in PARTITIONED:
        count = 0
        for part in list_partitions(table, conn=conn):
            with transaction.atomic(using=conn.alias), conn.cursor() as cur:
                if part.day is None:
                    cur.execute(
                        f"DELETE FROM {part.name} WHERE ts < %s",  # noqa: S608 - our names
                        [cutoff],
                    )
                    count += cur.rowcount
                    continue
                if _bounds(part.day)[1] > cutoff:
                    continue
                cur.execute(f"SELECT count(*) FROM {part.name}")  # noqa: S608 - our names
                count += cur.fetchone()[0]
                cur.execute(f"DROP TABLE {part.name}")
        removed[table] = count
    return removed


# A day partition is read by the diagnosis passes from its first second, long before
# autovacuum first looks at it (autovacuum_naptime, 60 s by default). Without statistics
# the planner walks the group's (group, generation, ts) index over all the day's rows of
# the group for a read of the newest ids, a cost that grows as the day fills: 144 ms of
# SQL at 737k rows against 7 ms analyzed (bench/partition_stats.py, 16k ranks).
ANALYZE_MIN_ROWS = 10_000


def needs_analyze(*, analyzed: bool, tuples_at_analyze: float, changed: int, min_rows: int) -> bool:
    """Whether a partition's statistics are too young to plan by.

    Never analyzed, or more rows written since the last ANALYZE than it then counted (the
    table at least doubled): a day partition grows 60x in autovacuum's first minute, and
    autovacuum's own 10 % rule only looks once a minute. Below `min_rows` any plan is cheap.
    """
    if changed < min_rows:
        return False
    return not analyzed or tuples_at_analyze < 0 or changed >= tuples_at_analyze


def analyze_young(min_rows: int = ANALYZE_MIN_ROWS, *, conn: Any = None) -> list[str]:
    """ANALYZE each partition of the telemetry tables whose statistics are too young.

    One catalog read when none is (every few seconds from beat). SKIP_LOCKED: a partition
    autovacuum is working on is skipped, not waited for, so the housekeeping worker never
    blocks. Returns the partitions due (one skipped that way comes due again next time).
    """
    conn = conn or default_connection
    with conn.cursor() as cur:
        cur.execute(
            "SELECT c.relname, c.reltuples, s.n_mod_since_analyze, "
            "(s.last_analyze IS NOT NULL OR s.last_autoanalyze IS NOT NULL) "
            "FROM pg_inherits i JOIN pg_class p ON p.oid = i.inhparent "
            "JOIN pg_class c ON c.oid = i.inhrelid "
            "JOIN pg_stat_user_tables s ON s.relid = i.inhrelid "
            "WHERE p.relname = ANY(%s::name[]) AND s.n_mod_since_analyze >= %s",
            [list(PARTITIONED), min_rows],
        )
        rows = cur.fetchall()
    due = sorted(
        name
        for name, tuples, changed, analyzed in rows
        if needs_analyze(
            analyzed=analyzed, tuples_at_analyze=tuples, changed=changed, min_rows=min_rows
        )
    )
    for name in due:
        with conn.cursor() as cur:
            cur.execute(f"ANALYZE (SKIP_LOCKED) {name}")
    return due


# -- migration SQL ---------------------------------------------------------------------------
# Indexes live on the partitioned parent, so every partition (and DEFAULT) gets them.
# Names match the models' Meta.indexes, so Django's migration state stays true.


def to_partitioned_sql(table: str, indexes: list[str]) -> list[str]:
    """SQL that recreates `table` as PARTITION BY RANGE (ts), PK (id, ts), keeping rows."""
    old = f"{table}_unpartitioned"
    seq = f"{table}_id_seq"
    return [
        f"ALTER TABLE {table} RENAME TO {old}",
        f"CREATE TABLE {table} (LIKE {old} INCLUDING DEFAULTS INCLUDING CONSTRAINTS) "
        "PARTITION BY RANGE (ts)",
        # Identity columns on partitioned tables need Postgres 17: an owned sequence works
        # on 15+ and is what Django's sequence reset expects (pg_get_serial_sequence).
        f"CREATE SEQUENCE {seq}_p OWNED BY {table}.id",
        f"ALTER TABLE {table} ALTER COLUMN id SET DEFAULT nextval('{seq}_p')",
        f"CREATE TABLE {default_name(table)} PARTITION OF {table} DEFAULT",
        f"INSERT INTO {table} SELECT * FROM {old}",  # noqa: S608 - our names
        f"SELECT setval('{seq}_p', COALESCE((SELECT max(id) FROM {table}), 0) + 1, false)",  # noqa: S608
        f"DROP TABLE {old}",
        f"ALTER SEQUENCE {seq}_p RENAME TO {seq}",
        # After the drop, so the key keeps the name 0001 gave it ({table}_pkey).
        f"ALTER TABLE {table} ADD PRIMARY KEY (id, ts)",
        *indexes,
    ]


def to_plain_sql(table: str, indexes: list[str]) -> list[str]:
    """The reverse: one ordinary table with PK (id) and an identity column again."""
    new = f"{table}_plain"
    return [
        f"CREATE TABLE {new} (LIKE {table} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)",
        f"ALTER TABLE {new} ALTER COLUMN id DROP DEFAULT",
        f"INSERT INTO {new} SELECT * FROM {table}",  # noqa: S608 - our names
        f"DROP TABLE {table} CASCADE",
        f"ALTER TABLE {new} RENAME TO {table}",
        f"ALTER TABLE {table} ADD PRIMARY KEY (id)",
        f"ALTER TABLE {table} ALTER COLUMN id ADD GENERATED BY DEFAULT AS IDENTITY",
        _setval(table),
        *indexes,
    ]


def _setval(table: str) -> str:
    max_id = f"(SELECT max(id) FROM {table})"  # noqa: S608 - our table names, never input
    return (
        f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), COALESCE({max_id}, 0) + 1, false)"
    )
