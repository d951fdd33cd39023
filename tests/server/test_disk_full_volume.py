"""A real full volume: Postgres's own ENOSPC (SQLSTATE 53100) on a tiny tmpfs tablespace
holding the device-sample partitions. Ingest answers 503 with Retry-After and stores
nothing of the batch; /readyz names the cause; once space is freed the batch is stored.

Slow, and skipped where tmpfs cannot be mounted (needs root; the embedded Postgres runs as
the `pgserver` user, which must own the tablespace's directory)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.db import OperationalError, connection

from faultline import dbwrites
from ingest.models import BatchReceipt, DeviceSample
from tests.conftest import make_batch

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

SPACE = "test_tiny_volume"


def _sql(sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
    with connection.cursor() as cur:
        cur.execute(sql, params)
        return cur.fetchall() if cur.description else []


@pytest.fixture
def tiny_volume() -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    (data_dir,) = _sql("SELECT current_setting('data_directory')")[0]
    owner = Path(data_dir).stat()
    # Not under pytest's tmp_path (0700 parents): the server's user must reach it.
    mount = Path(tempfile.mkdtemp(prefix="faultline-tiny-", dir="/tmp"))
    mount.chmod(0o755)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)],
                          capture_output=True, text=True, check=False)  # fmt: skip
    if done.returncode != 0:
        mount.rmdir()
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        os.chown(mount, owner.st_uid, owner.st_gid)
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=False)
        mount.rmdir()


def _fill(table: str) -> None:
    """Insert page-sized rows one statement at a time until Postgres reports the disk full:
    each statement extends the file by one page, so what is left is under a page."""
    for _ in range(5000):
        try:
            _sql(f"INSERT INTO {table} SELECT repeat(md5(random()::text), 200)")
        except OperationalError as exc:
            assert dbwrites.refusal(exc) == ("disk_full", "53100"), exc
            return
    raise AssertionError("the tiny volume never filled")


def test_a_full_volume_refuses_the_batch_whole_and_readyz_says_why(
    tiny_volume: Path, post_batch: Any, client: Any
) -> None:
    parent = DeviceSample._meta.db_table
    children = [r[0] for r in _sql(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        "WHERE i.inhparent = %s::regclass", [parent])]  # fmt: skip
    assert children
    # Empty partitions (no pages): a row left by an earlier test on this database leaves
    # room in its page, and the sample would fit there without a new block.
    _sql(f"TRUNCATE {parent}")
    _sql(f"CREATE TABLESPACE {SPACE} LOCATION '{tiny_volume}'")
    try:
        for child in children:
            _sql(f"ALTER TABLE {child} SET TABLESPACE {SPACE}")
        _sql(f"CREATE TABLE test_filler (x text) TABLESPACE {SPACE}")
        _sql("ALTER TABLE test_filler ALTER COLUMN x SET STORAGE PLAIN")  # no TOAST elsewhere
        _fill("test_filler")

        sample = {"kind": "device_sample", "gpu": "GPU-0", "index": 0, "temp_c": 51.0}
        batch = make_batch([{"kind": "heartbeat", "uptime_s": 5}, sample])
        response = post_batch(batch)
        assert response.status_code == 503, response.content
        assert response["Retry-After"] == str(dbwrites.RETRY_AFTER_S)
        assert "disk_full" in response.json()["error"]
        assert BatchReceipt.objects.count() == 0 and DeviceSample.objects.count() == 0
        ready = client.get("/readyz").json()
        assert ready["checks"]["database_writes"] is False
        assert "SQLSTATE 53100" in ready["reasons"]["database_writes"]

        _sql("DROP TABLE test_filler")  # an operator frees space
        again = post_batch(batch)
        assert again.status_code == 202, again.content
        assert DeviceSample.objects.count() == 1
    finally:
        with contextlib.suppress(OperationalError, psycopg.Error):
            _sql("DROP TABLE IF EXISTS test_filler")
        for child in children:
            _sql(f"ALTER TABLE {child} SET TABLESPACE pg_default")
        _sql(f"DROP TABLESPACE IF EXISTS {SPACE}")
