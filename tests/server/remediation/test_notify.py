"""Escalation pages through a real local HTTP receiver: once per step, resolves always sent."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from console import actions, notify_tasks
from console.models import (
    ConsistencyGroup,
    EscalationPolicy,
    Incident,
    IncidentEscalation,
    NotificationChannel,
    NotificationDelivery,
)
from console.notify import transport, webhook

pytestmark = pytest.mark.django_db
SECRET = "hook-secret"


class Receiver:
    """A local webhook endpoint: records each body; answers `status` (500 → retry)."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.status = 200
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers["Content-Length"]))
                webhook.verify(raw, dict(self.headers), SECRET, remediation_now())
                if owner.status == 200:
                    owner.bodies.append(json.loads(raw))
                self.send_response(owner.status)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def remediation_now():
    from django.utils import timezone

    return timezone.now()


@pytest.fixture
def receiver(settings: Any) -> Iterator[Receiver]:
    settings.NOTIFY_ALLOW_PRIVATE = True  # the receiver listens on 127.0.0.1
    r = Receiver()
    yield r
    r.server.shutdown()
    r.server.server_close()


@pytest.fixture
def incident(receiver: Receiver, now) -> Incident:
    NotificationChannel.objects.create(name="hook", kind="webhook", url=receiver.url, secret=SECRET)
    EscalationPolicy.objects.create(
        name="critical", severities=["critical"], steps=[{"delay_s": 0, "channels": ["hook"]}]
    )
    group = ConsistencyGroup.objects.create(name="llama")
    return Incident.objects.create(
        group=group,
        fingerprint="fp",
        kind="xid",
        subject="gpu:GPU-1",
        severity="critical",
        summary="Xid 79 on GPU-1",
        opened_at=now,
    )


def _sweep_and_deliver(now, times: int = 1) -> list[str]:
    """Run the sweep, then deliver each enqueued send `times` times (Celery redelivery)."""
    enqueued = actions.schedule_due(now=now)
    statuses = []
    for _ in range(times):
        for incident_id, key, channel, event in enqueued:
            statuses.append(
                actions.deliver(
                    incident_id=incident_id, key=key, channel=channel, event=event, now=now
                )
            )
    return statuses


def test_it_pages_once_even_when_the_task_is_delivered_twice(incident, receiver, now):
    assert _sweep_and_deliver(now, times=2) == ["sent", "sent"]
    assert [b["event"] for b in receiver.bodies] == ["trigger"]
    assert _sweep_and_deliver(now + timedelta(seconds=10)) == []
    assert len(receiver.bodies) == 1


def test_it_freezes_the_policy_when_the_incident_opens(incident, now):
    actions.schedule_due(now=now)
    EscalationPolicy.objects.update(steps=[{"delay_s": 999, "channels": ["other"]}])
    snapshot = IncidentEscalation.objects.get(incident=incident).snapshot
    assert snapshot["steps"][0]["channels"] == ["hook"]


def test_it_always_sends_the_resolve_of_an_incident_that_paged(incident, receiver, now):
    _sweep_and_deliver(now)
    actions.create_silence(
        matchers={"group": "llama"},
        starts_at=now,
        ends_at=now + timedelta(hours=1),
        reason="maintenance",
        actor=_admin(),
        now=now,
    )
    Incident.objects.filter(pk=incident.pk).update(state="resolved", resolved_at=now)
    _sweep_and_deliver(now + timedelta(seconds=1), times=2)
    assert [b["event"] for b in receiver.bodies] == ["trigger", "resolve"]
    assert IncidentEscalation.objects.get(incident=incident).done is True


def test_it_holds_a_page_back_while_silenced_and_says_which_silence(incident, receiver, now):
    silence = actions.create_silence(
        matchers={"kind": "xid"},
        starts_at=now,
        ends_at=now + timedelta(hours=1),
        reason="firmware rollout",
        actor=_admin(),
        now=now,
    )
    assert _sweep_and_deliver(now) == []
    assert receiver.bodies == []
    assert IncidentEscalation.objects.get(incident=incident).silenced_by_id == silence.pk


def test_it_retries_a_5xx_and_then_sends_exactly_once(incident, receiver, now):
    enqueued = actions.schedule_due(now=now)
    ((incident_id, key, channel, event),) = enqueued
    receiver.status = 503
    with pytest.raises(transport.RetryableError, match="HTTP 503"):
        actions.deliver(incident_id=incident_id, key=key, channel=channel, event=event, now=now)
    delivery = NotificationDelivery.objects.get(incident=incident, key=key)
    assert (delivery.status, delivery.attempts) == ("retrying", 1)
    receiver.status = 200
    for _ in range(2):
        actions.deliver(incident_id=incident_id, key=key, channel=channel, event=event, now=now)
    assert len(receiver.bodies) == 1


def test_it_declares_retries_with_backoff_on_the_send_task():
    task = notify_tasks.send_notification
    assert task.name == "console.send_notification"
    assert task.autoretry_for == (transport.RetryableError,)
    assert task.retry_backoff and task.max_retries == 10


@pytest.mark.django_db(transaction=True)
def test_an_incident_a_stuck_pass_holds_does_not_hold_the_other_incidents_pages(
    incident, receiver, now
):
    """A diagnosis pass locks its group's incidents FOR UPDATE until it commits. The
    escalation row's foreign key waited for that lock, so one pass stuck mid-transaction
    (a frozen worker; seen in CI) held every incident's page and the housekeeping
    process. The held incident is frozen by the first sweep after the pass ends."""
    import psycopg
    from django.db import connection

    other = Incident.objects.create(
        group=ConsistencyGroup.objects.create(name="other"), fingerprint="fp2", kind="xid",
        subject="gpu:GPU-2", role="root_cause", severity="critical", opened_at=now,
    )  # fmt: skip
    params = connection.get_connection_params()
    params.pop("pool", None)
    stuck = psycopg.connect(**{k: v for k, v in params.items() if k != "cursor_factory"})
    try:
        stuck.execute("SELECT 1 FROM console_incident WHERE id = %s FOR UPDATE", [incident.pk])
        with connection.cursor() as cur:  # never wait long, should the sweep still block
            cur.execute("SET lock_timeout = '5s'")
        enqueued = actions.schedule_due(now=now)
        assert [row[0] for row in enqueued] == [other.pk]
        assert not IncidentEscalation.objects.filter(incident=incident).exists()
    finally:
        stuck.close()  # the pass ends (here: rolls back)
        with connection.cursor() as cur:
            cur.execute("RESET lock_timeout")
    assert [row[0] for row in actions.schedule_due(now=now)] == [incident.pk]


def test_a_page_and_its_retries_go_to_the_notify_queue_not_behind_diagnosis(monkeypatch):
    """Pages have a worker of their own (`worker-notify`): on the default queue a page
    waited behind a saturated worker's diagnosis passes."""
    from console import scheduling
    from faultline.celery import app

    sent: list[tuple[str, dict]] = []

    class Broker:
        def send_task(self, name: str, args: list, **options: object) -> None:
            sent.append((name, options))

    monkeypatch.setattr(scheduling, "current_app", Broker())
    scheduling.send_notification(7, "step:0", "oncall", "trigger")
    ((name, options),) = sent
    assert name == scheduling.SEND_NOTIFICATION == notify_tasks.send_notification.name
    assert options["queue"] == scheduling.NOTIFY_QUEUE and options["expires"] is None
    # A retry is published by Celery itself, through its router: the same queue.
    route = app.amqp.router.route({}, scheduling.SEND_NOTIFICATION)
    assert route["queue"].name == scheduling.NOTIFY_QUEUE
    assert app.amqp.router.route({}, scheduling.DIAGNOSE_GROUP)["queue"].name == "celery"


def _admin():
    from console.actions import create_user

    return create_user(actor="test", username="silencer", role="admin", password="pw-silencer-123")


def test_it_expires_stale_proposals_in_the_sweep(pool, cast, now):
    action = actions.propose_action(
        kind="cordon_node",
        target="node:n-01",
        reason="xid 79",
        actor=cast["operator"],
        now=now - timedelta(hours=2),
    )
    assert notify_tasks.escalation_sweep() == {"expired": 1, "enqueued": 0}
    action.action.refresh_from_db()
    assert action.action.state == "expired"
