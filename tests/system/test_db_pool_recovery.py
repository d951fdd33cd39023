"""The shipped connection pool serves the first request after a Postgres outage at once.

psycopg_pool retries a failed refill with exponential backoff (1, 2, 4, 8, 16 s...); with
its default `reconnect_timeout` (300 s) an outage could leave the next try many seconds away,
and requests waiting the pool's 10 s `timeout` failed after Postgres was back (CI:
`test_chaos.py`'s 24 batches after the restart began [503, 503, 202, ...]). The settings'
`reconnect_timeout` gives a refill up after a few seconds, so a request after the restart
starts a fresh one. Measured on the pool exactly as faultline.settings configures it."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from pathlib import Path

import pytest
from django.conf import settings

from tests.system.chaos.harness import PG_USER

pytestmark = [pytest.mark.slow]


def test_the_first_request_after_a_postgres_restart_is_served_at_once() -> None:
    from pgserver._commands import pg_ctl
    from psycopg_pool import ConnectionPool, PoolTimeout

    from faultline.embedded import start_postgres

    db = settings.DATABASES["default"]
    options = dict(settings.DB_POOL)  # what the service runs with (tests run without it)
    data = Path(tempfile.mkdtemp(prefix="faultline-pool-"))
    server, url = start_postgres(data)  # a Postgres of its own: this test stops it
    pgdata = data / "pg"
    check = ConnectionPool.check_connection if db["CONN_HEALTH_CHECKS"] else None
    pool = ConnectionPool(url, open=True, check=check, **options)
    try:
        with pool.connection() as conn:
            conn.execute("SELECT 1")
        sock = (pgdata / "postmaster.pid").read_text().splitlines()[4]
        pg_ctl(["-w", "-m", "fast", "stop"], pgdata=pgdata, user=PG_USER, timeout=60)
        # The request that finds the pooled connection broken starts the refill's backoff:
        # tries ~1, 3, 7, 15 and 31 s later (the first delay has 10 % jitter, so the 4th
        # lands in 13.5-16.5 s and the 5th in 27.9-34.1 s). Postgres is back at ~17 s:
        # with a 300 s reconnect_timeout no try comes within a request's 10 s `timeout`.
        first = time.monotonic()
        with pytest.raises(PoolTimeout), pool.connection() as conn:  # the 503 while down
            conn.execute("SELECT 1")
        while time.monotonic() - first < 16.7:
            time.sleep(0.05)
        pg_ctl(["-w", "-o", '-h ""', "-o", f"-k {sock}", "-l", str(pgdata / "log"), "start"],
               pgdata=pgdata, user=PG_USER, timeout=60)  # fmt: skip
        waits = []
        for _ in range(3):
            t0 = time.monotonic()
            with pool.connection() as conn:
                conn.execute("SELECT 1")
            waits.append(time.monotonic() - t0)
        # The library default (300 s, FAULTLINE_DB_RECONNECT_S=300) fails here: 10 s, then
        # PoolTimeout.
        assert max(waits) < 2.0, waits
    finally:
        pool.close()
        # pgserver's cleanup knows the postmaster it started, not the one restarted here.
        with contextlib.suppress(Exception):
            pg_ctl(["-w", "-m", "fast", "stop"], pgdata=pgdata, user=PG_USER, timeout=60)
        server.cleanup()
        shutil.rmtree(data, ignore_errors=True)
