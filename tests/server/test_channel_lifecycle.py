"""Notification channels after creation: update, disable, rotate the secret.

Through the REST API as the roles would; every change audited without the URL's path or
any secret.
"""

from __future__ import annotations

import json

import pytest

from console.models import AuditLog, NotificationChannel

pytestmark = pytest.mark.django_db

HOOK = "https://hooks.example.com/services/T0/B0/s3cr3tPath"


@pytest.fixture
def channel(client, cast):
    client.force_login(cast["admin"])
    made = client.post(
        "/api/v1/notification-channels/",
        {"name": "ops", "kind": "webhook", "url": "https://hooks.example.com/a", "secret": "k1"},
        content_type="application/json",
    )
    assert made.status_code == 201, made.content
    return "ops"


def test_it_updates_a_channel_and_audits_without_its_url_path(client, cast, channel):
    response = client.patch(
        f"/api/v1/notification-channels/{channel}/", {"url": HOOK}, content_type="application/json"
    )
    assert response.status_code == 200, response.content
    assert NotificationChannel.objects.get(name=channel).url == HOOK
    row = AuditLog.objects.filter(verb="channel.updated").get()
    assert (
        row.data["changed"] == ["url"] and row.data["url"] == "https://hooks.example.com/[redacted]"
    )
    assert "s3cr3tPath" not in json.dumps(row.data)


def test_it_disables_and_enables_a_channel(client, cast, channel):
    off = client.post(f"/api/v1/notification-channels/{channel}/disable/", {"reason": "noisy"},
                      content_type="application/json")  # fmt: skip
    assert off.status_code == 200 and off.json()["enabled"] is False
    assert NotificationChannel.objects.get(name=channel).enabled is False
    on = client.post(f"/api/v1/notification-channels/{channel}/enable/")
    assert on.status_code == 200 and on.json()["enabled"] is True
    verbs = list(
        AuditLog.objects.filter(verb__startswith="channel.").values_list("verb", flat=True)
    )
    assert "channel.disabled" in verbs and "channel.enabled" in verbs


def test_it_rotates_a_secret_shown_once_and_never_audited(client, cast, channel):
    response = client.post(f"/api/v1/notification-channels/{channel}/rotate-secret/")
    assert response.status_code == 200, response.content
    secret = response.json()["secret"]
    assert len(secret) >= 32 and secret != "k1"
    assert NotificationChannel.objects.get(name=channel).secret == secret
    assert "secret" not in client.get(f"/api/v1/notification-channels/{channel}/").json()
    audited = json.dumps(list(AuditLog.objects.values_list("data", flat=True)))
    assert secret not in audited and "k1" not in audited


def test_it_refuses_channel_changes_below_admin(client, cast, channel):
    client.force_login(cast["operator"])
    assert client.post(f"/api/v1/notification-channels/{channel}/disable/").status_code == 403
    assert client.patch(f"/api/v1/notification-channels/{channel}/", {"enabled": False},
                        content_type="application/json").status_code == 403  # fmt: skip
    assert NotificationChannel.objects.get(name=channel).enabled is True
    client.force_login(cast["admin"])
    assert client.post("/api/v1/notification-channels/nope/disable/").status_code == 404
