"""Per-credential ingest rate limits (batches and records a minute) and per-node budgets
(new groups an hour), fixed windows counted in Redis.

One round trip per count (INCR and EXPIRE NX pipelined). Django's cache API needed two
(`incr` checks that the key exists first) or three in the first batch of a window.
A Redis outage never blocks ingest: storing beats limiting.
"""

from __future__ import annotations

import logging
import os
import threading
import time

import redis
from django.conf import settings

log = logging.getLogger(__name__)

WINDOW_S = 60
_client: tuple[int, redis.Redis] | None = None
_lock = threading.Lock()
_warned_at = -1e9


def _redis() -> redis.Redis:
    global _client
    with _lock:
        if _client is None or _client[0] != os.getpid():  # gunicorn forks after import
            client = redis.Redis.from_url(
                settings.REDIS_URL, socket_timeout=1, socket_connect_timeout=1
            )
            _client = (os.getpid(), client)
        return _client[1]


def _count(key: str, amount: int, window_s: int) -> int | None:
    """Add `amount` to this window's counter; its new value, or None when Redis is down."""
    try:
        pipe = _redis().pipeline(transaction=False)
        pipe.incrby(key, amount)
        pipe.expire(key, window_s + 10, nx=True)
        count, _ = pipe.execute()
    except redis.RedisError:
        _warn()
        return None
    return int(count)


def _warn() -> None:
    global _warned_at
    if time.monotonic() - _warned_at > WINDOW_S:  # one line a minute, not one a batch
        _warned_at = time.monotonic()
        log.warning("ingest: rate limit unavailable (Redis down); admitting batches")


def over_limit(credential_id: int, *, now: float | None = None) -> bool:
    """Count one batch for this credential; True once it exceeds the per-minute limit."""
    window = int((time.time() if now is None else now) // WINDOW_S)
    count = _count(f"faultline:ingest-rate:{credential_id}:{window}", 1, WINDOW_S)
    return count is not None and count > settings.INGEST_RATE_PER_MIN


def over_limits(credential_id: int, records: int, *, now: float | None = None) -> str | None:
    """Count one batch and its records for this credential in one round trip; which limit
    the minute's totals exceed ("batch" or "record"), or None. A batch limit alone lets
    1,000-record batches through, so records are counted too (INGEST_RECORDS_PER_MIN)."""
    window = int((time.time() if now is None else now) // WINDOW_S)
    batches = f"faultline:ingest-rate:{credential_id}:{window}"
    total = f"faultline:ingest-records:{credential_id}:{window}"
    try:
        pipe = _redis().pipeline(transaction=False)
        pipe.incr(batches)
        pipe.expire(batches, WINDOW_S + 10, nx=True)
        pipe.incrby(total, records)
        pipe.expire(total, WINDOW_S + 10, nx=True)
        n_batches, _, n_records, _ = pipe.execute()
    except redis.RedisError:
        _warn()
        return None
    over = None
    if int(n_batches) > settings.INGEST_RATE_PER_MIN:
        over = "batch"
    elif int(n_records) > settings.INGEST_RECORDS_PER_MIN:
        over = "record"
    if over is not None:
        _over_in[credential_id] = window
    return over


# Per process: the window in which each credential was last over a limit. Until it ends,
# its batches are refused before their bodies are read (no Redis, no decode).
_over_in: dict[int, int] = {}


def known_over(credential_id: int, *, now: float | None = None) -> bool:
    window = int((time.time() if now is None else now) // WINDOW_S)
    return _over_in.get(credential_id) == window


HOUR_S = 3600


def take_new_groups(node_id: int, wanted: int, *, limit: int, now: float | None = None) -> int:
    """Take up to `wanted` new groups from this node's hourly budget; how many it may create.

    Redis down: all of them (storing beats limiting). A refused batch still spends what it
    asked for, so a flooding node stays refused for the rest of the hour.
    """
    if wanted <= 0:
        return 0
    window = int((time.time() if now is None else now) // HOUR_S)
    count = _count(f"faultline:ingest-new-groups:{node_id}:{window}", wanted, HOUR_S)
    if count is None:
        return wanted
    return max(0, min(wanted, limit - (count - wanted)))
