"""Run a real `faultline up` on free ports and drive it from outside (tests and benches).

Starts the service exactly as a user would, with embedded Postgres and Valkey under a data
directory of its own, and offers the few client calls the system tests and benchmarks need.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from faultline.embedded import free_port

ADMIN = ("admin", "admin-pass-for-tests")
BIN = Path(sys.executable).parent
# `faultline up` (Postgres, migrations, web and Celery processes each importing Django) took
# 25-50 s to say ready on 2 cores shared with other services, and /readyz up to 30 s more.
START_TIMEOUT_S = 180


@dataclass
class Service:
    url: str
    port: int
    ws_port: int
    data_dir: Path
    proc: subprocess.Popen[bytes]
    log: Path
    agents: list[subprocess.Popen[bytes]] = field(default_factory=list)
    # Another release's checkout whose code this service runs (the upgrade test); None: ours.
    release: Path | None = None

    def api(self, path: str, *, auth: tuple[str, str] = ADMIN) -> Any:
        request = urllib.request.Request(self.url + path)
        basic = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        request.add_header("Authorization", f"Basic {basic}")
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    def login(self, auth: tuple[str, str] = ADMIN) -> tuple[str, str]:
        """Log in through the form like a browser: (Cookie header for later requests,
        the raw `Set-Cookie` line of the session, whose flags the security tests read)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        conn.request("GET", "/login/")
        resp = conn.getresponse()
        page = resp.read().decode()
        csrf = next(
            c.split(";")[0]
            for c in resp.headers.get_all("Set-Cookie") or []
            if c.startswith("csrftoken=")
        )
        match = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
        if match is None:
            raise RuntimeError("login page has no CSRF token")
        form = urllib.parse.urlencode(
            {"username": auth[0], "password": auth[1], "csrfmiddlewaretoken": match.group(1)}
        )
        conn.request(
            "POST",
            "/login/",
            body=form,
            headers={
                "Content-Type": "application/x-www-form-urlencoded",
                "Cookie": csrf,
                "Referer": self.url + "/login/",
            },
        )
        resp = conn.getresponse()
        resp.read()
        conn.close()
        session = next(c for c in resp.headers.get_all("Set-Cookie") or [] if "sessionid=" in c)
        return f"{csrf}; {session.split(';')[0]}", session

    def cli(self, *args: str) -> str:
        # The service's own release: a one-shot command migrates first, and ours would
        # migrate an older release's database under it.
        out = subprocess.run(
            [*faultline_command(self.release), *args, "--data-dir", str(self.data_dir)],
            env=service_env(self.data_dir, self.release),
            cwd=self.release,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if out.returncode != 0:
            # With the command's own words: a bare CalledProcessError hid why one died.
            raise AssertionError(
                f"faultline {' '.join(args)} exited {out.returncode}:\n{out.stderr[-3000:]}"
            )
        return out.stdout

    def token(self, node: str) -> str:
        return self.cli("token", "create", node).strip().splitlines()[-1]

    def start_agent(
        self, node: str, *extra: str, release: Path | None = None, server: str | None = None
    ) -> subprocess.Popen[bytes]:
        """An agent for `node` with 8 fake GPUs; `release`: another release's agent (its
        checkout), `server`: a URL in front of this service (a proxy) instead of its own."""
        state = _short_enough(self.data_dir / "agents" / node)
        agent = (
            [str(BIN / "faultline-agent")]
            if release is None
            else [sys.executable, "-m", "agents.cli"]
        )
        proc = subprocess.Popen(
            [
                *agent,
                "run",
                "--server",
                server or self.url,
                "--token",
                self.token(node),
                "--node",
                node,
                "--fake-gpus",
                "8",
                "--state-dir",
                str(state),
                *extra,
            ],
            stdout=subprocess.DEVNULL,
            # Appended: an agent replaced on the same state dir (an upgrade) keeps the old
            # one's lines beside its own.
            stderr=open(state / "agent.log", "ab"),  # noqa: SIM115 - lives with the process
            env=None if release is None else {**os.environ, "PYTHONPATH": str(release)},
            cwd=release,
        )
        self.agents.append(proc)
        return proc


# A Unix socket path holds at most 107 bytes; the agent's reporter socket lies in its state
# directory, which under an xdist worker's long tmp_path can pass that (the agent refuses
# to start).
_SOCKET_PATH_MAX = 107


def _short_enough(state: Path) -> Path:
    """`state`, made; where its reporter socket's path would be too long, a short directory
    in /tmp that `state` links to (readers of `state` see the agent's files either way)."""
    if len(str(state / "reporter.sock")) <= _SOCKET_PATH_MAX:
        state.mkdir(parents=True, exist_ok=True)
        return state
    if state.is_symlink():
        return state.resolve()
    short = Path(tempfile.mkdtemp(prefix="fl-agent-", dir="/tmp"))
    state.parent.mkdir(parents=True, exist_ok=True)
    if state.is_dir():  # an earlier agent's files (a restart on the same state)
        for item in state.iterdir():
            item.rename(short / item.name)
        state.rmdir()
    state.symlink_to(short, target_is_directory=True)
    return short


def faultline_command(release: Path | None = None) -> list[str]:
    """`faultline` of this checkout, or of another release's (`release`, run from its
    directory with its code first on PYTHONPATH: service_env)."""
    if release is None:
        return [str(BIN / "faultline")]
    return [sys.executable, "-m", "faultline.cli"]


def service_env(data_dir: Path, release: Path | None = None) -> dict[str, str]:
    # The test process's own database settings stay with it (faultline.testing.embedded).
    own = ("DATABASE_URL", "REDIS_URL", "FAULTLINE_DB_IDLE_IN_TRANSACTION_S")
    env = {k: v for k, v in os.environ.items() if not k.startswith(own)}
    env.update(
        FAULTLINE_DATA_DIR=str(data_dir),
        FAULTLINE_ADMIN_USER=ADMIN[0],
        FAULTLINE_ADMIN_PASSWORD=ADMIN[1],
        FAULTLINE_DB_POOL="1",
        # Test receivers listen on 127.0.0.1, which channels may not reach by default.
        FAULTLINE_NOTIFY_ALLOW_PRIVATE="1",
    )
    if release is not None:
        # Ahead of this checkout's editable install; the service's children inherit it.
        env["PYTHONPATH"] = str(release)
    return env


def wait_for(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
            if last:
                return last
        except (urllib.error.URLError, ConnectionError, OSError) as exc:
            last = exc
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last: {last!r}")


def start_service(
    data_dir: Path, env: dict[str, str] | None = None, *, release: Path | None = None
) -> Service:
    """`faultline up` on free ports; `env` adds settings (a scrape token, an OpenID provider);
    `release`: another release's checkout to run instead of this one (the upgrade test)."""
    port = free_port()
    ws_port = free_port(avoid=frozenset({port}))
    log = data_dir / "up.log"
    data_dir.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [
            *faultline_command(release),
            "up",
            "--port",
            str(port),
            "--ws-port",
            str(ws_port),
            "--data-dir",
            str(data_dir),
            "--workers",
            "2",
            "--worker-concurrency",
            "1",
        ],
        env={**service_env(data_dir, release), **(env or {})},
        cwd=release,
        stdout=open(log, "wb"),  # noqa: SIM115 - lives with the process
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    service = Service(
        f"http://127.0.0.1:{port}", port, ws_port, data_dir, proc, log, release=release
    )

    def ready() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"faultline up exited: {log.read_text()[-2000:]}")
        # /readyz's first answers build the migration graph: seconds on 2 loaded cores. A 2 s
        # client timeout gave up on every answer there while each abandoned request kept a
        # server thread busy, so the service never looked ready.
        with urllib.request.urlopen(service.url + "/readyz", timeout=15) as r:
            return json.loads(r.read())["ready"]

    try:
        wait_for(ready, START_TIMEOUT_S, "faultline up to become ready")
    except BaseException:
        # Never leave a service that did not come up running: its Postgres, Valkey, web
        # and Celery processes loaded the box for every later start (each then timed out).
        with contextlib.suppress(subprocess.TimeoutExpired):
            stop_service(service)
        raise
    return service


def stop_service(service: Service) -> int:
    for agent in service.agents:
        if agent.poll() is None:
            agent.send_signal(signal.SIGTERM)
    for agent in service.agents:
        try:
            agent.wait(10)
        except subprocess.TimeoutExpired:
            agent.kill()
    service.proc.send_signal(signal.SIGTERM)
    try:
        return service.proc.wait(40)
    except subprocess.TimeoutExpired:
        os.killpg(service.proc.pid, signal.SIGKILL)
        raise
