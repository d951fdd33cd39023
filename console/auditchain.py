"""The audit log's hash chain: each row's `hash` covers its content and the previous row's.

Owns walking the chain (`faultline audit verify`) and what it reports. The chain itself is
written by Postgres (migration 0016): a deferred constraint trigger seals every inserted
row when its transaction commits, under a transaction-scoped advisory lock (`LOCK_KEY`)
taken at that moment and released by the commit, so auditing transactions wait on each
other only for their commits, and a transaction holding the lock never waits on a row
lock (no deadlock with the writes it audits). The chain's order is `chain_seq` (commit
order), not `id` (insert order).

    hash = sha256(jsonb_build_array(prev_hash, ts as UTC "YYYY-MM-DDTHH:MM:SS.ffffffZ",
                  actor, verb, object_type, object_id, reason, data)::text)

in Postgres's function `console_auditlog_digest`; the first row's `prev_hash` is 64 zeros.
The append-only trigger stops the service from rewriting the log; the chain shows a
rewrite by someone who got past it (a DBA disabling it, a restore from an edited dump): an
edited row no longer matches its hash, a deleted one breaks the next row's `prev_hash`, a
row written while the triggers were off has no place in the chain.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from django.db import connection

GENESIS = "0" * 64
LOCK_KEY = 0x4155_4449_544C_4F47 >> 1  # "AUDITLOG", as a bigint advisory lock key

EDITED = "hash does not match the row's content (the row was edited)"
LINK = (
    "prev_hash does not match the previous row's hash (a row before it was deleted, or "
    "the chain was rewritten from here)"
)
UNSEALED = "the row has no place in the chain (written while the log's triggers were off)"


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
                f"audit log OK: {self.rows} rows, chain intact (head {self.head}, "
                f"{self.seconds:.2f}s)"
            )
        return (
            f"audit log BROKEN at row id {self.broken_id} (verb {self.broken_verb}): "
            f"{self.failed}; {self.rows} rows before it verified"
        )


_PAGE = """
SELECT id, verb, chain_seq, prev_hash, hash,
       console_auditlog_digest(prev_hash, ts, actor, verb, object_type, object_id, reason, data)
FROM console_auditlog WHERE chain_seq > %s ORDER BY chain_seq LIMIT %s
"""


def _chain(chunk: int) -> Iterator[tuple[Any, ...]]:
    """Sealed rows in chain order, `chunk` at a time (keyset pages: no long-open cursor)."""
    last = 0
    while True:
        with connection.cursor() as cur:
            cur.execute(_PAGE, [last, chunk])
            page = cur.fetchall()
        if not page:
            return
        yield from page
        last = page[-1][2]


def _unsealed() -> tuple[int, str] | None:
    with connection.cursor() as cur:
        cur.execute(
            "SELECT id, verb FROM console_auditlog WHERE chain_seq IS NULL ORDER BY id LIMIT 1"
        )
        row = cur.fetchone()
    return (row[0], row[1]) if row else None


def verify(*, chunk: int = 5000) -> ChainReport:
    """Walk the chain from its first row; stop at the first row that fails a check. Run it
    outside a transaction that audits: that transaction's own rows are sealed at commit."""
    started = time.perf_counter()
    prev = GENESIS
    count = 0
    for row_id, verb, _seq, prev_hash, stored, digest in _chain(chunk):
        failed = LINK if prev_hash != prev else EDITED if stored != digest else ""
        if failed:
            return ChainReport(count, time.perf_counter() - started, prev, row_id, verb, failed)
        prev = stored
        count += 1
    unsealed = _unsealed()
    if unsealed is not None:
        return ChainReport(count, time.perf_counter() - started, prev, *unsealed, UNSEALED)
    return ChainReport(count, time.perf_counter() - started, prev)
