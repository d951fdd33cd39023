"""Notification bookkeeping: which pages are due, and that each is delivered at most once.

Owns when a page is enqueued (the frozen policy snapshot and console.policy.escalation
decide) and that each (incident, step key, channel) is delivered at most once: a
NotificationDelivery row, unique in the database and locked while sending, records it,
so a redelivered task never double-pages. Payloads come from console.notify; nothing
here decides what is wise, and a resolve always follows a page. Sends are enqueued by
name after commit (console.scheduling); console.notify_tasks only wraps them as tasks.

Also the channel verbs after creation (admin only, audited, keyword-only, atomic): update
a channel's kind, URL or enabled flag, disable or enable it, rotate its secret. The audit
row never holds a URL (a Slack webhook's path is its secret) nor a secret: what it
records is decided by console.notify.redact.channel_audit_data alone (which fields
changed, the URL's origin, whether a secret is set).
"""

from __future__ import annotations

import json
import logging
import secrets
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import transaction

from console import scheduling
from console.actions.audit import actor_name, audit, require
from console.actions.errors import NotFound, RemediationError
from console.actions.fleet import held_by_fleet_silence
from console.actions.paging import active_silences, policy_input
from console.models import (
    EscalationPolicy,
    Incident,
    IncidentEscalation,
    NotificationChannel,
    NotificationDelivery,
)
from console.notify import pagerduty, redact, slack, transport, webhook
from console.notify.message import Event, Notification
from console.policy import escalation as esc
from console.policy.roles import Permission
from console.roles import Actor

log = logging.getLogger(__name__)

SEND_TIMEOUT_S = 10.0


def incident_labels(incident: Incident) -> dict[str, str]:
    """What escalation policies and silences match on: group (or, for a node incident, node)
    labels, group or node (and its pool), kind, severity."""
    owner = incident.group or incident.node
    labels = {str(k): str(v) for k, v in (owner.labels if owner is not None else {}).items()}
    if incident.group is not None:
        labels["group"] = incident.group.name
    elif incident.node is not None:
        labels["node"] = incident.node.name
        if incident.node.pool:
            labels["pool"] = incident.node.pool
    return {**labels, "kind": incident.kind, "severity": incident.severity}


def freeze_policies(*, now: datetime) -> int:
    """Snapshot the matching policy onto every open incident that has none yet.

    An incident a diagnosis pass holds (its FOR UPDATE lock, until the pass commits) is
    left to the next sweep: the escalation row's foreign key is checked at commit, which
    waits for that lock, so one pass stuck mid-transaction (a frozen worker) held every
    incident's page, and the one housekeeping process with it (the silent-node sweep too).
    """
    rows = list(EscalationPolicy.objects.filter(enabled=True))
    policies = [policy_input(p) for p in rows]
    frozen = 0
    for incident in (
        Incident.objects.exclude(state="resolved")
        .filter(escalation__isnull=True)
        .select_related("group")
    ):
        with transaction.atomic():
            # FOR NO KEY UPDATE: taken only if no pass holds the row; the foreign key's
            # own check (FOR KEY SHARE) then never waits.
            free = Incident.objects.select_for_update(skip_locked=True, no_key=True)
            if not list(free.filter(pk=incident.pk).values_list("pk", flat=True)):
                log.info("escalation: incident %s is held by a pass; next sweep", incident.pk)
                continue
            chosen = esc.select_policy(policies, incident.severity, incident_labels(incident))
            _, created = IncidentEscalation.objects.get_or_create(
                incident=incident,
                defaults={
                    "policy_name": chosen.name if chosen else "",
                    "snapshot": esc.snapshot_policy(chosen) if chosen else {},
                    "done": chosen is None,
                    "created_at": now,
                },
            )
            frozen += created
    return frozen


@transaction.atomic
def schedule_due(*, now: datetime) -> list[tuple[int, str, str, str]]:
    """Mark due steps as scheduled and enqueue one send per channel after commit.

    Returns (incident id, key, channel, event) for each send enqueued.
    """
    freeze_policies(now=now)
    silences = active_silences(now)
    enqueued: list[tuple[int, str, str, str]] = []
    rows = (
        IncidentEscalation.objects.select_for_update(skip_locked=True, of=("self",))
        .filter(done=False)
        .select_related("incident__group", "incident__root_incident")
    )
    for row in rows:
        incident = row.incident
        sent = list(row.sent)
        held = held_by_fleet_silence(incident)
        due = esc.due_steps(
            row.snapshot,
            incident.opened_at,
            incident.acknowledged_at,
            now,
            sent,
            incident.resolved_at,
        )
        silenced_by = None
        for item in due:
            if item.kind == "trigger" and held:
                continue  # the fleet silence's page covers it; it pages if still open after
            if item.kind == "trigger":
                silence = esc.is_silenced(
                    incident.subject, incident_labels(incident), silences, now
                )
                if silence is not None:
                    # Held back, not dropped: it pages when the silence ends if still open.
                    silenced_by = int(silence.id)
                    continue
            sent.extend(k for k in (item.covers or (item.key,)) if k not in sent)
            for channel in item.channels:
                enqueued.append((incident.pk, item.key, channel, item.kind))
        paged = any(k.startswith("step:") for k in sent)
        row.done = incident.state == "resolved" and ("resolve" in sent or not paged)
        if sent != row.sent or row.done or silenced_by != row.silenced_by_id:
            row.sent, row.silenced_by_id = sent, silenced_by
            row.save(update_fields=["sent", "done", "silenced_by"])
    for args in enqueued:
        transaction.on_commit(lambda args=args: scheduling.send_notification(*args))
    return enqueued


def notification(incident: Incident, event: str, key: str, now: datetime) -> Notification:
    return Notification(
        event=Event(event),
        incident_id=str(incident.pk),
        dedup_key=f"faultline-incident-{incident.pk}",
        title=incident.summary,
        severity=incident.severity,
        subject=incident.subject,
        occurred_at=now,
        group=incident.group.name if incident.group else None,
        root_cause=incident.kind,
        role=incident.role,
        evidence={
            "generation": incident.generation,
            "symptoms": incident.symptom_count,
            "step": key,
        },
    )


def _request(
    channel: NotificationChannel, n: Notification, now: datetime
) -> tuple[bytes, dict[str, str]]:
    if channel.kind == "webhook":
        return webhook.request(n, channel.secret, now)
    if channel.kind == "slack":
        return webhook.encode(slack.build_payload(n)), {"Content-Type": "application/json"}
    body = pagerduty.build_payload(n, routing_key=channel.secret)
    return json.dumps(body).encode(), {"Content-Type": "application/json"}


def deliver(*, incident_id: int, key: str, channel: str, event: str, now: datetime) -> str:
    """Send one notification unless it was already sent; returns the delivery status.

    Raises `transport.RetryableError` (after recording the attempt) so Celery retries.
    """
    retry: transport.RetryableError | None = None
    with transaction.atomic():
        NotificationDelivery.objects.get_or_create(
            incident_id=incident_id, key=key, channel=channel, defaults={"event": event}
        )
        # The row lock is held while sending: a concurrent redelivery waits, then sees "sent".
        delivery = NotificationDelivery.objects.select_for_update().get(
            incident_id=incident_id, key=key, channel=channel
        )
        if delivery.status in ("sent", "refused"):
            return delivery.status
        incident = Incident.objects.select_related("group").get(pk=incident_id)
        target = NotificationChannel.objects.filter(name=channel, enabled=True).first()
        delivery.attempts += 1
        if target is None:
            delivery.status, delivery.detail = "refused", f"no enabled channel named {channel!r}"
        else:
            try:
                body, headers = _request(target, notification(incident, event, key, now), now)
                transport.send(
                    target.url,
                    body,
                    headers,
                    SEND_TIMEOUT_S,
                    allow_private=settings.NOTIFY_ALLOW_PRIVATE,
                )
                delivery.status, delivery.sent_at, delivery.detail = "sent", now, ""
            except transport.RetryableError as exc:
                delivery.status, delivery.detail, retry = "retrying", str(exc)[:512], exc
            except (transport.PermanentError, ValueError) as exc:
                delivery.status, delivery.detail = "refused", str(exc)[:512]
        delivery.save()
    if delivery.status == "refused":
        log.warning("notify: %s to %s refused: %s", key, channel, delivery.detail)
    if retry is not None:
        raise retry
    return delivery.status


# -- channel verbs ---------------------------------------------------------------------------
CHANNEL_KINDS = ("webhook", "slack", "pagerduty")
_NEEDS_SECRET = ("webhook", "pagerduty")


def _channel_for_update(actor: Actor, name: str) -> NotificationChannel:
    require(actor, Permission.MANAGE_CHANNELS)
    row = NotificationChannel.objects.select_for_update().filter(name=name).first()
    if row is None:
        raise NotFound(f"no notification channel named {name!r}")
    return row


def _audit_channel(
    actor: Actor, row: NotificationChannel, verb: str, now: datetime, **data: Any
) -> None:
    audit(
        actor=actor_name(actor),
        verb=verb,
        obj=row,
        now=now,
        object_type="notificationchannel",
        data=redact.channel_audit_data(
            name=row.name,
            kind=row.kind,
            url=row.url,
            secret_set=bool(row.secret),
            enabled=row.enabled,
            **data,
        ),
    )


@transaction.atomic
def update_channel(
    *,
    actor: Actor,
    now: datetime,
    name: str,
    kind: str | None = None,
    url: str | None = None,
    enabled: bool | None = None,
    secret: str | None = None,
) -> NotificationChannel:
    """Change some of a channel's fields (admin); audited without its URL path or secret."""
    row = _channel_for_update(actor, name)
    changed = []
    for field, value in (("kind", kind), ("url", url), ("enabled", enabled), ("secret", secret)):
        if value is not None and getattr(row, field) != value:
            setattr(row, field, value)
            changed.append(field)
    if row.kind not in CHANNEL_KINDS:
        raise RemediationError(f"unknown channel kind {row.kind!r}")
    if row.kind in _NEEDS_SECRET and not row.secret:
        raise RemediationError(f"a {row.kind} channel needs a secret (HMAC key or routing key)")
    if changed:
        row.save()
    _audit_channel(actor, row, "channel.updated", now, changed=changed)
    return row


@transaction.atomic
def set_channel_enabled(
    *, actor: Actor, now: datetime, name: str, enabled: bool, reason: str = ""
) -> NotificationChannel:
    """Disable (pages to it are refused, not sent) or enable a channel (admin)."""
    row = _channel_for_update(actor, name)
    row.enabled = enabled
    row.save(update_fields=["enabled"])
    verb = "channel.enabled" if enabled else "channel.disabled"
    _audit_channel(actor, row, verb, now, reason=reason)
    return row


@transaction.atomic
def rotate_channel_secret(
    *, actor: Actor, now: datetime, name: str, secret: str | None = None
) -> tuple[NotificationChannel, str]:
    """Replace a channel's secret (admin): the given one (a PagerDuty routing key) or a new
    random HMAC key. Returns the row and the new secret, shown once; never audited."""
    row = _channel_for_update(actor, name)
    new = secret if secret else secrets.token_urlsafe(32)
    row.secret = new
    row.save(update_fields=["secret"])
    _audit_channel(actor, row, "channel.secret_rotated", now, generated=not secret)
    return row, new
