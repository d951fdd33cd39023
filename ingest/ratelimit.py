"""Per-credential ingest rate limit: a fixed one-minute window counted in Redis.

One round trip per batch (INCR and EXPIRE NX pipelined). Django's cache API needed two
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


def over_limit(credential_id: int, *, now: float | None = None) -> bool:
    """Count one batch for this credential; True once it exceeds the per-minute limit."""
    window = int((time.time() if now is None else now) // WINDOW_S)
    key = f"faultline:ingest-rate:{credential_id}:{window}"
    try:
        pipe = _redis().pipeline(transaction=False)
        pipe.incr(key)
        pipe.expire(key, WINDOW_S + 10, nx=True)
        count, _ = pipe.execute()
    except redis.RedisError:
        global _warned_at
        if time.monotonic() - _warned_at > WINDOW_S:  # one line a minute, not one a batch
            _warned_at = time.monotonic()
            log.warning("ingest: rate limit unavailable (Redis down); admitting batches")
        return False
    return int(count) > settings.INGEST_RATE_PER_MIN
