"""The audit log's hash chain: each row's `hash` covers its content and the previous row's.

Owns the canonical encoding of a row, appending rows to the chain and walking it back
(`faultline audit verify`). The append-only trigger stops the service from rewriting the
log; the chain is what shows a rewrite by someone who could get past the trigger (a DBA
disabling it, a restore from an edited dump): an edited row no longer matches its hash,
and a deleted one breaks the next row's `prev_hash`.

Appends are serialized by a transaction-scoped advisory lock, taken immediately before
the INSERT (the rows and their JSON are built first) and held to the caller's commit:
two transactions reading the same tail would fork the chain. The tail is read in a
statement after the lock's, so under READ COMMITTED it sees the last holder's commit.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg
from django.db import connection, transaction
from django.utils import timezone

from console.models import AuditLog

GENESIS = "0" * 64
# "AUDITLOG" as a bigint advisory lock key (ingest's keys are spelled the same way).
LOCK_KEY = 0x4155_4449_544C_4F47 >> 1
TABLE = "console_auditlog"


def _ts_text(ts: datetime) -> str:
    if timezone.is_naive(ts):  # stored as Django stores it: in the default time zone
        ts = timezone.make_aware(ts)
    return ts.astimezone(UTC).isoformat(timespec="microseconds")


def row_hash(
    prev_hash: str,
    *,
    ts: datetime,
    actor: str,
    verb: str,
    object_type: str,
    object_id: str,
    reason: str,
    data_text: str,
) -> str:
    """sha256 over a JSON array of the previous hash and the row's fields. `data_text` is
    Postgres's own text of the jsonb value: jsonb reorders keys and rewrites numbers
    (1e20 comes back as an integer), so hashing the Python dict would not survive a read."""
    payload = json.dumps(
        [prev_hash, _ts_text(ts), actor, verb, object_type, object_id, reason, data_text],
        separators=(",", ":"),
    )
    return hashlib.sha256(payload.encode()).hexdigest()


_TAIL = (
    "SELECT pg_advisory_xact_lock(%s); "
    "SELECT (SELECT hash FROM console_auditlog ORDER BY id DESC LIMIT 1), "
    "ARRAY(SELECT d::text FROM unnest(%s::text[]::jsonb[]) WITH ORDINALITY AS u(d, n) ORDER BY n)"
)


def _lock_and_read_tail(data_json: list[str]) -> tuple[str | None, list[str]]:
    """One round trip, two statements: the lock, then (in a snapshot taken after it) the
    chain's tail and Postgres's text of each row's data."""
    with connection.wrap_database_errors:
        connection.ensure_connection()
        with psycopg.ClientCursor(connection.connection) as cur:
            cur.execute(_TAIL, [LOCK_KEY, data_json])
            cur.nextset()
            row = cur.fetchone()
    if row is None:  # a SELECT without FROM always returns its one row
        raise RuntimeError("audit chain: the tail query returned no row")
    return row[0], row[1]


def append(rows: list[AuditLog], *, batch_size: int = 1000) -> list[AuditLog]:
    """Chain and insert `rows` in order, inside the caller's transaction (or one of its own)."""
    if not rows:
        return rows
    data_json = [json.dumps(row.data or {}) for row in rows]
    with transaction.atomic(savepoint=False):
        tail, texts = _lock_and_read_tail(data_json)
        prev = tail or GENESIS
        for row, text in zip(rows, texts, strict=True):
            row.prev_hash = prev
            row.hash = prev = row_hash(
                prev, ts=row.ts, actor=row.actor, verb=row.verb, object_type=row.object_type,
                object_id=row.object_id, reason=row.reason, data_text=text,
            )  # fmt: skip
        if len(rows) == 1:
            rows[0].save(force_insert=True)
        else:
            # One INSERT per batch: Postgres numbers a VALUES list's rows in order, so id
            # order (verify's walk) is chain order.
            AuditLog.objects.bulk_create(rows, batch_size=batch_size)
    return rows


@dataclass(frozen=True)
class ChainReport:
    """What `verify` found: `rows` walked; on a break, the first broken row and why."""

    rows: int
    seconds: float
    head: str = GENESIS
    broken_id: int | None = None
    broken_verb: str = ""
    failed: str = ""

    @property
    def ok(self) -> bool:
        return self.broken_id is None

    def describe(self) -> str:
        if self.ok:
            return (
                f"audit log OK: {self.rows} rows, chain intact (head {self.head[:16]}, "
                f"{self.seconds:.2f}s)"
            )
        return (
            f"audit log BROKEN at row id {self.broken_id} (verb {self.broken_verb}): "
            f"{self.failed}; {self.rows} rows before it verified"
        )


_COLUMNS = "id, ts, actor, verb, object_type, object_id, reason, data::text, prev_hash, hash"


def _rows(chunk: int) -> Iterator[tuple[Any, ...]]:
    """Every row in id order, `chunk` at a time (keyset pages: no long-open cursor)."""
    last = 0
    while True:
        with connection.cursor() as cur:
            cur.execute(
                f"SELECT {_COLUMNS} FROM {TABLE} WHERE id > %s ORDER BY id LIMIT %s",  # noqa: S608 - constants
                [last, chunk],
            )
            page = cur.fetchall()
        if not page:
            return
        yield from page
        last = page[-1][0]


def verify(*, chunk: int = 5000) -> ChainReport:
    """Walk the chain from the first row; stop at the first row that fails a check."""
    started = time.perf_counter()
    prev = GENESIS
    count = 0
    for row_id, ts, actor, verb, otype, oid, reason, data_text, prev_hash, stored in _rows(chunk):
        failed = ""
        if prev_hash != prev:
            failed = (
                "prev_hash does not match the previous row's hash (a row before it was "
                "deleted, inserted or reordered)"
            )
        elif stored != row_hash(
            prev, ts=ts, actor=actor, verb=verb, object_type=otype, object_id=oid,
            reason=reason, data_text=data_text,
        ):  # fmt: skip
            failed = "hash does not match the row's content (the row was edited)"
        if failed:
            return ChainReport(
                rows=count, seconds=time.perf_counter() - started, head=prev,
                broken_id=row_id, broken_verb=verb, failed=failed,
            )  # fmt: skip
        prev = stored
        count += 1
    return ChainReport(rows=count, seconds=time.perf_counter() - started, head=prev)
