"""Slack webhook URLs must not reach the audit log every viewer reads (issue 22 #7).

The audit write lives in console/paging.py (save_channel), which the layout refactor owns
while this fix lands: the redaction is console.notify.redact, and this test is strict-xfail
until save_channel records `redact.channel_audit_data(...)` instead of the raw URL. When it
passes, pytest reports XPASS as a failure: remove the marker then.
"""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.django_db

HOOK = "https://hooks.slack.com/services/T0AAA/B0BBB/s3cr3tWebhookToken"


@pytest.mark.xfail(
    strict=True, reason="integrator: console/paging.py save_channel must audit redacted data"
)
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
