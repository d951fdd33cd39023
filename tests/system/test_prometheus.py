"""A real Prometheus (Debian's package) scrapes a running `faultline up` with the scrape token.

The test writes a scrape config, starts its own prometheus on a free port with a temporary
storage folder, lets an agent send a few batches, and asks Prometheus's HTTP API for
Faultline's series: ingest counted by gunicorn's workers, task runs counted by the Celery
worker (another process: multiprocess mode), the fleet read at scrape time. `promtool check
metrics` must find nothing to fix in what /metrics serves.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from faultline.embedded import free_port
from tests.system.conftest import Service, start_service, stop_service, wait_for

pytestmark = pytest.mark.slow

TOKEN = "prometheus-scrape-token-for-tests"
PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    if PROMETHEUS is None or PROMTOOL is None:
        pytest.skip("Debian's prometheus package is not installed (apt-get install prometheus)")
    svc = start_service(
        tmp_path_factory.mktemp("faultline-prom"), env={"FAULTLINE_METRICS_TOKEN": TOKEN}
    )
    try:
        yield svc
    finally:
        stop_service(svc)


@pytest.fixture(scope="module")
def prometheus(scraped: Service, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("prometheus")
    port = free_port()
    (folder / "token").write_text(TOKEN)
    (folder / "prometheus.yml").write_text(
        json.dumps(  # YAML is a superset of JSON
            {
                "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
                "scrape_configs": [
                    {
                        "job_name": "faultline",
                        "metrics_path": "/metrics",
                        "authorization": {"credentials_file": str(folder / "token")},
                        "static_configs": [{"targets": [f"127.0.0.1:{scraped.port}"]}],
                    }
                ],
            }
        )
    )
    log = open(folder / "prometheus.log", "wb")  # noqa: SIM115 - lives with the process
    proc = subprocess.Popen(
        [PROMETHEUS, f"--config.file={folder / 'prometheus.yml'}",
         f"--storage.tsdb.path={folder / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _get(url + "/-/ready", raw=True), 60, "prometheus to be ready")
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
        shutil.copy(folder / "prometheus.log", artifacts / "prometheus.log")


def _get(url: str, *, raw: bool = False, token: str | None = None) -> Any:
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=5) as response:
        body = response.read()
    return body if raw else json.loads(body)


def query(prometheus: str, promql: str) -> list[dict[str, Any]]:
    answer = _get(prometheus + "/api/v1/query?" + urllib.parse.urlencode({"query": promql}))
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


def test_it_is_scraped_by_a_real_prometheus_with_the_token(
    scraped: Service, prometheus: str
) -> None:
    scraped.start_agent("prom-node-1", "--send-interval", "1")

    def target_up() -> bool:
        return any(r["value"][1] == "1" for r in query(prometheus, 'up{job="faultline"}'))

    wait_for(target_up, 60, "prometheus to scrape faultline successfully")

    def ingested() -> list[dict[str, Any]]:
        return query(prometheus, 'faultline_ingest_batches_total{outcome="accepted"} > 0')

    wait_for(ingested, 90, "ingest batches counted in prometheus")
    # Counted by the Celery worker, served by gunicorn: the processes share samples.
    sweeps = query(prometheus, 'faultline_celery_tasks_total{task="console.sweep"} > 0')
    assert sweeps, "the Celery worker's task runs never reached the scrape"
    up = {r["metric"]["dependency"]: r["value"][1] for r in query(
        prometheus, "faultline_dependency_up")}  # fmt: skip
    assert up == {"postgres": "1", "valkey": "1"}

    def pool_counted() -> list[dict[str, Any]]:
        return query(prometheus, 'sum(faultline_pool_nodes{state="ok"}) >= 1')

    wait_for(pool_counted, 60, "the agent's node counted per pool")
    latency = query(
        prometheus, 'faultline_http_request_duration_seconds_count{route="/api/v1/ingest"}'
    )
    assert latency and float(latency[0]["value"][1]) >= 1
    # No series carries a per-request, per-rank or per-GPU label.
    labels = {name for r in query(prometheus, '{job="faultline"}') for name in r["metric"]}
    assert not labels & {"rank", "gpu", "uuid", "request_id", "node", "path"}


def test_it_serves_text_that_promtool_finds_nothing_to_fix(scraped: Service) -> None:
    assert PROMTOOL is not None
    text = _get(scraped.url + "/metrics", raw=True, token=TOKEN)
    assert b"faultline_ingest_batches_total" in text
    checked = subprocess.run(
        [PROMTOOL, "check", "metrics"], input=text, capture_output=True, timeout=30
    )
    assert (checked.returncode, checked.stdout + checked.stderr) == (0, b"")


def test_it_refuses_a_scrape_without_the_token(scraped: Service) -> None:
    with pytest.raises(urllib.error.HTTPError) as refused:
        _get(scraped.url + "/metrics", raw=True, token="wrong")
    assert refused.value.code == 401
