"""Writes Postgres refuses for want of a resource: its disk full, out of memory.

Owns telling such a refusal (SQLSTATE class 53: 53100 disk_full, 53200 out_of_memory,
53000 insufficient_resources) from any other database error, and remembering the last one
for /readyz and /metrics. A full volume is not a broken connection: retrying in 5 s
changes nothing, and an operator must free space, so callers answer 503 with a longer
Retry-After and readiness names the cause. Must not decide what a caller answers.

The last refusal lives in the cache (Redis), shared by every web worker, for
`REMEMBER_S`: /readyz reports writes failing until that long after the last refusal.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import psycopg.errors

from faultline import metrics

# Only the class-53 conditions a write hits; 53300 (too many connections) and 53400
# (configuration limit) fail a connect or a setting, not a write.
REASONS = {
    "53100": "disk_full",
    "53200": "out_of_memory",
    "53000": "insufficient_resources",
}
# A volume does not empty itself: agents retry after this long (they keep the batch
# spooled meanwhile), not every 5 s.
RETRY_AFTER_S = 30
REMEMBER_S = 60
_KEY = "faultline:db-writes-refused"


def refusal(exc: BaseException) -> tuple[str, str] | None:
    """(reason, SQLSTATE) when `exc` (or what it wraps) is a write Postgres refused for want
    of a resource; None for any other error."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, psycopg.errors.Error):
            state = cause.sqlstate or ""
            return (REASONS[state], state) if state in REASONS else None
        cause = cause.__cause__
    return None


def record(reason: str, sqlstate: str) -> None:
    """Count the refusal and remember it for /readyz (a cache outage must not turn the 503
    the caller is about to answer into a 500)."""
    metrics.DB_WRITES_REFUSED.labels(reason).inc()
    with contextlib.suppress(Exception):
        from django.core.cache import cache

        cache.set(_KEY, {"reason": reason, "sqlstate": sqlstate, "at": time.time()}, REMEMBER_S)


def recent() -> dict[str, Any] | None:
    """The last refusal within REMEMBER_S: reason, sqlstate, seconds_ago; None if none."""
    from django.core.cache import cache

    last = cache.get(_KEY)
    if not isinstance(last, dict):
        return None
    return {
        "reason": last.get("reason", ""),
        "sqlstate": last.get("sqlstate", ""),
        "seconds_ago": round(max(0.0, time.time() - float(last.get("at", 0))), 1),
    }
