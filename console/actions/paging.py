"""Paging configuration: silences, escalation policies, notification channels.

Same shape as every verb in console.actions (keyword-only, `actor=`, atomic, audited in
the same transaction). The rules come from console.policy.escalation (silence bounds,
policy validation); this module only asks the permission table, stores, and audits. It sends nothing
(console.actions.notifications records and enqueues the sends).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db import transaction

from console.actions.audit import actor_name, audit, require
from console.actions.errors import NotFound, RemediationError
from console.models import EscalationPolicy, NotificationChannel, Silence
from console.notify import redact
from console.policy import escalation as esc
from console.policy.roles import Permission
from console.roles import Actor


@transaction.atomic
def save_channel(
    *,
    actor: Actor,
    now: datetime,
    name: str,
    kind: str,
    url: str,
    secret: str | None = None,
    enabled: bool = True,
) -> NotificationChannel:
    """Create or update a notification channel by name (admin); the secret is never logged."""
    require(actor, Permission.MANAGE_CHANNELS)
    row = NotificationChannel.objects.select_for_update().filter(name=name).first()
    row = row or NotificationChannel(name=name)
    row.kind, row.url, row.enabled = kind, url, enabled
    if secret is not None:
        row.secret = secret
    if kind in ("webhook", "pagerduty") and not row.secret:
        raise RemediationError(f"a {kind} channel needs a secret (HMAC key or routing key)")
    row.save()
    audit(
        actor=actor_name(actor),
        verb="channel.saved",
        obj=row,
        now=now,
        object_type="notificationchannel",
        # The URL's path is a Slack webhook's secret: every viewer reads this log.
        data=redact.channel_audit_data(name=name, kind=kind, url=url, secret_set=bool(row.secret)),
    )
    return row


@transaction.atomic
def create_silence(
    *,
    matchers: dict[str, str],
    starts_at: datetime,
    ends_at: datetime,
    reason: str,
    actor: Actor,
    now: datetime,
) -> Silence:
    require(actor, Permission.MANAGE_SILENCES)
    if not isinstance(matchers, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in matchers.items()
    ):
        raise RemediationError('matchers must map label to glob, e.g. {"group": "llama-*"}')
    esc.validate_silence(
        esc.Silence(
            id="new",
            matchers=matchers,
            starts_at=starts_at,
            ends_at=ends_at,
            reason=reason,
            created_by=actor_name(actor),
        ),
        now=now,
    )
    silence = Silence.objects.create(
        matchers=matchers,
        starts_at=starts_at,
        ends_at=ends_at,
        reason=reason.strip(),
        created_by=actor,
    )
    audit(
        actor=actor_name(actor),
        verb="silence.created",
        obj=silence,
        reason=silence.reason,
        now=now,
        data={
            "matchers": matchers,
            "starts_at": starts_at.isoformat(),
            "ends_at": ends_at.isoformat(),
        },
    )
    return silence


@transaction.atomic
def expire_silence(*, silence_id: int, actor: Actor, now: datetime) -> Silence:
    require(actor, Permission.MANAGE_SILENCES)
    silence = Silence.objects.select_for_update().filter(pk=silence_id).first()
    if silence is None:
        raise NotFound(f"silence {silence_id} does not exist")
    if silence.ends_at > now:
        silence.ends_at = max(now, silence.starts_at + timedelta(microseconds=1))
        silence.save(update_fields=["ends_at"])
        audit(actor=actor_name(actor), verb="silence.expired", obj=silence, now=now)
    return silence


def active_silences(now: datetime) -> list[esc.Silence]:
    return [
        esc.Silence(
            id=str(s.pk),
            matchers=s.matchers,
            starts_at=s.starts_at,
            ends_at=s.ends_at,
            reason=s.reason,
            created_by=str(s.created_by_id),
        )
        for s in Silence.objects.filter(starts_at__lte=now, ends_at__gt=now)
    ]


def policy_input(row: EscalationPolicy) -> esc.EscalationPolicy:
    try:
        steps = tuple(
            esc.EscalationStep(
                delay_s=int(s["delay_s"]),
                channels=tuple(s["channels"]),
                repeat=int(s.get("repeat", 0)),
                repeat_interval_s=int(s.get("repeat_interval_s", 0)),
            )
            for s in row.steps
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise RemediationError(
            f'escalation policy "{row.name}": each step needs delay_s and channels ({exc})'
        ) from None
    return esc.EscalationPolicy(
        name=row.name,
        steps=steps,
        severities=frozenset(row.severities or ()),
        labels=dict(row.labels or {}),
    )


@transaction.atomic
def save_escalation_policy(
    *, actor: Actor, now: datetime, policy_id: int | None = None, **fields: Any
) -> EscalationPolicy:
    """Create or update a policy (admin); open incidents keep the snapshot they froze."""
    require(actor, Permission.MANAGE_POLICIES)
    row = (
        EscalationPolicy.objects.select_for_update().get(pk=policy_id)
        if policy_id is not None
        else EscalationPolicy()
    )
    for key, value in fields.items():
        setattr(row, key, value)
    try:
        esc.snapshot_policy(policy_input(row))  # validates the steps
    except esc.EscalationError as exc:
        raise RemediationError(str(exc)) from None
    row.save()
    audit(
        actor=actor_name(actor),
        verb="policy.saved",
        obj=row,
        now=now,
        object_type="escalationpolicy",
        data={"steps": row.steps},
    )
    return row


@transaction.atomic
def delete_escalation_policy(*, policy_id: int, actor: Actor, now: datetime) -> None:
    require(actor, Permission.MANAGE_POLICIES)
    row = EscalationPolicy.objects.filter(pk=policy_id).first()
    if row is None:
        raise NotFound(f"escalation policy {policy_id} does not exist")
    audit(
        actor=actor_name(actor),
        verb="policy.deleted",
        obj=row,
        now=now,
        object_type="escalationpolicy",
        data={"name": row.name},
    )
    row.delete()
