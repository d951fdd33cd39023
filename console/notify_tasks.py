"""Escalation and notification tasks: the sweep that schedules pages, and the sender.

Thin Celery wrappers over console.actions (expire_actions, schedule_due, deliver): stable
names, ids in, retries declared here. Nothing imports this module but Celery's
autodiscovery; enqueue by name through console.scheduling.
"""

from __future__ import annotations

from typing import Any

from celery import shared_task
from django.utils import timezone

from console import actions
from console.notify import transport


@shared_task(
    name="console.send_notification",
    acks_late=True,
    autoretry_for=(transport.RetryableError,),
    retry_backoff=5,
    retry_backoff_max=600,
    retry_jitter=True,
    max_retries=10,
)
def send_notification(incident_id: int, key: str, channel: str, event: str) -> str:
    return actions.deliver(
        incident_id=incident_id, key=key, channel=channel, event=event, now=timezone.now()
    )


@shared_task(name="console.escalation_sweep", acks_late=True, expires=60)
def escalation_sweep() -> dict[str, Any]:
    """Every 10 s: expire stale actions, freeze policies, schedule due pages. On the
    housekeeping queue (console.scheduling.HOUSEKEEPING_QUEUE); a late sweep still pages,
    so it expires after a minute, not before the next (idempotent: rows are locked)."""
    now = timezone.now()
    expired = actions.expire_actions(now=now)
    enqueued = actions.schedule_due(now=now)
    return {"expired": len(expired), "enqueued": len(enqueued)}
