"""Database roles: migrations own the schema, the service runs as `faultline_app`.

Owns the grants that make the audit log append-only against the service itself.
The role that runs migrations (the owner) keeps owning `console_auditlog` and its
trigger; the service's runtime role may only SELECT and INSERT there, so it can neither
UPDATE, DELETE nor TRUNCATE a row, nor disable the trigger (owner only), nor set
`session_replication_role` (superuser only). Elsewhere it gets plain DML, plus ownership
of the partitioned telemetry tables, because creating and dropping daily partitions
(ingest/partitions.py, run by beat) needs the parent's owner. The owner is made a member
of the app role so later migrations can still alter those tables; never the reverse.

`grant_app_role` runs as the owner (after every `migrate`: `manage.py db_roles`);
`embedded_app_url` is the same for the embedded single-machine Postgres of `faultline up`.
"""

from __future__ import annotations

import re
import secrets
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

APP_ROLE = "faultline_app"
AUDIT_TABLE = "console_auditlog"
_ROLE = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
_DML = "SELECT, INSERT, UPDATE, DELETE"


class RoleError(RuntimeError):
    """The roles cannot be set up as asked; the message says what to change."""


def _ident(name: str) -> str:
    if not _ROLE.match(name):
        raise RoleError(f"role name {name!r} must be lower-case letters, digits and _")
    return f'"{name}"'


def _partitioned_tables(cur: Any) -> list[str]:
    """Partitioned parents in public and every partition under them (any depth)."""
    cur.execute(
        """
        WITH RECURSIVE tree AS (
            SELECT c.oid, c.relname FROM pg_class c
            JOIN pg_namespace n ON n.oid = c.relnamespace
            WHERE n.nspname = 'public' AND c.relkind = 'p'
            UNION
            SELECT c.oid, c.relname FROM pg_inherits i
            JOIN tree t ON i.inhparent = t.oid JOIN pg_class c ON c.oid = i.inhrelid
        )
        SELECT relname FROM tree ORDER BY relname
        """
    )
    return [row[0] for row in cur.fetchall()]


def grant_app_role(connection: Any, *, role: str = APP_ROLE, password: str | None = None) -> str:
    """Create (or fix) `role` and grant it what the service needs; return the owner's name.

    Run as the role that owns the schema (it ran the migrations). Idempotent: run it after
    every migrate, so tables a migration added are granted too.
    """
    app = _ident(role)
    with connection.cursor() as cur:
        cur.execute("SELECT current_user")
        owner = cur.fetchone()[0]
        if owner == role:
            raise RoleError(
                f"db_roles runs as the schema owner, not as {role}: point DATABASE_URL (or "
                "FAULTLINE_MIGRATE_DATABASE_URL with --database owner) at the owner role"
            )
        cur.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [role])
        exists = cur.fetchone() is not None
        attrs = "LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS"
        cur.execute(f"{'ALTER' if exists else 'CREATE'} ROLE {app} {attrs}")
        if password:
            # A utility statement takes no bound parameters: a quoted literal instead
            # (standard_conforming_strings is on in every supported Postgres).
            literal = "'" + password.replace("'", "''") + "'"
            cur.execute(f"ALTER ROLE {app} PASSWORD {literal}")
        cur.execute("SELECT pg_has_role(%s, %s, 'MEMBER')", [role, owner])
        if cur.fetchone()[0]:
            raise RoleError(
                f"{role} is a member of the owner role {owner}: it could act as the owner "
                f"(REVOKE {owner} FROM {role})"
            )
        ident_owner = '"' + str(owner).replace('"', '""') + '"'
        # The owner may then alter what the app owns (partitioned tables) in migrations.
        cur.execute(f"GRANT {app} TO {ident_owner}")
        cur.execute("SELECT current_database()")
        database = cur.fetchone()[0]
        cur.execute(f'GRANT CONNECT, TEMPORARY ON DATABASE "{database}" TO {app}')
        cur.execute(f"GRANT USAGE, CREATE ON SCHEMA public TO {app}")
        cur.execute(f"GRANT {_DML} ON ALL TABLES IN SCHEMA public TO {app}")
        cur.execute(f"GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO {app}")
        cur.execute(
            f"ALTER DEFAULT PRIVILEGES FOR ROLE {ident_owner} IN SCHEMA public "
            f"GRANT {_DML} ON TABLES TO {app}"
        )
        cur.execute(
            f"ALTER DEFAULT PRIVILEGES FOR ROLE {ident_owner} IN SCHEMA public "
            f"GRANT USAGE, SELECT ON SEQUENCES TO {app}"
        )
        for table in _partitioned_tables(cur):
            cur.execute(f'ALTER TABLE "{table}" OWNER TO {app}')
        # The audit log last, so nothing above widens it: read and append, nothing more.
        cur.execute(f"ALTER TABLE {AUDIT_TABLE} OWNER TO {ident_owner}")
        cur.execute(f"REVOKE ALL ON {AUDIT_TABLE} FROM {app}")
        cur.execute(f"GRANT SELECT, INSERT ON {AUDIT_TABLE} TO {app}")
        cur.execute("ALTER FUNCTION console_auditlog_append_only() OWNER TO " + ident_owner)
    return str(owner)


def app_url(owner_url: str, *, role: str = APP_ROLE, password: str = "") -> str:
    """`owner_url` with the user (and password) replaced by the app role's."""
    parts = urlsplit(owner_url)
    host = parts.hostname or ""
    netloc = quote(role) + (":" + quote(password, safe="") if password else "") + "@"
    netloc += host + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def embedded_app_url(owner_url: str, data_dir: Path, *, role: str = APP_ROLE) -> str:
    """For `faultline up` on the embedded Postgres: grant the app role, return its URL.

    Call after `migrate`, with the superuser URL the embedded server gave, and export the
    result as DATABASE_URL to the children (web, ws, worker, beat). The password is made
    once and kept in the data dir (0600); the embedded server trusts local connections,
    so it matters only if that server is ever exposed.
    """
    import psycopg

    path = data_dir / "app-db-password"
    if not path.exists():
        path.write_text(secrets.token_urlsafe(24))
        path.chmod(0o600)
    password = path.read_text().strip()

    class _Conn:  # the cursor() shape grant_app_role expects, over a plain connection
        def __init__(self, conn: Any) -> None:
            self.conn = conn

        def cursor(self) -> Any:
            return self.conn.cursor()

    with psycopg.connect(owner_url, autocommit=False) as conn:
        grant_app_role(_Conn(conn), role=role, password=password)
        conn.commit()
    return app_url(owner_url, role=role, password=password)
