"""No pass, batch or lane waits unboundedly on rows another transaction holds.

A second connection stands in for a diagnosis pass stuck inside its write transaction (a
frozen worker): it holds the group's row as a pass does (FOR NO KEY UPDATE). The group's own
batches, the urgent lane's Xid and the next ordinary pass must each go on (or give up) in a
bounded time; the service's connections carry the lock and idle-transaction timeouts.
Real batches through POST /api/v1/ingest, the real engine and database.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from django.conf import settings
from django.db import OperationalError, connection

from console import locks, pipeline, scheduling, tasks
from console.models import ConsistencyGroup, Incident
from tests.conftest import iso, make_batch
from tests.server.test_pipeline import GROUP, _history

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def other() -> Iterator[psycopg.Connection[Any]]:
    """A second connection to the test database: the stuck transaction."""
    params = connection.get_connection_params()
    params.pop("pool", None)
    conn = psycopg.connect(**{k: v for k, v in params.items() if k != "cursor_factory"})
    try:
        yield conn
    finally:
        conn.close()


def _hold_group(conn: psycopg.Connection[Any]) -> None:
    conn.execute(
        "SELECT 1 FROM console_consistencygroup WHERE name = %s FOR NO KEY UPDATE", [GROUP]
    )


def _xid(post_batch: Any, gpu: str, node: str, at: datetime) -> None:
    event = {"kind": "device_event", "gpu": gpu, "event": "xid", "code": 79, "ts": iso(at)}
    assert post_batch(make_batch([event], node=node, sent_at=at)).status_code == 202


def test_it_sets_the_lock_and_idle_transaction_timeouts_on_service_connections(other):
    """The shipped values (the test process turns the idle timeout off for itself:
    pytest-django holds a transaction per test)."""
    options = settings.DATABASES["default"]["OPTIONS"]["options"]
    assert f"-c lock_timeout={settings.DB_LOCK_TIMEOUT_MS}" in options
    assert "-c idle_in_transaction_session_timeout=" in options
    assert settings.DB_LOCK_TIMEOUT_MS == 10_000
    with connection.cursor() as cursor:
        cursor.execute("SHOW lock_timeout")
        assert cursor.fetchone()[0] == "10s"


def test_the_shipped_idle_transaction_timeout_is_30_s(monkeypatch):
    import importlib

    import faultline.settings as live

    monkeypatch.delenv("FAULTLINE_DB_IDLE_IN_TRANSACTION_S", raising=False)
    fresh = importlib.reload(live)
    try:
        assert fresh.DB_IDLE_IN_TRANSACTION_S == 30
        assert (
            "-c idle_in_transaction_session_timeout=30000"
            in (fresh.DATABASES["default"]["OPTIONS"]["options"])
        )
    finally:
        monkeypatch.undo()
        importlib.reload(live)


def test_a_groups_batches_do_not_wait_for_a_pass_holding_its_row(post_batch, other):
    start = datetime.now(UTC) - timedelta(seconds=40)
    _history(post_batch, ranks=4, per_node=4, start=start, steps=5)
    _hold_group(other)
    at = datetime.now(UTC)
    steps = [
        {"kind": "step", "group": GROUP, "generation": 1, "rank": r, "step": 6, "tokens": 8,
         "ts": iso(at)}
        for r in range(4)
    ]  # fmt: skip
    t0 = time.monotonic()
    with connection.cursor() as cursor:  # a regression fails in 2 s, not in 10
        cursor.execute("SET lock_timeout = '2s'")
    try:
        assert post_batch(make_batch(steps, node="node-0", sent_at=at)).status_code == 202
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET lock_timeout")
    assert time.monotonic() - t0 < 1.5
    other.rollback()
    # Stored: the rank's live state moved (its activity waits for the next batch).
    (row,) = other.execute(
        "SELECT r.last_step FROM console_rank r JOIN console_consistencygroup g"
        " ON g.id = r.group_id WHERE g.name = %s AND r.rank = 0",
        [GROUP],
    ).fetchall()
    assert row == (6,)


def test_the_urgent_lane_opens_the_xid_while_a_pass_holds_the_group(post_batch, other):
    start = datetime.now(UTC) - timedelta(seconds=40)
    _history(post_batch, ranks=8, per_node=4, start=start, steps=20)
    xid_at = start + timedelta(seconds=21)
    _xid(post_batch, "GPU-node-1-1", "node-1", xid_at)
    _hold_group(other)
    t0 = time.monotonic()
    pipeline.diagnose_urgent(group_name=GROUP, node="node-1", now=xid_at + timedelta(seconds=2))
    assert time.monotonic() - t0 < 1.5
    (incident,) = Incident.objects.filter(group__name=GROUP)
    assert (incident.kind, incident.subject) == ("xid", "gpu:GPU-node-1-1")


def test_the_urgent_lane_gives_up_a_held_incident_within_half_a_second_and_retries(
    post_batch, other, monkeypatch
):
    """The same incident held by a pass (it judged the Xid too): the lane's wait is
    bounded, and its task asks Celery to try again in a second."""
    start = datetime.now(UTC) - timedelta(seconds=40)
    _history(post_batch, ranks=8, per_node=4, start=start, steps=20)
    xid_at = start + timedelta(seconds=21)
    _xid(post_batch, "GPU-node-1-1", "node-1", xid_at)
    pipeline.diagnose_urgent(group_name=GROUP, node="node-1", now=xid_at + timedelta(seconds=2))
    (incident,) = Incident.objects.filter(group__name=GROUP)
    other.execute("SELECT 1 FROM console_incident WHERE id = %s FOR NO KEY UPDATE", [incident.pk])
    t0 = time.monotonic()
    with pytest.raises(OperationalError) as raised:
        pipeline.diagnose_urgent(group_name=GROUP, node="node-1", now=xid_at + timedelta(seconds=3))
    assert locks.held_elsewhere(raised.value)
    assert time.monotonic() - t0 < 1.5

    retries: list[dict[str, Any]] = []

    class Retry(Exception):
        pass

    def retry(**kwargs: Any) -> Exception:
        retries.append(kwargs)
        return Retry()

    monkeypatch.setattr(tasks.diagnose_group, "retry", retry)
    with pytest.raises(Retry):
        tasks.diagnose_group(GROUP, scheduling.URGENT, "node-1")
    ((kwargs),) = retries
    assert kwargs["countdown"] == 1
    # It retries past the idle-transaction timeout, when Postgres has ended a stuck holder.
    assert kwargs["max_retries"] > settings.DB_IDLE_IN_TRANSACTION_S
    other.rollback()
    tasks.diagnose_group(GROUP, scheduling.URGENT, "node-1")  # the holder is gone: it runs


def test_an_ordinary_pass_leaves_a_held_group_to_the_next_pass(post_batch, other, caplog):
    start = datetime.now(UTC) - timedelta(seconds=40)
    _history(post_batch, ranks=4, per_node=4, start=start, steps=5)
    _hold_group(other)
    with connection.cursor() as cursor:
        cursor.execute("SET lock_timeout = '300ms'")  # the service's 10 s, shortened
    try:
        tasks.diagnose_group(GROUP)  # no exception: logged, left to the next pass
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET lock_timeout")
    assert "held by another transaction" in caplog.text
    assert not ConsistencyGroup.objects.get(name=GROUP).summary.get("diagnosed_at")
    other.rollback()
    tasks.diagnose_group(GROUP)
    assert ConsistencyGroup.objects.get(name=GROUP).summary.get("diagnosed_at")


def test_a_broken_database_is_not_mistaken_for_a_held_row():
    assert not locks.held_elsewhere(OperationalError("server closed the connection"))
    try:
        raise OperationalError("wrapped") from psycopg.errors.LockNotAvailable("55P03")
    except OperationalError as exc:
        assert locks.held_elsewhere(exc)
