"""Start and stop the project's HTTP servers for benchmarks: gunicorn (WSGI) or uvicorn (ASGI).

Both get the same number of worker processes and the same environment, so a benchmark
compares the servers, not their settings. Used by bench/ingest.py; imports no Django.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def command(
    server: str, port: int, workers: int, threads: int = 4, extra: tuple[str, ...] | None = None
) -> list[str]:
    """`extra`: gunicorn's connection options; default `faultline up`'s (keep-alive etc.)."""
    py = sys.executable
    if server == "gunicorn":
        from faultline.bootstrap import WEB_KEEPALIVE

        return [
            py,
            "-m",
            "gunicorn",
            "faultline.wsgi:application",
            "--bind",
            f"127.0.0.1:{port}",
            "--workers",
            str(workers),
            "--worker-class",
            "gthread",
            "--threads",
            str(threads),
            *(WEB_KEEPALIVE if extra is None else extra),
            "--backlog",
            "2048",
            "--timeout",
            "60",
            "--log-level",
            "warning",
        ]
    if server == "uvicorn":
        return [
            py,
            "-m",
            "uvicorn",
            "faultline.asgi:django_asgi",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            str(workers),
            "--lifespan",
            "off",
            "--log-level",
            "warning",
            "--no-access-log",
        ]
    if server == "granian":  # a Rust HTTP front for the same WSGI app (measured, not shipped)
        return [
            py,
            "-m",
            "granian",
            "--interface",
            "wsgi",
            "faultline.wsgi:application",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            str(workers),
            "--blocking-threads",
            str(threads),
            "--backlog",
            "2048",
            "--log-level",
            "warning",
            "--no-access-log",
            "--http",
            "1",
        ]
    raise ValueError(f"unknown server {server!r}: use gunicorn, uvicorn or granian")


def wait_ready(port: int, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    """Poll until the server answers HTTP at all (any status), or fail loudly."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before it was ready")
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        try:
            conn.request("GET", "/healthz")
            conn.getresponse().read()
            return
        except OSError:
            time.sleep(0.1)
        finally:
            conn.close()
    raise RuntimeError(f"server on port {port} not ready after {timeout:.0f} s")


@contextlib.contextmanager
def running(
    server: str,
    port: int,
    env: dict[str, str],
    workers: int = 2,
    threads: int = 4,
    extra: tuple[str, ...] | None = None,
) -> Iterator[int]:
    """Run `server` on `port` for the duration of the block; yields the server's pid."""
    proc = subprocess.Popen(
        command(server, port, workers, threads, extra),
        cwd=ROOT,
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_ready(port, proc)
        yield proc.pid
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
