"""The audit log: who did what to which object, appended inside the change's transaction.

Owns `audit` (the only writer of AuditLog rows), how an actor is named on the record, and
`require`: the one check every verb makes of the permission table (console.policy.roles)
with the refusal message. It must not decide which role a change needs (the table does).
The database refuses UPDATE and DELETE on the log (trigger) and chains each row to the one
before when its transaction commits (console.auditchain).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from console.actions.errors import NotAllowed
from console.models import AuditLog
from console.policy.roles import WHAT, Permission, minimum_role
from console.roles import User, allowed, role_of

SYSTEM = "system"


def actor_name(actor: User | None) -> str:
    """A user's username, or "system" for the sweeps and rules."""
    return actor.get_username() if actor is not None else SYSTEM


def audit(
    *,
    actor: str,
    verb: str,
    obj: Any = None,
    reason: str = "",
    data: dict[str, Any] | None = None,
    now: datetime,
    object_type: str = "",
    object_id: str = "",
) -> AuditLog:
    """Append one audit row (inside the caller's transaction)."""
    if obj is not None:
        object_type = object_type or type(obj).__name__.lower()
        object_id = object_id or str(obj.pk)
    return AuditLog.objects.create(
        ts=now,
        actor=actor[:150],
        verb=verb,
        object_type=object_type or SYSTEM,
        object_id=object_id,
        reason=reason,
        data=data or {},
    )


@dataclass(frozen=True)
class AuditRow:
    """One row for `audit_many`: what `audit` takes, less the actor and time they share."""

    verb: str
    obj: Any
    reason: str = ""
    data: dict[str, Any] = field(default_factory=dict)


def audit_many(rows: list[AuditRow], *, actor: str, now: datetime) -> None:
    """Append many rows in one statement (a delivery of thousands of alerts), inside the
    caller's transaction; the same rows `audit` would write one by one."""
    AuditLog.objects.bulk_create(
        [
            AuditLog(
                ts=now,
                actor=actor[:150],
                verb=row.verb,
                object_type=type(row.obj).__name__.lower(),
                object_id=str(row.obj.pk),
                reason=row.reason,
                data=row.data,
            )
            for row in rows
        ],
        batch_size=1000,
    )


def role_refused(actor: User | None, permission: Permission, *, own: bool = False) -> NotAllowed:
    """The refusal for an actor the table does not allow: who, their role, what it needs."""
    minimum = minimum_role(permission, own=own)
    role = role_of(actor)
    article = "an" if role[:1] in ("a", "e", "i", "o", "u") else "a"
    who = f"{actor_name(actor)} is {article} {role}" if role else "nobody is signed in"
    return NotAllowed(f"{who}; the {minimum} role is needed for {WHAT[permission]}")


def require(actor: User | None, permission: Permission, *, own: bool = False) -> None:
    """Raise NotAllowed unless the table lets `actor` do `permission` (`own`: as the
    object's owner). Every verb a person calls starts with this."""
    if not allowed(actor, permission, own=own):
        raise role_refused(actor, permission, own=own)
