"""The audit log's hash chain: appends chain, `verify` names an edited or deleted row, and
two connections appending at once keep one valid chain."""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from typing import Any

import pytest
from django.db import connection, connections, transaction

from console import auditchain
from console.actions.audit import AuditRow, audit, audit_many
from console.models import AuditLog

NOW = datetime(2026, 12, 1, 12, 0, 0, 123456, tzinfo=UTC)


def _write(count: int, *, actor: str = "ops", data: dict[str, Any] | None = None) -> None:
    for i in range(count):
        audit(actor=actor, verb="incident.ack", object_type="incident", object_id=str(i),
              reason=f"row {i}", data=data or {"i": i}, now=NOW)  # fmt: skip


def _as_dba(sql: str, params: list[Any]) -> None:
    """What a DBA could do past the append-only trigger: turn every trigger off, write."""
    with connection.cursor() as cur:
        cur.execute("ALTER TABLE console_auditlog DISABLE TRIGGER ALL")
        cur.execute(sql, params)
        cur.execute("ALTER TABLE console_auditlog ENABLE TRIGGER ALL")


def test_rows_chain_and_verify(db: Any) -> None:
    _write(3, data={"big": 1e20, "z": 1, "a": [1.5, "é"]})  # jsonb rewrites 1e20 and key order
    rows = list(AuditLog.objects.order_by("id"))
    assert rows[0].prev_hash == auditchain.GENESIS
    assert [r.prev_hash for r in rows[1:]] == [r.hash for r in rows[:-1]]
    report = auditchain.verify()
    assert report.ok and report.rows == 3 and report.head == rows[-1].hash
    assert "OK: 3 rows" in report.describe()


def test_edited_row_is_named(db: Any) -> None:
    _write(4)
    victim = AuditLog.objects.order_by("id")[2]
    _as_dba("UPDATE console_auditlog SET reason = 'nothing to see' WHERE id = %s", [victim.pk])
    report = auditchain.verify()
    assert not report.ok
    assert (report.broken_id, report.broken_verb, report.rows) == (victim.pk, "incident.ack", 2)
    assert "edited" in report.failed
    assert f"row id {victim.pk} (verb incident.ack)" in report.describe()


def test_deleted_row_is_detected(db: Any) -> None:
    _write(4)
    ids = list(AuditLog.objects.order_by("id").values_list("id", flat=True))
    _as_dba("DELETE FROM console_auditlog WHERE id = %s", [ids[1]])
    report = auditchain.verify()
    assert not report.ok and report.broken_id == ids[2]
    assert "prev_hash" in report.failed and "deleted" in report.failed


def test_rehashed_edit_still_breaks_the_next_row(db: Any) -> None:
    """An editor who recomputes the edited row's own hash breaks the link after it."""
    _write(3)
    first, second, _ = AuditLog.objects.order_by("id")
    forged = auditchain.row_hash(
        first.hash, ts=second.ts, actor=second.actor, verb=second.verb,
        object_type=second.object_type, object_id=second.object_id, reason="forged",
        data_text='{"i": 1}',
    )  # fmt: skip
    _as_dba("UPDATE console_auditlog SET reason = 'forged', hash = %s WHERE id = %s",
            [forged, second.pk])  # fmt: skip
    report = auditchain.verify()
    assert report.broken_id == second.pk + 1 and "prev_hash" in report.failed


def test_raw_insert_without_the_chain_is_named(db: Any) -> None:
    _write(2)
    with connection.cursor() as cur:
        cur.execute(
            "INSERT INTO console_auditlog (ts, actor, verb, object_type, object_id, reason, data)"
            " VALUES (now(), 'sneaky', 'user.grant', 'user', '1', '', '{}') RETURNING id"
        )
        row_id = cur.fetchone()[0]
    report = auditchain.verify()
    assert report.broken_id == row_id and report.broken_verb == "user.grant"


def test_bulk_appends_chain(db: Any) -> None:
    class Obj:
        def __init__(self, pk: int) -> None:
            self.pk = pk

    _write(1)
    audit_many([AuditRow("alert.received", Obj(i), data={"n": i}) for i in range(2500)],
               actor="alertmanager", now=NOW)  # fmt: skip
    _write(1)
    report = auditchain.verify(chunk=700)  # pages that split the bulk batches
    assert report.ok and report.rows == 2502


@pytest.mark.django_db(transaction=True)
def test_concurrent_appends_from_two_connections_keep_one_chain() -> None:
    """Two threads (two connections) append at once; one holds its transaction open after
    its append, so the other's append must wait for that commit and chain after it."""
    appended = threading.Event()
    errors: list[BaseException] = []

    def slow_holder() -> None:
        try:
            with transaction.atomic():
                _write(1, actor="holder")
                appended.set()
                threading.Event().wait(0.5)  # still uncommitted while the other appends
            _write(20, actor="holder")
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)
        finally:
            appended.set()
            connections.close_all()

    def racer() -> None:
        try:
            appended.wait(10)
            _write(20, actor="racer")
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=slow_holder), threading.Thread(target=racer)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    report = auditchain.verify()
    assert report.ok, report.describe()
    assert report.rows == 41
    first_racer = AuditLog.objects.filter(actor="racer").order_by("id").first()
    holder_first = AuditLog.objects.filter(actor="holder").order_by("id").first()
    assert first_racer is not None and holder_first is not None
    assert first_racer.prev_hash != auditchain.GENESIS  # it waited for the holder's commit
