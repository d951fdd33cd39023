"""Slack webhook URLs must not reach the audit log every viewer reads (issue 22 #7).

console/actions/paging.py save_channel records only the URL's origin
(console.notify.redact), and the audit API redacts rows written before that.
"""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.django_db

HOOK = "https://hooks.slack.com/services/T0AAA/B0BBB/s3cr3tWebhookToken"


def test_it_keeps_the_webhook_path_out_of_the_audit_log(client, cast):
    client.force_login(cast["admin"])
    created = client.post(
        "/api/v1/notification-channels/",
        {"name": "ops-slack", "kind": "slack", "url": HOOK},
        content_type="application/json",
    )
    assert created.status_code == 201, created.content
    client.force_login(cast["viewer"])
    audit = client.get("/api/v1/audit/?limit=50")
    assert audit.status_code == 200
    text = json.dumps(audit.json())
    assert "channel.saved" in text
    assert "s3cr3tWebhookToken" not in text
    assert "/services/" not in text


def test_it_redacts_a_webhook_url_in_audit_rows_written_before_the_fix(client, cast):
    from django.utils import timezone

    from console.models import AuditLog

    AuditLog.objects.create(
        ts=timezone.now(), actor="admin", verb="channel.saved", object_type="notificationchannel",
        data={"name": "old", "kind": "slack", "url": HOOK},
    )  # fmt: skip
    client.force_login(cast["viewer"])
    text = json.dumps(client.get("/api/v1/audit/?verb=channel.saved").json())
    assert "channel.saved" in text and "s3cr3tWebhookToken" not in text
