"""Celery beat with a leader lock in Valkey: run two beats, one sends, the other takes over.

Silence emits no records, so the sweeps beat sends are what notice a node or rank that
stopped: one beat is a single point of failure. Every beat (one per service instance)
runs `LeaderScheduler`; only the holder of the lock key sends due tasks. The holder renews
the key's TTL on every tick (at least every `renew_s`); a standby retries every
`POLL_S`, so when the leader dies (or freezes longer than the TTL) another beat sends
within TTL + POLL_S + the first due entry's period (docs/operations.md, measured in
tests/system/test_beat_failover.py). A beat that stops cleanly hands the key back at once.

Why not celery-redbeat: it moves the schedule into Redis too; this keeps Celery's own
scheduler and adds only the lock (one key, two small scripts, TTL kept by Valkey's clock,
so the hosts' clocks do not matter). Every scheduled task is idempotent, so the rare
double send of a leader that froze in the middle of a tick is harmless.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import socket
from typing import Any

import redis
from celery.beat import PersistentScheduler
from django.conf import settings

log = logging.getLogger("faultline.beat")

KEY = "faultline:beat:leader"
POLL_S = 0.5
# Renew the key if ours, else take it if free: 1 when we hold it afterwards.
_HOLD = """
if redis.call('get', KEYS[1]) == ARGV[1] then
    redis.call('pexpire', KEYS[1], ARGV[2])
    return 1
end
if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
return 0
"""
_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0
"""


class Leadership:
    """One beat's claim on the lock key: `holder` is host:pid:tag, the tag naming the beat's
    schedule file, so a restarted beat of the same instance is told from another instance."""

    def __init__(self, client: Any, *, ttl_s: float, key: str = KEY, tag: str = "") -> None:
        self.client, self.key, self.ttl_ms = client, key, int(ttl_s * 1000)
        self.host, self.tag = socket.gethostname(), tag
        self.holder = f"{self.host}:{os.getpid()}:{tag}"
        self.leading = False
        self.renew_s = max(POLL_S, ttl_s / 3)

    def hold(self) -> bool:
        """Renew or take the lock; False (standby) when another holds it or Valkey is away."""
        try:
            leading = bool(self.client.eval(_HOLD, 1, self.key, self.holder, self.ttl_ms))
            if not leading and not self.leading and self._reclaim():
                leading = bool(self.client.eval(_HOLD, 1, self.key, self.holder, self.ttl_ms))
        except redis.RedisError as exc:
            if self.leading:
                log.warning("beat %s: lock unreachable (%s); standing by", self.holder, exc)
            leading = False
        if leading != self.leading:
            # Warnings, so the service's WARNING-level logs show every handover.
            log.warning("beat %s: %s", self.holder, "leading" if leading else "lost the lead")
        self.leading = leading
        return leading

    def _reclaim(self) -> bool:
        """Free the key held by a dead beat of this instance (same host and schedule file).

        A supervisor (or Docker) restarts a dead beat at once; without this the new one
        would wait out its predecessor's TTL while nobody sends the sweeps.
        """
        value = self.client.get(self.key)
        host, _, rest = (value.decode() if isinstance(value, bytes) else "").partition(":")
        pid, _, tag = rest.partition(":")
        if host != self.host or tag != self.tag or not pid.isdigit() or _alive(int(pid)):
            return False
        log.warning("beat %s: taking over from dead beat pid %s", self.holder, pid)
        return bool(self.client.eval(_RELEASE, 1, self.key, value))

    def release(self) -> None:
        """Hand the key back if still ours, so a standby takes over without waiting."""
        with contextlib.suppress(redis.RedisError):  # it expires on its own
            self.client.eval(_RELEASE, 1, self.key, self.holder)
        self.leading = False


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process: alive
    return True


def leader() -> str | None:
    """The holder of the lock now (an operator's check), or None."""
    client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2)
    value = client.get(KEY)
    return value.decode() if isinstance(value, bytes) else None


class LeaderScheduler(PersistentScheduler):
    """Celery's persistent scheduler that sends only while this beat holds the lock."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        client = redis.Redis.from_url(
            settings.REDIS_URL, socket_timeout=1.0, socket_connect_timeout=1.0
        )
        schedule = str(kwargs.get("schedule_filename") or "")
        tag = hashlib.sha256(schedule.encode()).hexdigest()[:8]
        self.leadership = Leadership(client, ttl_s=settings.BEAT_LOCK_TTL_S, tag=tag)
        super().__init__(*args, **kwargs)

    def tick(self, *args: Any, **kwargs: Any) -> float:
        """Send what is due only as the leader; a standby polls the lock every POLL_S."""
        if not self.leadership.hold():
            return POLL_S
        return min(super().tick(*args, **kwargs), self.leadership.renew_s)

    def close(self) -> None:
        self.leadership.release()
        super().close()
