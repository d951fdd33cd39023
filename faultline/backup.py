"""`faultline backup FILE` and `faultline restore FILE`: pg_dump / pg_restore, as a drill.

Owns finding the client binaries (FAULTLINE_PG_BIN, else the embedded Postgres's own, else
PATH: a pg_dump older than the server refuses to dump it), the database URL (DATABASE_URL,
else the embedded Postgres under the data directory, as its superuser: the service's
`faultline_app` role may not read everything a dump needs), and the refusals that keep a
restore from overwriting a live database by accident. Must not import Django: a restore
runs before the target has a schema, and neither needs the broker.

A dump is pg_dump's custom format (-Fc, compressed). A restore runs in one transaction
(nothing half-restored on an error) without owners or grants: the target's roles are its
own. `faultline up` grants the service's role again at start; with an external Postgres run
`faultline manage db_roles` after a restore (docs/operations.md).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from faultline.embedded import Embedded, start_postgres
from faultline.env import env_str


class BackupError(RuntimeError):
    """A backup or restore could not run or was refused; the message says what to do."""


@dataclass(frozen=True)
class Result:
    path: Path
    seconds: float
    bytes: int
    tables: int = 0


def pg_binary(name: str) -> str:
    """`name` (pg_dump, pg_restore) from FAULTLINE_PG_BIN, the embedded Postgres, or PATH."""
    candidates: list[Path] = []
    if os.environ.get("FAULTLINE_PG_BIN"):
        candidates.append(Path(os.environ["FAULTLINE_PG_BIN"]) / name)
    with contextlib.suppress(ImportError):
        from pgserver._commands import POSTGRES_BIN_PATH

        candidates.append(Path(POSTGRES_BIN_PATH) / name)
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    found = shutil.which(name)
    if found is None:
        raise BackupError(
            f"{name} not found: install the Postgres client (the same major version as the "
            "server or newer), pip install 'faultline[embedded]', or set FAULTLINE_PG_BIN"
        )
    return found


@contextlib.contextmanager
def database_url(data_dir: Path) -> Iterator[str]:
    """The schema owner's URL where the service runs as `faultline_app` (which may not read
    everything a dump needs, nor create the schema): FAULTLINE_MIGRATE_DATABASE_URL, else
    DATABASE_URL, else the embedded Postgres of `data_dir` as its superuser (started or
    adopted, and stopped again unless another process holds it)."""
    url = env_str("FAULTLINE_MIGRATE_DATABASE_URL") or env_str("DATABASE_URL")
    if url:
        yield url
        return
    server, url = start_postgres(data_dir)
    try:
        yield url
    finally:
        Embedded(_pg=server).stop()


def _name(url: str) -> str:
    return urlsplit(url).path.lstrip("/") or "faultline"


def _run(cmd: list[str], what: str) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip().splitlines()
        raise BackupError(f"{what} failed (exit {proc.returncode}): {' | '.join(detail[-5:])}")


def backup(url: str, path: Path) -> Result:
    """Dump the database to `path` (written beside it first, then renamed: a failed or
    interrupted dump never leaves a file that looks whole)."""
    path = path.resolve()
    if not path.parent.is_dir():
        raise BackupError(f"cannot write {path}: {path.parent} is not a directory")
    partial = path.with_name(path.name + ".partial")
    started = time.monotonic()
    try:
        _run(
            [pg_binary("pg_dump"), "--format=custom", f"--file={partial}", f"--dbname={url}"],
            f"pg_dump of database {_name(url)}",
        )
        partial.chmod(0o600)  # it holds password and token hashes
        partial.replace(path)
    finally:
        partial.unlink(missing_ok=True)
    return Result(path, time.monotonic() - started, path.stat().st_size)


def _tables(url: str) -> list[str]:
    import psycopg

    try:
        with psycopg.connect(url, connect_timeout=10) as conn:
            rows = conn.execute(
                "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p') ORDER BY c.relname"
            ).fetchall()
    except psycopg.Error as exc:
        raise BackupError(f"cannot connect to the target database {_name(url)}: {exc}") from exc
    return [row[0] for row in rows]


def restore(url: str, path: Path, *, force: bool = False) -> Result:
    """Restore `path` into the database at `url`. Refuses a target that has tables unless
    `force` (then the dump's objects are dropped and recreated; others stay)."""
    path = path.resolve()
    if not path.is_file():
        raise BackupError(f"no backup at {path}")
    restore_bin = pg_binary("pg_restore")
    _run([restore_bin, "--list", str(path)], f"reading {path} (is it a `faultline backup`?)")
    existing = _tables(url)
    if existing and not force:
        shown = ", ".join(existing[:3]) + (", ..." if len(existing) > 3 else "")
        raise BackupError(
            f"the target database {_name(url)} is not empty ({len(existing)} tables: {shown}); "
            "restore into an empty database, or pass --force to drop and replace them"
        )
    started = time.monotonic()
    cmd = [
        restore_bin,
        "--no-owner",
        "--no-acl",
        "--single-transaction",
        "--exit-on-error",
        f"--dbname={url}",
        str(path),
    ]
    if existing:
        cmd[1:1] = ["--clean", "--if-exists"]
    _run(cmd, f"pg_restore into database {_name(url)}")
    return Result(path, time.monotonic() - started, path.stat().st_size, len(_tables(url)))
