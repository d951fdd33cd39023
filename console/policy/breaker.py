"""The automation circuit breaker.

Owns when the breaker opens (too many automatic actions or failures in a window) and
who may close it (an admin, with a reason). It never closes itself: a storm that
tripped it must be looked at by a person. Pure functions; the caller stores the state.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

from console.policy.inputs import BreakerState, Policy, RecentActions
from console.policy.roles import Permission, can


class BreakerError(PermissionError):
    """A breaker change that is refused (wrong role, missing reason, wrong state)."""


def span(seconds: int) -> str:
    """A window length as people say it: 45 s, 10 min, 24 h."""
    if seconds % 3600 == 0:
        return f"{seconds // 3600} h"
    if seconds % 60 == 0:
        return f"{seconds // 60} min"
    return f"{seconds} s"


def _window_start(breaker: BreakerState, policy: Policy, now: datetime) -> datetime:
    start = now - timedelta(seconds=policy.breaker_window_s)
    # Actions before the last close were already judged by the admin who closed it;
    # counting them again would re-open the breaker the moment it closed.
    if breaker.closed_at is not None and breaker.closed_at > start:
        start = breaker.closed_at
    return start


def trip(
    breaker: BreakerState, history: RecentActions, policy: Policy, now: datetime
) -> BreakerState:
    """The breaker after looking at recent history: opened if a limit was exceeded."""
    if breaker.open:
        return breaker
    recent = history.since(_window_start(breaker, policy, now))
    automatic = sum(1 for r in recent if r.automatic)
    failures = sum(1 for r in recent if r.failed)
    window = span(policy.breaker_window_s)
    reason = ""
    if failures >= policy.breaker_max_failures:
        reason = (
            f"{failures} actions failed in the last {window} (limit {policy.breaker_max_failures})"
        )
    elif automatic >= policy.breaker_max_automatic:
        reason = (
            f"{automatic} automatic actions in the last {window} "
            f"(limit {policy.breaker_max_automatic})"
        )
    if not reason:
        return breaker
    return replace(breaker, open=True, reason=reason, opened_at=now)


def open_breaker(
    breaker: BreakerState, *, actor: str, role: str, reason: str, now: datetime
) -> BreakerState:
    """Open the breaker by hand; any operator may stop automation (the safe direction)."""
    if not can(role, Permission.OPEN_BREAKER):
        raise BreakerError(f"{actor} is a {role}; opening the breaker needs the operator role")
    if not reason.strip():
        raise BreakerError("opening the breaker needs a reason")
    if breaker.open:
        return breaker
    return replace(breaker, open=True, reason=f"opened by {actor}: {reason.strip()}", opened_at=now)


def close_breaker(
    breaker: BreakerState, *, actor: str, role: str, reason: str, now: datetime
) -> BreakerState:
    """Close the breaker; only an admin may, and only with a reason that is kept."""
    if not can(role, Permission.CLOSE_BREAKER):
        raise BreakerError(f"{actor} is a {role}; only an admin may close the circuit breaker")
    if not reason.strip():
        raise BreakerError("closing the circuit breaker needs a reason; say what was fixed")
    if not breaker.open:
        raise BreakerError("the circuit breaker is already closed")
    return BreakerState(
        open=False,
        reason="",
        opened_at=breaker.opened_at,
        closed_at=now,
        closed_by=actor,
        close_reason=reason.strip(),
    )


def describe(breaker: BreakerState) -> str:
    """One line for the console header."""
    if breaker.open:
        since = breaker.opened_at.strftime("%Y-%m-%d %H:%M UTC") if breaker.opened_at else "?"
        return f"open since {since}: {breaker.reason}"
    if breaker.closed_by:
        return f"closed by {breaker.closed_by}: {breaker.close_reason}"
    return "closed"
