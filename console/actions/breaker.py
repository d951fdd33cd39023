"""The automation circuit breaker: opened by the gates or a person, closed by an admin.

Owns the breaker row's writes (each audited, `breaker.changed` published after commit
with a JSON-safe payload) and reading it for display. The rules (who may, what a
close needs, when the gates trip it) are console.policy.breaker's and gates'.
A refused change commits its audit row, then raises (`NotAllowed` for a role the
permission table refuses, `BreakerError` otherwise).
"""

from __future__ import annotations

from datetime import datetime

from django.db import transaction

from console import events
from console.actions.audit import actor_name, audit, role_refused
from console.actions.errors import NotAllowed
from console.actions.gating import breaker_input, locked_breaker
from console.models import BreakerState
from console.policy import breaker as breakers
from console.policy import inputs
from console.policy.roles import Permission
from console.roles import Actor, allowed, role_of


def breaker_payload() -> events.BreakerPayload:
    """The breaker as REST, pages and `breaker.changed` show it (the row is made if new)."""
    row, _ = BreakerState.objects.get_or_create(pk=1)
    return _payload(row)


def _payload(row: BreakerState) -> events.BreakerPayload:
    return events.breaker_payload(row, description=breakers.describe(breaker_input(row)))


def _publish(row: BreakerState) -> None:
    payload = _payload(row)
    events.publish_on_commit(events.FLEET, "breaker.changed", payload)


def store_gate_decision(
    row: BreakerState, state: inputs.BreakerState, *, actor: str, now: datetime
) -> None:
    """Store what a gate decided about the (locked) breaker: it may trip it open."""
    if state.open == row.open:
        return
    row.open, row.reason, row.opened_at = state.open, state.reason, state.opened_at
    row.opened_by = actor
    row.save()
    audit(actor=actor, verb="breaker.opened", obj=row, reason=state.reason, now=now)
    _publish(row)


def set_breaker(*, open: bool, actor: Actor, reason: str, now: datetime) -> BreakerState:
    """Open (any operator) or close (admin, with a reason) the automation circuit breaker.

    A refusal is audited and committed, then raised: `NotAllowed` when the permission
    table does not let the actor (403), `breakers.BreakerError` for anything else.
    """
    with transaction.atomic():
        row, refusal = _set_breaker(open, actor, reason, now)
    if refusal is not None:
        raise refusal
    return row


def _set_breaker(
    open: bool, actor: Actor, reason: str, now: datetime
) -> tuple[BreakerState, breakers.BreakerError | NotAllowed | None]:
    row = locked_breaker()
    current = breaker_input(row)
    who = actor_name(actor)
    permission = Permission.OPEN_BREAKER if open else Permission.CLOSE_BREAKER
    if not allowed(actor, permission):
        refusal = role_refused(actor, permission)
        audit(actor=who, verb="breaker.refused", obj=row, reason=str(refusal), now=now)
        return row, refusal
    change = breakers.open_breaker if open else breakers.close_breaker
    try:
        new = change(current, actor=who, role=role_of(actor), reason=reason, now=now)
    except breakers.BreakerError as exc:
        audit(actor=who, verb="breaker.refused", obj=row, reason=str(exc), now=now)
        return row, exc
    if new == current:
        return row, None
    row.open, row.reason, row.opened_at = new.open, new.reason, new.opened_at
    if open:
        row.opened_by = who
    else:
        row.closed_at, row.closed_by, row.closed_reason = now, who, new.close_reason
    row.save()
    verb = "breaker.opened" if open else "breaker.closed"
    audit(actor=who, verb=verb, obj=row, reason=reason.strip(), now=now)
    _publish(row)
    return row, None
