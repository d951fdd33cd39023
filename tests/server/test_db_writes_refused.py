"""A database whose volume is full (SQLSTATE 53100) or out of memory: ingest answers 503
with Retry-After and stores nothing of the batch, /readyz names the cause, /metrics counts
the refusals; no view turns it into a 500."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from django.db import OperationalError, connection
from prometheus_client import REGISTRY

from faultline import dbwrites
from ingest.models import BatchReceipt, DeviceSample
from tests.conftest import make_batch

pytestmark = pytest.mark.django_db


def _wrapped(error: Exception) -> OperationalError:
    """What Django raises for a psycopg error (its wrapper keeps the original as cause)."""
    try:
        raise OperationalError(str(error)) from error
    except OperationalError as exc:
        return exc


def _refused(reason: str) -> float:
    value = REGISTRY.get_sample_value("faultline_db_writes_refused_total", {"reason": reason})
    return value or 0.0


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (psycopg.errors.DiskFull("could not extend file"), ("disk_full", "53100")),
        (psycopg.errors.OutOfMemory("out of memory"), ("out_of_memory", "53200")),
        (psycopg.errors.InsufficientResources("no"), ("insufficient_resources", "53000")),
        (psycopg.errors.TooManyConnections("busy"), None),  # a connect, not a write
        (psycopg.errors.LockNotAvailable("held"), None),
    ],
)
def test_it_tells_a_refused_write_from_other_errors(error: Exception, expected: Any) -> None:
    assert dbwrites.refusal(_wrapped(error)) == expected
    assert dbwrites.refusal(OperationalError("server closed the connection")) is None


def _sample(gpu: str = "GPU-0") -> dict[str, Any]:
    return {"kind": "device_sample", "gpu": gpu, "index": 0, "temp_c": 51.0}


def test_ingest_answers_503_with_retry_after_when_the_disk_is_full(
    post_batch: Any, client: Any, monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    from ingest import views

    def full(**_: Any) -> None:
        raise _wrapped(psycopg.errors.DiskFull("could not extend file: No space left on device"))

    before = _refused("disk_full")
    monkeypatch.setattr(views, "store", full)
    response = post_batch(make_batch([_sample()]))
    assert response.status_code == 503
    assert response["Retry-After"] == str(dbwrites.RETRY_AFTER_S)
    assert "disk_full" in response.json()["error"]
    assert _refused("disk_full") == before + 1

    ready = client.get("/readyz")
    assert ready.status_code == 503
    body = ready.json()
    assert body["checks"]["database_writes"] is False
    assert body["checks"]["database"] is True  # reachable, not writable
    assert "disk_full (SQLSTATE 53100)" in body["reasons"]["database_writes"]

    settings.METRICS_TOKEN, settings.METRICS_ALLOW_CIDRS = "scrape-token", []
    metrics = client.get("/metrics", headers={"Authorization": "Bearer scrape-token"})
    assert metrics.status_code == 200
    assert b'faultline_db_writes_refused_total{reason="disk_full"}' in metrics.content


def test_a_real_disk_full_error_mid_batch_stores_nothing_of_it(post_batch: Any) -> None:
    """Postgres itself raises 53100 on the batch's telemetry rows (a trigger standing in for
    the full volume, past the receipt and live-state writes): the whole batch rolls back,
    and the same batch is stored whole once there is room."""
    table = DeviceSample._meta.db_table
    with connection.cursor() as cur:
        cur.execute(
            "CREATE FUNCTION test_disk_full() RETURNS trigger AS $$ BEGIN "
            "RAISE EXCEPTION 'could not extend file: No space left on device' "
            "USING ERRCODE = 'disk_full'; END $$ LANGUAGE plpgsql"
        )
        cur.execute(
            f"CREATE TRIGGER test_disk_full BEFORE INSERT ON {table} "
            "FOR EACH ROW EXECUTE FUNCTION test_disk_full()"
        )
    batch = make_batch([{"kind": "heartbeat", "uptime_s": 5}, _sample(), _sample("GPU-1")])
    response = post_batch(batch)
    assert response.status_code == 503, response.content
    assert response["Retry-After"] == str(dbwrites.RETRY_AFTER_S)
    assert BatchReceipt.objects.count() == 0
    assert DeviceSample.objects.count() == 0

    with connection.cursor() as cur:
        cur.execute(f"DROP TRIGGER test_disk_full ON {table}")
    again = post_batch(batch)
    assert again.status_code == 202 and again.json()["duplicate"] is False
    assert DeviceSample.objects.count() == 2


def test_a_view_whose_write_was_refused_answers_503_not_500(rf: Any) -> None:
    from faultline.middleware import DatabaseRefusalMiddleware

    middleware = DatabaseRefusalMiddleware(lambda request: None)  # type: ignore[arg-type, return-value]  # never called here
    request = rf.post("/api/v1/incidents/1/ack")
    response = middleware.process_exception(
        request, _wrapped(psycopg.errors.DiskFull("could not extend file"))
    )
    assert response is not None and response.status_code == 503
    assert response["Retry-After"] == str(dbwrites.RETRY_AFTER_S)
    assert middleware.process_exception(request, ValueError("a bug")) is None
