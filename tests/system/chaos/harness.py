"""Fault injection against a real `faultline up`: kill, stop and restart its parts.

Owns finding the service's processes (gunicorn, uvicorn, Celery, Valkey, the embedded
Postgres), breaking them on purpose, putting them back, and reading the database directly to
count what was stored. It must never touch a process it cannot trace to the service under
test: every pid comes from that service's process tree or its own data directory.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from faultline.testing.service import Service, wait_for

PG_USER = "pgserver"  # pgserver runs Postgres as this system user when we are root


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: dict[str, Any]


def runtime(service: Service) -> dict[str, Any]:
    return json.loads((service.data_dir / "runtime.json").read_text())


def sql(service: Service, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Read the service's own database (fresh connection: the server may have restarted)."""
    import psycopg

    with psycopg.connect(runtime(service)["DATABASE_URL"], connect_timeout=5) as conn:
        return list(conn.execute(query, params).fetchall())


def children(service: Service) -> list[psutil.Process]:
    return psutil.Process(service.proc.pid).children(recursive=True)


def find(service: Service, *needles: str) -> list[psutil.Process]:
    """The service's processes whose command line contains every needle."""
    out = []
    for proc in children(service):
        with contextlib.suppress(psutil.Error):
            cmd = " ".join(proc.cmdline())
            if all(n in cmd for n in needles):
                out.append(proc)
    return out


def role_pids(service: Service) -> dict[str, list[int]]:
    """Top-level supervised children by role (the supervisor's direct children)."""
    roles = {"web": "gunicorn", "ws": "uvicorn", "worker": " worker", "beat": " beat"}
    out: dict[str, list[int]] = {k: [] for k in roles}
    for proc in psutil.Process(service.proc.pid).children():
        with contextlib.suppress(psutil.Error):
            cmd = " ".join(proc.cmdline())
            for role, needle in roles.items():
                if needle in cmd and "valkey" not in cmd:
                    out[role].append(proc.pid)
    return out


def kill(pids: list[int], sig: signal.Signals = signal.SIGKILL) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def wait_ready(service: Service, *, ready: bool = True, timeout: float = 60) -> None:
    def check() -> bool:
        status = get(service, "/readyz").body.get("ready")
        return status is ready

    wait_for(check, timeout, f"/readyz to say ready={ready}")


def get(service: Service, path: str, timeout: float = 15) -> Response:
    return _call(urllib.request.Request(service.url + path), timeout)


def post_batch(
    service: Service, token: str, batch: dict[str, Any], timeout: float = 30
) -> Response:
    request = urllib.request.Request(
        service.url + "/api/v1/ingest",
        data=gzip.compress(json.dumps(batch).encode()),
        method="POST",
        headers={
            "Authorization": f"Bearer {token}",
            "Content-Type": "application/json",
            "Content-Encoding": "gzip",
        },
    )
    return _call(request, timeout)


def _call(request: urllib.request.Request, timeout: float) -> Response:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=timeout) as r:
            return Response(r.status, dict(r.headers), _json(r.read()))
    except urllib.error.HTTPError as exc:
        return Response(exc.code, dict(exc.headers), _json(exc.read()))


def _json(raw: bytes) -> dict[str, Any]:
    try:
        out = json.loads(raw or b"{}")
    except ValueError:
        return {"raw": raw[:300].decode(errors="replace")}
    return out if isinstance(out, dict) else {"value": out}


# -- Postgres --------------------------------------------------------------------------


def _pgdata(service: Service) -> Path:
    return service.data_dir / "pg"


def _pg_ctl(service: Service, *args: str) -> None:
    from pgserver._commands import pg_ctl

    pg_ctl(list(args), pgdata=_pgdata(service), user=PG_USER, timeout=60)


def stop_postgres(service: Service) -> str:
    """Stop the embedded server (fast mode) and return its socket dir for the restart."""
    lines = (_pgdata(service) / "postmaster.pid").read_text().splitlines()
    socket_dir = lines[4]  # postmaster.pid line 5: the unix socket directory
    _pg_ctl(service, "-w", "-m", "fast", "stop")
    return socket_dir


def start_postgres(service: Service, socket_dir: str) -> None:
    """Start it again exactly as pgserver does, so DATABASE_URL stays valid."""
    pgdata = _pgdata(service)
    _pg_ctl(
        service, "-w", "-o", '-h ""', "-o", f"-k {socket_dir}", "-l", str(pgdata / "log"), "start"
    )


# -- Valkey ----------------------------------------------------------------------------


def valkey_proc(service: Service) -> psutil.Process:
    procs = find(service, "valkey")
    assert len(procs) == 1, f"expected one valkey child, got {procs}"
    return procs[0]


@contextlib.contextmanager
def valkey_outage(service: Service) -> Iterator[None]:
    """SIGKILL Valkey (an outage, not a shutdown) and keep it down for the block.

    `faultline up` revives its embedded Valkey within half a second, so the supervisor is
    paused (SIGSTOP; its children keep serving) for the outage and resumed afterwards: the
    recovery is then the supervisor's own revive, as in production.
    """
    supervisor = service.proc.pid
    os.kill(supervisor, signal.SIGSTOP)
    try:
        proc = valkey_proc(service)
        proc.kill()

        def gone() -> bool:
            # A zombie until `faultline up` reaps it (it is paused): that is gone.
            try:
                return proc.status() == psutil.STATUS_ZOMBIE
            except psutil.NoSuchProcess:
                return True

        wait_for(gone, 10, "Valkey to die")
        yield
    finally:
        os.kill(supervisor, signal.SIGCONT)


# -- workload --------------------------------------------------------------------------


class Trainer:
    """A fake training loop that reports through the agent's reporter socket.

    The kernel queue of a Unix datagram socket is short (10 on a bare kernel); a step the
    reporter counts as dropped is sent again, so `sent` is exactly what the agent received.
    """

    def __init__(self, socket_path: Path, group: str, rank: int = 0) -> None:
        from agents.reporter import Reporter

        self.reporter = Reporter(socket_path=str(socket_path), group=group, rank=rank)
        self.group = group
        self.sent: list[int] = []

    def step(self, n: int, *, loss: float = 1.0, ts: str | None = None) -> None:
        for _ in range(2000):
            before = self.reporter.dropped
            if ts is None:
                self.reporter.step(n, tokens=1024, duration_ms=50.0, loss=loss, data_cursor=n)
            else:
                self._raw_step(n, loss, ts)
            if self.reporter.dropped == before:
                self.sent.append(n)
                return
            time.sleep(0.005)
        raise AssertionError(f"agent socket refused step {n} for 10 s")

    def _raw_step(self, n: int, loss: float, ts: str) -> None:
        rec = {
            "kind": "step", "ts": ts, "group": self.group, "generation": 0,
            "rank": self.reporter.rank, "step": n, "tokens": 1024, "duration_ms": 50.0,
            "loss": loss, "data_cursor": n,
        }  # fmt: skip
        self.reporter._send(rec)

    def run(self, steps: range, every: float = 0.01, loss: float = 1.0) -> None:
        for n in steps:
            self.step(n, loss=loss)
            time.sleep(every)


def wait_agent_socket(state_dir: Path, timeout: float = 20) -> Path:
    path = state_dir / "reporter.sock"
    wait_for(path.exists, timeout, f"agent socket {path}")
    return path


def steps_stored(service: Service, group: str) -> list[int]:
    rows = sql(
        service,
        "SELECT s.step FROM ingest_steprecord s JOIN console_consistencygroup g "
        "ON g.id = s.group_id WHERE g.name = %s ORDER BY s.step",
        (group,),
    )
    return [r[0] for r in rows]


def stop_agent(proc: subprocess.Popen[bytes], timeout: float = 20) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()
