"""`faultline up` end to end: embedded servers, real agent over HTTP, clean shutdown.

Also the supervisor's restart rules and how the first admin's password is shown (fast).
"""

from __future__ import annotations

import io
import os
import stat
import subprocess
import urllib.error
from pathlib import Path

import pytest

from faultline import supervisor
from faultline.bootstrap import ADMIN_PASSWORD_FILE, AdminLogin, announce_admin
from faultline.embedded import free_port
from faultline.supervisor import restart_delay
from tests.system.conftest import (
    ADMIN,
    BIN,
    Service,
    service_env,
    start_service,
    stop_service,
    wait_for,
)

slow = pytest.mark.slow


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_it_restarts_after_half_a_second_then_doubles_while_a_child_keeps_dying() -> None:
    now = 10_000.0
    assert restart_delay([], now) == 0.5
    assert restart_delay([now - 5], now) == 1.0
    assert restart_delay([now - 50, now - 5], now) == 2.0
    assert restart_delay([now - 120, now - 61], now) == 0.5  # older than a minute: no burst


def test_it_caps_the_restart_delay_at_thirty_seconds() -> None:
    now = 10_000.0
    assert restart_delay([now - i for i in range(20)], now) == supervisor.MAX_DELAY_S == 30.0


def test_it_gives_up_only_after_thirty_deaths_in_ten_minutes() -> None:
    now = 10_000.0
    deaths = [now - 590 + i * 19 for i in range(supervisor.GIVE_UP_AFTER)]
    assert restart_delay(deaths[:-1], now) is not None
    assert restart_delay(deaths, now) is None
    assert restart_delay([t - 20 for t in deaths], now) is not None  # the oldest expired


def test_it_prints_a_generated_password_only_on_a_terminal(tmp_path: Path) -> None:
    out = _Terminal()
    announce_admin(AdminLogin("admin", "s3cret-generated", generated=True), tmp_path, out)
    assert "admin / s3cret-generated" in out.getvalue()
    assert not (tmp_path / ADMIN_PASSWORD_FILE).exists()


def test_it_puts_a_generated_password_in_an_owner_only_file_when_output_is_a_log(
    tmp_path: Path,
) -> None:
    out = io.StringIO()
    announce_admin(AdminLogin("admin", "s3cret-generated", generated=True), tmp_path, out)
    path = tmp_path / ADMIN_PASSWORD_FILE
    assert "s3cret-generated" not in out.getvalue()
    assert str(path) in out.getvalue()
    assert path.read_text() == "s3cret-generated\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_it_never_shows_a_password_the_operator_gave(tmp_path: Path) -> None:
    out = _Terminal()
    announce_admin(AdminLogin("root", "from-the-env-1", generated=False), tmp_path, out)
    assert "from-the-env-1" not in out.getvalue()
    assert "root (password from FAULTLINE_ADMIN_PASSWORD)" in out.getvalue()
    assert not (tmp_path / ADMIN_PASSWORD_FILE).exists()


@slow
def test_it_shows_a_real_agents_eight_gpus_through_the_rest_api(service):
    service.start_agent("node-api")

    def eight_gpus():
        devices = service.api("/api/v1/devices/?node=node-api")["results"]
        return devices if len(devices) == 8 else None

    devices = wait_for(eight_gpus, 30, "8 GPUs of node-api")
    assert all(d["last_sample"].get("temp_c") is not None for d in devices)
    nodes = {n["name"]: n for n in service.api("/api/v1/nodes/")["results"]}
    assert nodes["node-api"]["gpus"] == 8
    agents = service.api("/api/v1/agents/")["results"]
    assert any(a["node"] == "node-api" and a["batches"] >= 1 for a in agents)


@slow
def test_it_runs_the_service_as_a_role_that_may_only_append_to_the_audit_log(service):
    import json

    import psycopg

    url = json.loads((service.data_dir / "runtime.json").read_text())["DATABASE_URL"]
    with psycopg.connect(url, autocommit=True) as conn:
        assert conn.execute("SELECT current_user").fetchone() == ("faultline_app",)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("TRUNCATE console_auditlog")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SET session_replication_role = replica")
    # ...and the service still works under it: the API reads, ingest writes (above).
    assert service.api("/api/v1/audit/")["results"] is not None


@slow
def test_it_refuses_the_api_to_anonymous_callers(service):
    import urllib.error
    import urllib.request

    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(service.url + "/api/v1/nodes/", timeout=5)
    assert err.value.code == 401


@slow
def test_it_names_the_busy_port_and_the_flag_to_change_it(tmp_path: Path):
    import socket

    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
        sock.listen()
        out = subprocess.run(
            [str(BIN / "faultline"), "up", "--port", str(port), "--data-dir", str(tmp_path)],
            env=service_env(tmp_path),
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert out.returncode == 2
    assert out.stdout.strip() == (
        f"faultline: port {port} is already in use; choose another with --port N"
    )


@slow
def test_it_stops_every_child_and_reuses_its_data_on_the_next_start(tmp_path: Path):
    first = start_service(tmp_path)
    token = first.token("node-keep")
    assert stop_service(first) == 0
    pid_file = tmp_path / "pg" / "postmaster.pid"
    assert not pid_file.exists(), "embedded Postgres still running after SIGTERM"
    second = start_service(tmp_path)
    try:
        log = second.log.read_text()
        assert "first admin login" not in log  # admin exists from the first start
        second.start_agent("node-keep")
        wait_for(
            lambda: len(second.api("/api/v1/devices/?node=node-keep")["results"]) == 8,
            30,
            "agent on the restarted service",
        )
        assert token.startswith("flt_")
    finally:
        assert stop_service(second) == 0


@slow
def test_it_revives_its_embedded_valkey_and_keeps_serving(tmp_path: Path):
    import json
    import os
    import signal
    import urllib.request

    svc = start_service(tmp_path)
    try:
        pid = int((tmp_path / "valkey" / "valkey.pid").read_text())
        os.kill(pid, signal.SIGKILL)

        def ready_again():
            with urllib.request.urlopen(svc.url + "/readyz", timeout=3) as r:
                body = json.loads(r.read())
            new_pid = int((tmp_path / "valkey" / "valkey.pid").read_text() or 0)
            said = "embedded Valkey exited; restarted it on its port" in svc.log.read_text()
            return body["ready"] and new_pid != pid and said

        # The supervisor says so once its PING succeeds, which can be just after /readyz does.
        # 30 s each was too short beside a drill on the other worker (CI, 2 cores).
        wait_for(ready_again, 60, "a revived Valkey, /readyz and the supervisor saying so")
        svc.start_agent("node-after-valkey")
        wait_for(
            lambda: len(svc.api("/api/v1/devices/?node=node-after-valkey")["results"]) == 8,
            60,
            "ingest after the Valkey restart",
        )
    finally:
        assert stop_service(svc) == 0


@slow
def test_it_keeps_the_given_admin_password_out_of_up_log(service):
    log = service.log.read_text()
    assert f"first admin login: {ADMIN[0]} (password from FAULTLINE_ADMIN_PASSWORD)" in log
    assert ADMIN[1] not in log


@slow
def test_it_refuses_a_password_that_fails_django_validation(service):
    out = subprocess.run(
        [str(BIN / "faultline"), "user", "create", "shorty", "--role", "viewer",
         "--password", "short", "--data-dir", str(service.data_dir)],
        env=service_env(service.data_dir), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 2
    assert out.stdout.strip() == (
        "faultline: password refused for shorty: "
        "This password is too short. It must contain at least 8 characters."
    )
    with pytest.raises(urllib.error.HTTPError) as err:
        service.api("/api/v1/nodes/", auth=("shorty", "short"))
    assert err.value.code in (401, 403)
    service.cli("user", "create", "longer", "--role", "viewer", "--password", "long-enough-1")
    assert "results" in service.api("/api/v1/nodes/", auth=("longer", "long-enough-1"))


@slow
def test_it_writes_a_generated_admin_password_to_a_0600_file_and_not_to_up_log(
    tmp_path: Path,
) -> None:
    env = service_env(tmp_path)
    del env["FAULTLINE_ADMIN_PASSWORD"]
    port = free_port()
    ws_port = free_port(avoid=frozenset({port}))
    log = tmp_path / "up.log"
    proc = subprocess.Popen(
        [str(BIN / "faultline"), "up", "--port", str(port), "--ws-port", str(ws_port),
         "--data-dir", str(tmp_path), "--workers", "1", "--worker-concurrency", "1"],
        env=env, stdout=open(log, "wb"), stderr=subprocess.STDOUT,  # noqa: SIM115
        start_new_session=True,
    )  # fmt: skip
    svc = Service(f"http://127.0.0.1:{port}", port, ws_port, tmp_path, proc, log)
    try:
        wait_for(lambda: svc.api("/readyz", auth=("-", "-"))["ready"], 90, "faultline up")
        path = tmp_path / ADMIN_PASSWORD_FILE
        password = path.read_text().strip()
        assert len(password) >= 12
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        wait_for(lambda: "console at" in log.read_text(), 10, "the banner in up.log")
        text = log.read_text()
        assert password not in text
        assert f"first admin login: {ADMIN[0]}, password in {path} (mode 0600)" in text
        assert "results" in svc.api("/api/v1/nodes/", auth=(ADMIN[0], password))
    finally:
        assert stop_service(svc) == 0
    assert not (tmp_path / "runtime.json").exists()
    assert os.path.exists(tmp_path / ADMIN_PASSWORD_FILE)  # kept until the operator deletes it


@slow
def test_an_agent_keeps_one_connection_to_the_service_between_batches(service, tmp_path):
    # faultline up's gunicorn keeps an idle connection longer than an agent's send
    # interval (at most 5 s; gunicorn's own default is 2 s), so a fleet at rest pays no
    # TCP accept and close per batch; every batch is still stored, once.
    import time

    from agents.sender import AgentInfo, Sender
    from agents.spool import Identity, Spool
    from agents.wire import record

    identity = Identity(tmp_path)
    spool = Spool(tmp_path)
    sender = Sender(
        spool, identity, AgentInfo(identity.agent_id, "node-keepalive", "test"),
        server=service.url, token=service.token("node-keepalive"), state_dir=tmp_path,
    )  # fmt: skip
    try:
        for n in range(3):
            if n:
                time.sleep(3.0)  # longer than gunicorn's default keep-alive
            spool.append(record("heartbeat", uptime_s=float(n), spool_depth=0))
            assert sender.send_once()[0] == "acked"
    finally:
        sender.close()
        spool.close()
    assert sender._connection.opened == 1
    agents = service.api("/api/v1/agents/")["results"]
    assert [a["batches"] for a in agents if a["node"] == "node-keepalive"] == [3]


def test_every_shipped_web_server_keeps_agent_connections_longer_than_a_send_interval():
    """`faultline up`, docker-compose and the image run gunicorn with the same connection
    options, and its idle timeout outlasts the longest send interval an agent accepts."""
    import json
    import re

    import yaml

    from agents.cli import MAX_SEND_INTERVAL_S
    from faultline.bootstrap import WEB_KEEPALIVE, service_commands

    root = Path(__file__).parents[2]
    web = service_commands(
        host="127.0.0.1", port=1, ws_port=2, workers=1, worker_concurrency=1, directory=root
    )["web"]
    compose = yaml.safe_load((root / "docker-compose.yml").read_text())
    match = re.search(r"^CMD (\[.*?\])$", (root / "Dockerfile").read_text(), re.M | re.S)
    assert match is not None
    image = json.loads(match.group(1).replace("\\\n", ""))
    for command in (web, compose["services"]["web"]["command"], image):
        joined = " ".join(command)
        assert " ".join(WEB_KEEPALIVE) in joined, joined
    assert float(WEB_KEEPALIVE[WEB_KEEPALIVE.index("--keep-alive") + 1]) > MAX_SEND_INTERVAL_S


@slow
def test_it_refuses_to_start_with_a_weak_first_admin_password(tmp_path: Path) -> None:
    env = {**service_env(tmp_path), "FAULTLINE_ADMIN_PASSWORD": "password123"}
    port = free_port()
    done = subprocess.run(
        [str(BIN / "faultline"), "up", "--port", str(port), "--ws-port",
         str(free_port(avoid=frozenset({port}))), "--data-dir", str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout[-2000:]
    assert "FAULTLINE_ADMIN_PASSWORD is refused for admin: This password is too common." in (
        done.stdout
    )
    assert not (tmp_path / "runtime.json").exists()
