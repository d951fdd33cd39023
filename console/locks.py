"""Bounded lock waits: how long a write may wait for rows another transaction holds, and
how a caller tells that wait ran out from any other database error.

The service's connections wait at most FAULTLINE_DB_LOCK_TIMEOUT_MS for a lock and Postgres
ends a transaction idle for FAULTLINE_DB_IDLE_IN_TRANSACTION_S (faultline.settings); a path
that must not wait that long (the urgent lane) shortens it for its own transaction here.
Must not decide what a caller does once a wait ran out: that is the caller's (retry, leave
it to the next pass, answer 503).
"""

from __future__ import annotations

import psycopg.errors
from django.db import connection


def wait_at_most(ms: int) -> None:
    """Inside a transaction: its statements wait at most `ms` for a lock (SET LOCAL ends
    with the transaction, so a pooled connection keeps the service's default)."""
    with connection.cursor() as cursor:
        cursor.execute(f"SET LOCAL lock_timeout = {int(ms)}")


def held_elsewhere(exc: BaseException) -> bool:
    """The error is a lock wait that ran out (SQLSTATE 55P03), not a broken database."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, psycopg.errors.LockNotAvailable):
            return True
        cause = cause.__cause__
    return False
