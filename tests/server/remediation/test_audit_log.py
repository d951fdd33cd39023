"""The audit log is append-only at the database, and every change writes to it."""

from __future__ import annotations

import pytest
from django.db import DatabaseError, connection, transaction

from console.models import AuditLog

pytestmark = pytest.mark.django_db


def test_it_refuses_an_update_of_an_audit_row_at_the_database(pool, propose):
    propose("node:n-01")
    row = AuditLog.objects.filter(verb="action.proposed").get()
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        AuditLog.objects.filter(pk=row.pk).update(reason="nothing happened")
    row.refresh_from_db()
    assert row.reason == "xid 79 storm"


def test_it_refuses_a_raw_sql_delete_of_an_audit_row(pool, propose):
    propose("node:n-01")
    before = AuditLog.objects.count()
    with (
        pytest.raises(DatabaseError, match="append-only"),
        transaction.atomic(),
        connection.cursor() as cur,
    ):
        cur.execute("DELETE FROM console_auditlog")
    assert AuditLog.objects.count() == before > 0


def test_it_records_who_proposed_and_why(pool, propose):
    outcome = propose("node:n-01")
    row = AuditLog.objects.get(verb="action.proposed")
    assert (row.actor, row.object_type, row.object_id) == (
        "operator",
        "action",
        str(outcome.action.pk),
    )
    assert row.data["target"] == "node:n-01"
