"""The telemetry tables ingest COPYs into, and the COPY of a batch's rows into them.

The column lists are the record kinds' (ingest.store.handlers: each is declared beside the
handler that formats its lines in that order); the benchmarks read them here. Must not
hold live-state SQL.
"""

from __future__ import annotations

from django.db import connection

from ingest.store import handlers

# Each kind's table and its COPY columns are declared beside its handler (ingest.store.handlers).
COLUMNS = handlers.COLUMNS

COPY_SQL = {
    # Columns quoted: "window" is reserved.
    table: "COPY ingest_{} ({}) FROM STDIN".format(table, ", ".join(f'"{c}"' for c in cols))
    for table, cols in COLUMNS.items()
}


def copy_rows(rows: dict[str, list[str]]) -> None:
    """One COPY per table, each from one string of its lines."""
    with connection.connection.cursor() as raw:
        for table, lines in rows.items():
            with raw.copy(COPY_SQL[table]) as copy:
                copy.write("".join(lines))
