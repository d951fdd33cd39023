"""Binary-format reads for the diagnosis pass's bulk rows (per-rank records, GPU samples).

At 16k ranks a pass reads 16k rows a step (~200k for a full read) and 16k GPU samples.
Through the ORM each row cost ~12 us in Django's text-format timestamp loader and
`values()`, 5-10x the fetch itself; in binary format psycopg's C loaders parse timestamps
and numbers (docs/performance.md, "Reads in binary"). jsonb is read as text and decoded
by msgspec. Must not write.
"""

from __future__ import annotations

from typing import Any

import msgspec
import psycopg
from django.db import connection

json = msgspec.json.Decoder()


def fetch(sql: str, params: list[Any]) -> list[tuple[Any, ...]]:
    """Rows of `sql` in binary format on Django's connection (in its transaction, if any)."""
    connection.ensure_connection()
    # Django's connection builds client-side-binding cursors, which cannot ask for binary
    # results; a plain psycopg cursor on the same connection can.
    with psycopg.Cursor(connection.connection) as cur:
        cur.execute(sql, params, binary=True)
        return cur.fetchall()
