"""The audit log is append-only against the service's own role.

A real login as the runtime role, on the embedded Postgres, after `db_roles` granted it:
everything that could rewrite history fails; what the service does every day works.
"""

from __future__ import annotations

import io
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from django.core.management import call_command
from django.db import connection

from faultline.dbroles import app_url

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def app_conn() -> Iterator[psycopg.Connection]:
    role = f"faultline_app_t{uuid.uuid4().hex[:10]}"
    out = io.StringIO()
    call_command("db_roles", "--role", role, stdout=out)
    assert "SELECT/INSERT on the audit log" in out.getvalue()
    s = connection.settings_dict
    conn = psycopg.connect(
        dbname=s["NAME"], host=s["HOST"], port=s["PORT"] or None, user=role, autocommit=True
    )
    try:
        yield conn
    finally:
        conn.close()
        _drop_role(role)


def _drop_role(role: str) -> None:
    with connection.cursor() as cur:
        cur.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [role])
        if cur.fetchone():
            cur.execute(f'REASSIGN OWNED BY "{role}" TO current_user')
            cur.execute(f'DROP OWNED BY "{role}"')
            cur.execute(f'DROP ROLE "{role}"')


def _refused(conn: psycopg.Connection, sql: str) -> str:
    with pytest.raises(psycopg.errors.InsufficientPrivilege) as err:
        conn.execute(sql)
    return str(err.value)


def _append(conn: psycopg.Connection) -> int:
    return conn.execute(
        "INSERT INTO console_auditlog (ts, actor, verb, object_type, object_id, reason, data)"
        " VALUES (now(), 'svc', 'test.appended', 'system', '', '', '{}') RETURNING id"
    ).fetchone()[0]


def test_it_lets_the_app_role_append_and_read_the_audit_log(app_conn):
    row = _append(app_conn)
    found = app_conn.execute("SELECT verb FROM console_auditlog WHERE id = %s", [row])
    assert found.fetchone() == ("test.appended",)
    # Its commit sealed it into the hash chain (the seal runs as the table's owner).
    sealed = app_conn.execute("SELECT chain_seq, hash FROM console_auditlog WHERE id = %s", [row])
    seq, digest = sealed.fetchone()
    assert seq is not None and len(digest) == 64
    from console import auditchain

    assert auditchain.verify().ok


DENIED = "permission denied for table console_auditlog"
NOT_OWNER = "must be owner of"  # "table" or "relation" console_auditlog


@pytest.mark.parametrize(
    ("sql", "why"),
    [
        # Privilege errors, not the trigger's (which says "append-only"): the role lacks the
        # right itself, so turning the trigger off would not help it either.
        ("UPDATE console_auditlog SET actor = 'someone else'", DENIED),
        ("DELETE FROM console_auditlog", DENIED),
        ("TRUNCATE console_auditlog", DENIED),
        ("ALTER TABLE console_auditlog DISABLE TRIGGER console_auditlog_append_only", NOT_OWNER),
        ("ALTER TABLE console_auditlog DISABLE TRIGGER ALL", NOT_OWNER),
        ("DROP TRIGGER console_auditlog_append_only ON console_auditlog", NOT_OWNER),
        ("ALTER TABLE console_auditlog OWNER TO CURRENT_USER", NOT_OWNER),
        ("DROP TABLE console_auditlog", NOT_OWNER),
        ("SET session_replication_role = replica", "permission denied to set parameter"),
        (
            "CREATE OR REPLACE FUNCTION console_auditlog_append_only() RETURNS trigger AS "
            "$$ BEGIN RETURN NEW; END; $$ LANGUAGE plpgsql",
            "must be owner of function console_auditlog_append_only",
        ),
    ],
)
def test_it_refuses_the_app_role_every_way_of_rewriting_history(app_conn, sql, why):
    _append(app_conn)
    assert why in _refused(app_conn, sql)
    assert app_conn.execute("SELECT count(*) FROM console_auditlog").fetchone()[0] >= 1


def test_it_leaves_the_app_role_its_daily_work(app_conn):
    from console.models import Node

    Node.objects.create(name="n-roles")
    app_conn.execute("UPDATE console_node SET last_seen = now() WHERE name = 'n-roles'")
    # Beat creates and drops daily partitions (ingest/partitions.py): owner-only DDL.
    app_conn.execute(
        "CREATE TABLE ingest_devicesample_p29990101 PARTITION OF ingest_devicesample "
        "FOR VALUES FROM ('2999-01-01') TO ('2999-01-02')"
    )
    app_conn.execute("DROP TABLE ingest_devicesample_p29990101")
    app_conn.execute("DELETE FROM console_node WHERE name = 'n-roles'")


def test_it_swaps_only_the_user_in_the_app_url():
    owner = "postgresql://postgres:pw@db.example:5433/faultline?sslmode=require"
    assert app_url(owner, password="s/cret") == (
        "postgresql://faultline_app:s%2Fcret@db.example:5433/faultline?sslmode=require"
    )


def test_it_hands_faultline_up_an_app_role_url_for_the_embedded_postgres(tmp_path):
    from faultline.dbroles import embedded_app_url

    s = connection.settings_dict
    owner = f"postgresql://{s['USER']}@/{s['NAME']}?host={s['HOST']}" + (
        f"&port={s['PORT']}" if s["PORT"] else ""
    )
    role = f"faultline_app_t{uuid.uuid4().hex[:10]}"
    try:
        url = embedded_app_url(owner, tmp_path, role=role)
        assert (tmp_path / "app-db-password").stat().st_mode & 0o777 == 0o600
        with psycopg.connect(url, autocommit=True) as conn:
            assert conn.execute("SELECT current_user").fetchone() == (role,)
            assert "permission denied" in _refused(conn, "TRUNCATE console_auditlog")
        assert embedded_app_url(owner, tmp_path, role=role) == url  # idempotent, same password
    finally:
        _drop_role(role)
