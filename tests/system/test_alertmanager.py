"""A real Alertmanager (Debian's prometheus-alertmanager) delivers to a running Faultline.

The test starts `faultline up` with FAULTLINE_ALERTMANAGER_TOKEN, a real agent (so the node
is in the inventory), and its own Alertmanager on free ports with a generated config whose
webhook receiver points at /api/v1/alertmanager with the token in
`http_config.authorization`. An alert posted through Alertmanager's API v2 arrives on the
node's incident; posted again with endsAt in the past, its resolve arrives and resolves
the evidence and the incident it opened.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from faultline.embedded import free_port
from tests.system.conftest import Service, start_service, stop_service, wait_for

pytestmark = pytest.mark.slow

TOKEN = "alertmanager-webhook-token-for-tests"
ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
NODE = "am-node-1"


@pytest.fixture(scope="module")
def faultline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    if ALERTMANAGER is None:
        pytest.skip(
            "Debian's prometheus-alertmanager is not installed "
            "(apt-get install prometheus-alertmanager)"
        )
    svc = start_service(
        tmp_path_factory.mktemp("faultline-am"), env={"FAULTLINE_ALERTMANAGER_TOKEN": TOKEN}
    )
    try:
        yield svc
    finally:
        stop_service(svc)


@pytest.fixture(scope="module")
def alertmanager(faultline: Service, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    assert ALERTMANAGER is not None
    folder = tmp_path_factory.mktemp("alertmanager")
    port = free_port()
    config = {
        "route": {"receiver": "faultline", "group_by": ["alertname", "instance"],
                  "group_wait": "1s", "group_interval": "1s", "repeat_interval": "1h"},
        "receivers": [{"name": "faultline", "webhook_configs": [{
            "url": f"{faultline.url}/api/v1/alertmanager", "send_resolved": True,
            "http_config": {"authorization": {"type": "Bearer", "credentials": TOKEN}},
        }]}],
    }  # fmt: skip
    (folder / "alertmanager.yml").write_text(json.dumps(config))  # YAML is a superset of JSON
    log = open(folder / "alertmanager.log", "wb")  # noqa: SIM115 - lives with the process
    proc = subprocess.Popen(
        [ALERTMANAGER, f"--config.file={folder / 'alertmanager.yml'}",
         f"--storage.path={folder / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
         "--cluster.listen-address="],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _call(url + "/-/ready", raw=True), 60, "alertmanager to be ready")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        artifacts = Path("test-artifacts")
        artifacts.mkdir(exist_ok=True)
        shutil.copy(folder / "alertmanager.log", artifacts / "alertmanager.log")


def _call(url: str, *, body: Any = None, raw: bool = False) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="POST" if data else "GET")
    request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=5) as response:
        payload = response.read()
    return payload if raw or not payload else json.loads(payload)


def _node_incident(faultline: Service) -> dict[str, Any] | None:
    rows = faultline.api("/api/v1/incidents/")
    rows = rows["results"] if isinstance(rows, dict) else rows
    return next((i for i in rows if i["node"] == NODE and i["external_alerts"]), None)


def test_it_takes_an_alert_from_a_real_alertmanager_and_its_resolve(
    faultline: Service, alertmanager: str
) -> None:
    faultline.start_agent(NODE, "--send-interval", "1")
    wait_for(lambda: faultline.api(f"/api/v1/nodes/{NODE}/"), 90, "the agent's node to report")
    start = datetime.now(UTC) - timedelta(seconds=30)
    alert = {"labels": {"alertname": "NodeFilesystemAlmostFull", "instance": f"{NODE}:9100",
                        "severity": "warning"},
             "annotations": {"summary": "/ is 97% full"},
             "startsAt": start.isoformat().replace("+00:00", "Z")}  # fmt: skip
    _call(alertmanager + "/api/v2/alerts", body=[alert])

    incident = wait_for(lambda: _node_incident(faultline), 60, "the alert on the node's incident")
    (evidence,) = incident["external_alerts"]
    assert (evidence["name"], evidence["status"]) == ("NodeFilesystemAlmostFull", "firing")
    assert (incident["kind"], incident["state"]) == ("external_alert", "open")

    ended = datetime.now(UTC) - timedelta(seconds=1)
    _call(alertmanager + "/api/v2/alerts",
          body=[{**alert, "endsAt": ended.isoformat().replace("+00:00", "Z")}])  # fmt: skip

    def resolved() -> dict[str, Any] | None:
        # The list reads the incidents and then their alerts in a second query (a prefetch),
        # so one response can hold the alert's resolve and not yet the incident's, committed
        # together: wait for both.
        found = _node_incident(faultline)
        done = found and found["state"] == "resolved"
        return found if done and found["external_alerts"][0]["status"] == "resolved" else None

    incident = wait_for(resolved, 60, "Alertmanager's resolve to reach Faultline")
    assert incident["state"] == "resolved"
    assert incident["external_alerts"][0]["resolved_at"] is not None
