"""The worker must not post pages to internal addresses given as channel URLs (low)."""

from __future__ import annotations

import http.server
import threading

import pytest
from django.utils import timezone

from console import actions
from console.models import ConsistencyGroup, Incident, NotificationChannel, NotificationDelivery

pytestmark = pytest.mark.django_db


class _Internal(http.server.BaseHTTPRequestHandler):
    hits = 0

    def do_POST(self) -> None:
        type(self).hits += 1
        body = b"internal admin page: secret=42"
        self.send_response(404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def internal_url():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Internal)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/admin"
    server.shutdown()
    server.server_close()


def _deliver(url: str) -> NotificationDelivery:
    NotificationChannel.objects.create(name="inside", kind="slack", url=url)
    group = ConsistencyGroup.objects.create(name="llama")
    incident = Incident.objects.create(
        group=group, fingerprint="fp", kind="xid", subject="gpu:GPU-1", severity="critical",
        summary="Xid 79", opened_at=timezone.now(),
    )  # fmt: skip
    actions.deliver(
        incident_id=incident.pk, key="s0", channel="inside", event="trigger", now=timezone.now()
    )
    return NotificationDelivery.objects.get(incident=incident, channel="inside")


def test_it_refuses_a_channel_url_on_a_loopback_address(internal_url):
    _Internal.hits = 0
    delivery = _deliver(internal_url)
    assert delivery.status == "refused"
    assert "FAULTLINE_NOTIFY_ALLOW_PRIVATE" in delivery.detail
    assert _Internal.hits == 0


def test_it_posts_inside_when_allowed_but_keeps_the_answer_out_of_the_record(
    internal_url, settings
):
    settings.NOTIFY_ALLOW_PRIVATE = True
    _Internal.hits = 0
    delivery = _deliver(internal_url)
    assert _Internal.hits == 1
    assert delivery.status == "refused" and delivery.detail.endswith("answered HTTP 404")
    assert "secret=42" not in delivery.detail
