"""`faultline up` end to end: embedded servers, real agent over HTTP, clean shutdown."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from faultline.embedded import free_port
from tests.system.conftest import BIN, service_env, start_service, stop_service, wait_for

pytestmark = pytest.mark.slow


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


def test_it_refuses_the_api_to_anonymous_callers(service):
    import urllib.error
    import urllib.request

    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(service.url + "/api/v1/nodes/", timeout=5)
    assert err.value.code == 401


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
            return body["ready"] and new_pid != pid

        wait_for(ready_again, 30, "a revived Valkey and /readyz")
        assert "embedded Valkey exited; restarted it on its port" in svc.log.read_text()
        svc.start_agent("node-after-valkey")
        wait_for(
            lambda: len(svc.api("/api/v1/devices/?node=node-after-valkey")["results"]) == 8,
            30,
            "ingest after the Valkey restart",
        )
    finally:
        assert stop_service(svc) == 0
