"""Slack webhook URLs must not reach the audit log every viewer reads.

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


def test_no_channel_verb_puts_a_webhook_path_or_secret_in_the_audit_log_or_the_api(client, cast):
    """Every channel verb (create, update, disable with a reason, rotate) audits through the
    one redaction function; the channel API shows the URL's origin only, never a secret."""
    path, key, rotated = "s3cr3tWebhookToken", "hmac-k3y-0riginal", "r0tated-r0uting-k3y"
    client.force_login(cast["admin"])
    made = client.post(
        "/api/v1/notification-channels/",
        {"name": "ops-hook", "kind": "webhook", "url": HOOK, "secret": key},
        content_type="application/json",
    )
    assert made.status_code == 201, made.content
    other = HOOK.replace("s3cr3t", "n3wer")
    outputs = [made.json()]
    update = {"url": other, "secret": key + "2"}
    patched = client.patch(
        "/api/v1/notification-channels/ops-hook/", update, content_type="application/json"
    )
    assert patched.status_code == 200, patched.content
    off = client.post("/api/v1/notification-channels/ops-hook/disable/",
                      {"reason": f"leaked: {HOOK}"}, content_type="application/json")  # fmt: skip
    assert off.status_code == 200, off.content
    assert client.post("/api/v1/notification-channels/ops-hook/enable/").status_code == 200
    turned = client.post("/api/v1/notification-channels/ops-hook/rotate-secret/",
                         {"secret": rotated}, content_type="application/json")  # fmt: skip
    assert turned.status_code == 200 and turned.json()["secret"] == rotated  # shown once
    outputs += [patched.json(), off.json()]
    for read in ("/api/v1/notification-channels/", "/api/v1/notification-channels/ops-hook/"):
        outputs.append(client.get(read).json())
    assert outputs[-1]["url"] == "https://hooks.slack.com/[redacted]"
    from console.models import AuditLog

    rows = list(AuditLog.objects.filter(verb__startswith="channel.").values_list("verb", "data"))
    assert {v for v, _ in rows} >= {"channel.saved", "channel.updated", "channel.disabled",
                                    "channel.enabled", "channel.secret_rotated"}  # fmt: skip
    stored = json.dumps(rows)  # the table itself, not only what the API shows
    outputs.append(client.get("/api/v1/audit/?limit=100").json())
    text = stored + json.dumps(outputs)
    for secret in (path, "n3werWebhookToken", "/services/", key, rotated):
        assert secret not in text, (secret, text[max(0, text.find(secret) - 200) :][:300])
