"""Backup and restore as a drill: `faultline backup` a database holding an open incident,
a pending approval, audit rows and an agent token; `faultline restore` it into a fresh
database; everything is there, the audit chain verifies and the token authenticates.

Slow: it runs the CLI as a user would (four processes, each importing Django)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from django.db import connection
from django.utils import timezone

from console.actions import create_user, propose_action
from console.actions.audit import audit
from console.models import Action, Incident, Node
from ingest.auth import issue_token

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

FAULTLINE = str(Path(sys.executable).parent / "faultline")


def _url(database: str) -> str:
    return urlunsplit(urlsplit(os.environ["DATABASE_URL"])._replace(path=f"/{database}"))


def _cli(*args: str, database: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DATABASE_URL": _url(database)}
    return subprocess.run([FAULTLINE, *args], env=env, capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip


def _rows(database: str, sql: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(_url(database)) as conn:
        return conn.execute(sql).fetchall()


@pytest.fixture
def fresh_database() -> Any:
    name = f"restore_drill_{os.getpid()}"
    admin = _url("postgres")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    yield name
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_a_backup_restores_into_a_fresh_database_whole(tmp_path: Path, fresh_database: str) -> None:
    now = timezone.now()
    source = connection.settings_dict["NAME"]
    operator = create_user(
        actor="test", username="operator", role="operator", password="pw-operator-123"
    )
    node = Node.objects.create(name="n-01", pool="a100")
    incident = Incident.objects.create(
        node=node, fingerprint="fp-xid-n-01", kind="xid", subject="node:n-01",
        severity="critical", summary="Xid 79 on n-01", opened_at=now,
    )  # fmt: skip
    action = propose_action(kind="cordon_node", target="node:n-01", reason="xid 79",
                            actor=operator, now=now, incident_id=incident.pk).action  # fmt: skip
    assert action.state == "proposed"  # waiting for an approver
    for i in range(3):
        audit(actor="operator", verb="incident.ack", obj=incident, reason=f"look {i}", now=now)
    token = issue_token(node_name="n-01")
    audit_rows = _rows(source, "SELECT count(*) FROM console_auditlog")[0][0]

    dump = tmp_path / "faultline.dump"
    t0 = time.monotonic()
    backed = _cli("backup", str(dump), database=source)
    backup_s = time.monotonic() - t0
    assert backed.returncode == 0, backed.stderr
    assert dump.stat().st_size > 0 and not (tmp_path / "faultline.dump.partial").exists()

    t0 = time.monotonic()
    restored = _cli("restore", str(dump), database=fresh_database)
    restore_s = time.monotonic() - t0
    assert restored.returncode == 0, restored.stderr
    again = _cli("restore", str(dump), database=fresh_database)
    assert again.returncode == 2 and "not empty" in again.stderr and "--force" in again.stderr

    assert _rows(fresh_database, "SELECT id, state, fingerprint FROM console_incident") == [
        (incident.pk, "open", "fp-xid-n-01")
    ]
    assert _rows(fresh_database, "SELECT id, state, incident_id FROM console_action") == [
        (action.pk, "proposed", incident.pk)
    ]
    assert Action.objects.get(pk=action.pk).state == "proposed"  # the source is untouched

    t0 = time.monotonic()
    verified = _cli("audit", "verify", database=fresh_database)
    verify_s = time.monotonic() - t0
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert f"OK: {audit_rows} rows" in verified.stdout

    check = (f"from ingest.auth import authenticate; c = authenticate('Bearer {token}'); "
             "print('token node:', c.node.name if c else None)")  # fmt: skip
    authed = _cli("manage", "shell", "-c", check, database=fresh_database)
    assert "token node: n-01" in authed.stdout, authed.stdout + authed.stderr

    refused = _cli("restore", str(tmp_path / "missing.dump"), database=fresh_database)
    assert refused.returncode == 2 and "no backup at" in refused.stderr
    print(
        f"\nbackup-restore drill: backup {backup_s:.1f}s, restore {restore_s:.1f}s, "
        f"verify {verify_s:.1f}s (CLI wall, each with Python start-up); dump "
        f"{dump.stat().st_size / 1e3:.0f} kB; {backed.stdout.strip()}; {restored.stdout.strip()}"
    )


def test_a_backup_restores_into_a_fresh_embedded_instance(tmp_path: Path) -> None:
    """The `faultline up` user's drill: no DATABASE_URL, a new data directory (its own
    embedded Postgres, created empty by the restore), then `audit verify` there."""
    now = timezone.now()
    for i in range(5):
        audit(actor="admin", verb="breaker.open", reason=f"storm {i}", now=now)
    dump = tmp_path / "up.dump"
    assert _cli("backup", str(dump), database=connection.settings_dict["NAME"]).returncode == 0
    assert dump.stat().st_mode & 0o077 == 0  # hashes of passwords and tokens: owner only

    fresh = tmp_path / "fresh-instance"
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([FAULTLINE, *args, "--data-dir", str(fresh)], env=env,
                              capture_output=True, text=True, timeout=120, check=False)  # fmt: skip

    t0 = time.monotonic()
    restored = cli("restore", str(dump))
    restore_s = time.monotonic() - t0
    assert restored.returncode == 0, restored.stderr
    verified = cli("audit", "verify")
    assert verified.returncode == 0 and "OK: 5 rows" in verified.stdout, verified.stdout
    print(f"\nfresh-instance restore: {restore_s:.1f}s including initdb and start")
