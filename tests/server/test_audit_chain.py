"""The audit log's hash chain, sealed by Postgres at commit: verify names an edited, deleted
or smuggled row, and two connections appending at once keep one valid chain."""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from typing import Any

import pytest
from django.db import DatabaseError, connection, connections, transaction

from console import auditchain
from console.actions.audit import AuditRow, audit, audit_many
from console.models import AuditLog

NOW = datetime(2026, 12, 1, 12, 0, 0, 123456, tzinfo=UTC)


def _write(count: int, *, actor: str = "ops", data: dict[str, Any] | None = None) -> None:
    for i in range(count):
        audit(actor=actor, verb="incident.ack", object_type="incident", object_id=str(i),
              reason=f"row {i}", data=data or {"i": i}, now=NOW)  # fmt: skip


def _commit_seals() -> None:
    """A test inside pytest-django's transaction never commits: fire the seal (deferred to
    commit) now, and at each later statement's end."""
    with connection.cursor() as cur:
        cur.execute("SET CONSTRAINTS console_auditlog_seal IMMEDIATE")


def _as_dba(sql: str, params: list[Any]) -> None:
    """What a DBA could do past the append-only trigger: turn every trigger off, write."""
    with connection.cursor() as cur:
        cur.execute("ALTER TABLE console_auditlog DISABLE TRIGGER ALL")
        cur.execute(sql, params)
        cur.execute("ALTER TABLE console_auditlog ENABLE TRIGGER ALL")


def test_rows_are_chained_at_commit_and_verify(db: Any) -> None:
    _write(3, data={"big": 1e20, "z": 1, "a": [1.5, "é"], "nul": None})
    assert set(AuditLog.objects.values_list("chain_seq", flat=True)) == {None}  # not yet
    _commit_seals()
    rows = list(AuditLog.objects.order_by("chain_seq"))
    assert [r.chain_seq for r in rows] == [1, 2, 3]
    assert rows[0].prev_hash == auditchain.GENESIS
    assert [r.prev_hash for r in rows[1:]] == [r.hash for r in rows[:-1]]
    report = auditchain.verify()
    assert report.ok and report.rows == 3 and report.head == rows[-1].hash
    assert "OK: 3 rows" in report.describe()


def test_edited_row_is_named(db: Any) -> None:
    _commit_seals()
    _write(4)
    victim = AuditLog.objects.order_by("chain_seq")[2]
    _as_dba("UPDATE console_auditlog SET reason = 'nothing to see' WHERE id = %s", [victim.pk])
    report = auditchain.verify()
    assert not report.ok
    assert (report.broken_id, report.broken_verb, report.rows) == (victim.pk, "incident.ack", 2)
    assert report.failed == auditchain.EDITED
    assert f"row id {victim.pk} (verb incident.ack)" in report.describe()


def test_deleted_row_is_detected(db: Any) -> None:
    _commit_seals()
    _write(4)
    ids = list(AuditLog.objects.order_by("chain_seq").values_list("id", flat=True))
    _as_dba("DELETE FROM console_auditlog WHERE id = %s", [ids[1]])
    report = auditchain.verify()
    assert not report.ok and report.broken_id == ids[2] and report.failed == auditchain.LINK


def test_an_edit_with_its_hash_recomputed_still_breaks_the_next_link(db: Any) -> None:
    _commit_seals()
    _write(3)
    second = AuditLog.objects.order_by("chain_seq")[1]
    _as_dba(
        "UPDATE console_auditlog SET reason = 'forged', hash = console_auditlog_digest("
        "prev_hash, ts, actor, verb, object_type, object_id, 'forged', data) WHERE id = %s",
        [second.pk],
    )
    report = auditchain.verify()
    assert report.broken_id == AuditLog.objects.get(chain_seq=3).pk
    assert report.failed == auditchain.LINK


def test_a_row_smuggled_in_with_the_triggers_off_is_named(db: Any) -> None:
    _commit_seals()
    _write(2)
    _as_dba(
        "INSERT INTO console_auditlog (ts, actor, verb, object_type, object_id, reason, data)"
        " VALUES (now(), 'sneaky', 'user.grant', 'user', '1', '', '{}')",
        [],
    )
    _write(1)  # a later append seals its own rows, never the smuggled one
    smuggled = AuditLog.objects.get(actor="sneaky")
    assert smuggled.chain_seq is None
    report = auditchain.verify()
    assert report.rows == 3
    assert (report.broken_id, report.broken_verb) == (smuggled.pk, "user.grant")
    assert report.failed == auditchain.UNSEALED


def test_raw_sql_inserts_are_chained_too(db: Any) -> None:
    _commit_seals()
    with connection.cursor() as cur:
        cur.execute(
            "INSERT INTO console_auditlog (ts, actor, verb, object_type, object_id, reason, data)"
            " SELECT now(), 'psql', 'note', 'system', g::text, '', '{}'"
            " FROM generate_series(1, 3) g"
        )
    assert auditchain.verify().rows == 3


def test_the_seal_cannot_be_borrowed_to_rewrite_a_sealed_row(db: Any) -> None:
    """The append-only trigger lets the seal's flag through only for a row not sealed yet
    and only for the chain's columns (the service's role cannot UPDATE at all)."""
    _commit_seals()
    _write(1)
    row = AuditLog.objects.get()
    with connection.cursor() as cur:
        cur.execute("SELECT set_config('faultline.audit_sealing', 'on', true)")
        for sql in ("UPDATE console_auditlog SET reason = 'x' WHERE id = %s",
                    "UPDATE console_auditlog SET hash = '' WHERE id = %s"):  # fmt: skip
            with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
                cur.execute(sql, [row.pk])
    assert auditchain.verify().ok


def test_bulk_appends_chain(db: Any) -> None:
    class Obj:
        def __init__(self, pk: int) -> None:
            self.pk = pk

    _write(1)
    audit_many([AuditRow("alert.received", Obj(i), data={"n": i}) for i in range(2500)],
               actor="alertmanager", now=NOW)  # fmt: skip
    _write(1)
    _commit_seals()
    report = auditchain.verify(chunk=700)  # pages that split the insert batches
    assert report.ok and report.rows == 2502


@pytest.mark.django_db(transaction=True)
def test_concurrent_appends_from_two_connections_keep_one_chain() -> None:
    """The holder writes first (the lower id) and commits last; meanwhile the racer commits
    twenty rows; then both append at once. One valid chain, in commit order."""
    written = threading.Event()
    raced = threading.Event()
    errors: list[BaseException] = []

    def holder() -> None:
        try:
            with transaction.atomic():
                _write(1, actor="holder")
                written.set()
                raced.wait(30)  # commits after the racer's rows
            _write(30, actor="holder")
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)
        finally:
            written.set()
            connections.close_all()

    def racer() -> None:
        try:
            written.wait(30)
            _write(20, actor="racer")
            raced.set()
            _write(30, actor="racer")
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)
        finally:
            raced.set()
            connections.close_all()

    threads = [threading.Thread(target=holder), threading.Thread(target=racer)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    report = auditchain.verify()
    assert report.ok, report.describe()
    assert report.rows == 81
    first = AuditLog.objects.order_by("id").first()
    assert first is not None and first.actor == "holder"
    assert first.chain_seq is not None and first.chain_seq > 20  # after the racer's twenty


def test_the_seal_takes_the_lock_this_module_names() -> None:
    from importlib import import_module

    migration = import_module("console.migrations.0016_audit_hash_chain")
    assert f"pg_advisory_xact_lock({auditchain.LOCK_KEY})" in migration.SEAL
