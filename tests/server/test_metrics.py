"""GET /metrics: who may scrape, what the service counts, the fleet read per scrape.

In-process against the real test Postgres and Valkey; the multiprocess folder is exercised
with real child processes writing to it. tests/system/test_prometheus.py scrapes a running
`faultline up` with a real Prometheus.
"""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from faultline import metrics_dir
from tests.conftest import make_batch

pytestmark = pytest.mark.django_db

TOKEN = "scrape-token-for-tests"


def scrape(client: Any, **extra: Any) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """{(sample name, sorted labels): value} of one authorised scrape."""
    response = client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"}, **extra)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.content.decode())
        for s in family.samples
    }


def value(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


@pytest.fixture
def token(settings: Any) -> str:
    settings.METRICS_TOKEN = TOKEN
    settings.METRICS_ALLOW_CIDRS = []
    return TOKEN


# -- access ---------------------------------------------------------------------------------


def test_it_refuses_every_scrape_until_a_token_or_network_is_configured(
    client: Any, settings: Any
) -> None:
    settings.METRICS_TOKEN, settings.METRICS_ALLOW_CIDRS = "", []
    response = client.get("/metrics", headers={"Authorization": "Bearer anything"})
    assert response.status_code == 403
    assert b"FAULTLINE_METRICS_TOKEN" in response.content


def test_it_refuses_a_wrong_or_missing_token(client: Any, token: str) -> None:
    wrong = client.get("/metrics", headers={"Authorization": "Bearer not-the-token"})
    assert wrong.status_code == 401
    assert wrong["WWW-Authenticate"].startswith("Bearer")
    assert client.get("/metrics").status_code == 401
    assert b"faultline_" not in wrong.content


def test_it_serves_a_client_inside_the_allowed_networks_without_a_token(
    client: Any, settings: Any
) -> None:
    from faultline.env import env_networks

    os.environ["TEST_CIDRS"] = "10.0.0.0/8, 192.0.2.7"
    try:
        settings.METRICS_ALLOW_CIDRS = env_networks("TEST_CIDRS")
    finally:
        del os.environ["TEST_CIDRS"]
    settings.METRICS_TOKEN = ""
    assert client.get("/metrics", REMOTE_ADDR="10.20.30.40").status_code == 200
    assert client.get("/metrics", REMOTE_ADDR="192.0.2.7").status_code == 200
    refused = client.get("/metrics", REMOTE_ADDR="192.0.2.8")
    assert refused.status_code == 403
    assert b"192.0.2.8" in refused.content
    # A forwarded-for header is never believed.
    spoofed = client.get("/metrics", REMOTE_ADDR="192.0.2.8", HTTP_X_FORWARDED_FOR="10.0.0.1")
    assert spoofed.status_code == 403


def test_it_stops_at_start_on_a_malformed_network(monkeypatch: pytest.MonkeyPatch) -> None:
    from faultline.env import ConfigError, env_networks

    monkeypatch.setenv("FAULTLINE_METRICS_ALLOW_CIDRS", "10.0.0.0/8,not-a-net")
    with pytest.raises(ConfigError, match="'not-a-net' is not a network"):
        env_networks("FAULTLINE_METRICS_ALLOW_CIDRS")


# -- what the service counts ----------------------------------------------------------------


def test_it_counts_ingest_batches_records_and_rejections_by_reason(
    client: Any, token: str, post_batch: Any
) -> None:
    before = scrape(client)
    batch = make_batch([{"kind": "heartbeat", "uptime_s": 1.0}] * 3, node="n-1", seq=1)
    assert post_batch(batch).status_code == 202
    assert post_batch(batch).status_code == 202  # replay
    assert post_batch(make_batch([{"kind": "bogus"}], node="n-1", seq=2)).status_code == 400
    assert post_batch(batch, token="not-a-token").status_code == 401
    after = scrape(client)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("faultline_ingest_batches_total", outcome="accepted") == 1
    assert delta("faultline_ingest_batches_total", outcome="duplicate") == 1
    assert delta("faultline_ingest_batches_total", outcome="rejected") == 2
    assert delta("faultline_ingest_records_total") == 3
    assert delta("faultline_ingest_rejections_total", reason="invalid") == 1
    assert delta("faultline_ingest_rejections_total", reason="unauthenticated") == 1


def test_it_times_requests_by_route_pattern_never_by_path(client: Any, token: str) -> None:
    client.get("/api/v1/groups/some-group-name/")
    samples = scrape(client)
    routes = {dict(labels).get("route") for (name, labels) in samples if "http" in name}
    assert "/api/v1/groups/<str:name>/" in routes
    assert not any("some-group-name" in str(route) for route in routes)
    count = value(
        samples,
        "faultline_http_request_duration_seconds_count",
        route="/api/v1/groups/<str:name>/",
        method="GET",
    )
    assert count >= 1


def test_it_reports_postgres_and_valkey_up_and_the_queue_depth(client: Any, token: str) -> None:
    from django.core.cache import cache

    from console.scheduling import HOUSEKEEPING_QUEUE, NOTIFY_QUEUE, URGENT_QUEUE

    redis = cache._cache.get_client(write=True)
    queues = ("celery", HOUSEKEEPING_QUEUE, URGENT_QUEUE, NOTIFY_QUEUE)
    redis.delete(*queues)
    redis.rpush("celery", "m1", "m2")
    redis.rpush(HOUSEKEEPING_QUEUE, "m1", "m2", "m3")
    redis.rpush(NOTIFY_QUEUE, "m1")
    try:
        samples = scrape(client)
    finally:
        redis.delete(*queues)
    assert value(samples, "faultline_dependency_up", dependency="postgres") == 1
    assert value(samples, "faultline_dependency_up", dependency="valkey") == 1
    assert value(samples, "faultline_celery_queue_depth", queue="celery") >= 2
    # Its worker down: the sweeps that page and mark silent nodes down wait.
    assert value(samples, "faultline_celery_queue_depth", queue=HOUSEKEEPING_QUEUE) == 3
    assert samples[("faultline_celery_queue_depth", (("queue", URGENT_QUEUE),))] == 0
    # Pages waiting: worker-notify is down or stuck on slow endpoints.
    assert value(samples, "faultline_celery_queue_depth", queue=NOTIFY_QUEUE) == 1


def test_it_counts_task_runs_diagnosis_passes_and_notification_outcomes(
    client: Any, token: str
) -> None:
    from faultline import metrics

    class Task:
        def __init__(self, name: str) -> None:
            self.name = name

    before = scrape(client)
    for n, (name, state, retval) in enumerate(
        [
            ("console.diagnose_group", "SUCCESS", None),
            ("console.diagnose_groups", "SUCCESS", [0.2, 0.3]),  # the sweep's: two passes
            ("console.check_group", "SUCCESS", True),  # a deadline's pass ran
            ("console.check_group", "SUCCESS", False),  # moved: no pass
            ("console.send_notification", "SUCCESS", "sent"),
            ("console.send_notification", "RETRY", None),
            ("something.else", "FAILURE", None),
        ]
    ):
        metrics._on_prerun(task_id=f"t{n}")
        metrics._on_postrun(task_id=f"t{n}", task=Task(name), retval=retval, state=state)
    metrics._on_revoked(sender=Task("console.sweep"), expired=True)  # waited past expiry
    after = scrape(client)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("faultline_diagnosis_duration_seconds_count") == 4
    assert delta("faultline_diagnosis_checks_total", outcome="ran") == 1
    assert delta("faultline_diagnosis_checks_total", outcome="moved") == 1
    assert delta("faultline_notifications_total", outcome="sent") == 1
    assert delta("faultline_notifications_total", outcome="retrying") == 1
    assert delta("faultline_celery_tasks_total", task="other", state="FAILURE") == 1
    assert delta("faultline_celery_task_duration_seconds_count", task="console.diagnose_group") == 1
    assert delta("faultline_celery_tasks_total", task="console.sweep", state="EXPIRED") == 1


# -- fleet state, read per scrape -----------------------------------------------------------


def _fleet() -> None:
    from console.models import ConsistencyGroup, Device, Incident, Node, Rank

    now = timezone.now()
    llama = ConsistencyGroup.objects.create(
        name="llama",
        kind="training",
        state="running",
        generation=3,
        last_activity=now,
        summary={
            "goodput": {"g_train_tokens_per_s": 1234.5, "productive_fraction": 0.9},
            "tail_ratio": 1.42,
            "diagnosed_at": (now - timedelta(seconds=4)).isoformat(),
        },
    )
    ConsistencyGroup.objects.create(name="chat", kind="serving", state="initializing")
    nodes = [
        Node.objects.create(name="gpu-node-01", pool="a100", health="ok"),
        Node.objects.create(name="gpu-node-02", pool="a100", health="critical"),
        Node.objects.create(name="gpu-node-03", pool="a100", health="ok", cordoned=True),
        Node.objects.create(name="gpu-node-04", pool="h100", health="ok", quarantined=True),
    ]
    Device.objects.create(uuid="GPU-6f1c2a9e-0000-4000-8000-000000000001", node=nodes[0], index=0)
    Rank.objects.create(group=llama, rank=917, node=nodes[0], gpu="GPU-6f1c2a9e")
    for severity, state in [("critical", "open"), ("critical", "acknowledged"), ("minor", "open"),
                            ("major", "resolved")]:  # fmt: skip
        Incident.objects.create(
            group=llama, fingerprint=f"{severity}-{state}", state=state, kind="xid",
            subject="gpu:GPU-6f1c2a9e", severity=severity, summary="s", opened_at=now,
        )  # fmt: skip


def test_it_exports_group_state_goodput_tail_and_open_incidents(client: Any, token: str) -> None:
    _fleet()
    s = scrape(client)
    assert value(s, "faultline_group_state", group="llama", state="running") == 1
    assert value(s, "faultline_group_state", group="llama", state="failed") == 0
    assert value(s, "faultline_group_state", group="chat", state="initializing") == 1
    assert value(s, "faultline_group_generation", group="llama") == 3
    assert value(s, "faultline_group_goodput_tokens_per_second", group="llama") == 1234.5
    assert value(s, "faultline_group_productive_fraction", group="llama") == 0.9
    assert value(s, "faultline_group_tail_ratio", group="llama") == 1.42
    assert value(s, "faultline_group_diagnosis_lag_seconds", group="llama") == pytest.approx(4)
    assert value(s, "faultline_group_open_incidents", group="llama", severity="critical") == 2
    assert value(s, "faultline_group_open_incidents", group="llama", severity="minor") == 1
    assert value(s, "faultline_group_open_incidents", group="llama", severity="major") == 0
    assert value(s, "faultline_open_incidents", severity="critical") == 2
    assert value(s, "faultline_group_info", group="chat", kind="serving") == 1
    # chat has no diagnosis yet: no goodput sample rather than a made-up zero.
    assert ("faultline_group_tail_ratio", (("group", "chat"),)) not in s


def test_it_counts_nodes_per_pool_by_state(client: Any, token: str) -> None:
    _fleet()
    s = scrape(client)
    assert value(s, "faultline_pool_nodes", pool="a100", state="ok") == 1
    assert value(s, "faultline_pool_nodes", pool="a100", state="critical") == 1
    assert value(s, "faultline_pool_nodes", pool="a100", state="cordoned") == 1
    assert value(s, "faultline_pool_nodes", pool="h100", state="quarantined") == 1
    assert value(s, "faultline_pool_nodes", pool="h100", state="ok") == 0


def test_it_never_labels_a_series_with_a_rank_gpu_node_or_path(client: Any, token: str) -> None:
    _fleet()
    client.get("/api/v1/groups/llama/?request_id=req-8d2f")
    labels = {v for (_, pairs) in scrape(client) for _, v in pairs}
    leaks = [v for v in labels if "GPU-" in v or "gpu-node" in v or v == "917" or "req-" in v]
    assert leaks == []


def test_it_caps_the_groups_it_reads_and_says_how_many_it_left_out(
    client: Any, token: str, settings: Any
) -> None:
    from console.models import ConsistencyGroup

    settings.METRICS_MAX_GROUPS = 2
    now = timezone.now()
    for i in range(5):
        ConsistencyGroup.objects.create(name=f"g{i}", last_activity=now + timedelta(seconds=i))
    s = scrape(client)
    shown = {dict(k[1])["group"] for k in s if k[0] == "faultline_group_generation"}
    assert shown == {"g4", "g3"}  # the most recently active
    assert value(s, "faultline_metrics_groups_omitted") == 3


def test_it_reads_the_fleet_in_the_same_few_queries_however_large(
    client: Any, token: str, django_assert_max_num_queries: Any
) -> None:
    from console.models import ConsistencyGroup, Node

    scrape(client)  # warm: session, content types
    for i in range(40):
        ConsistencyGroup.objects.create(name=f"q{i}")
        Node.objects.create(name=f"qn{i}", pool=f"p{i % 3}")
    with django_assert_max_num_queries(6):
        from console.metrics import families, read_fleet

        assert list(families(read_fleet()))


# -- multiprocess mode ----------------------------------------------------------------------

CHILD = """
import os, sys
from faultline import metrics
metrics.INGEST_RECORDS.inc(int(sys.argv[1]))
metrics.WEBSOCKET_CLIENTS.inc(int(sys.argv[1]))
"""


def test_it_sums_the_samples_every_process_wrote_and_forgets_dead_gauges(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prometheus_client import generate_latest

    from faultline import scrape as scrape_module

    monkeypatch.setenv(metrics_dir.ENV, str(tmp_path))
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    for n in (2, 5):  # two processes that have exited by now
        subprocess.run([sys.executable, "-c", CHILD, str(n)], env=env, check=True, timeout=60)
    assert len(list(tmp_path.glob("counter_*.db"))) == 2
    assert len(list(tmp_path.glob("gauge_livesum_*.db"))) == 2
    monkeypatch.setattr(scrape_module, "_Fleet", lambda deps: _Nothing())
    text = generate_latest(scrape_module.registry()).decode()
    samples = {
        s.name: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if not s.labels
    }
    assert samples["faultline_ingest_records_total"] == 7  # counters of dead processes stay
    assert samples.get("faultline_websocket_clients", 0) == 0  # their live gauges do not
    assert not list(tmp_path.glob("gauge_livesum_*.db"))


class _Nothing:
    def collect(self) -> list[Any]:
        return []


def test_it_empties_the_samples_folder_before_the_children_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(metrics_dir.ENV, "")  # unset for prepare(), restored afterwards
    folder = tmp_path / "metrics"
    folder.mkdir()
    (folder / "counter_123.db").write_bytes(b"old")
    (folder / "keep.txt").write_text("not ours")
    assert metrics_dir.prepare(tmp_path) == folder
    assert os.environ[metrics_dir.ENV] == str(folder)
    assert sorted(p.name for p in folder.iterdir()) == ["keep.txt"]
