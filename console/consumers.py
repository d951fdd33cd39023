"""Websocket consumers: authenticate, join a channel group, forward typed events. Thin.

The fleet topic carries `node.changed`, `incident.changed`, `action.changed` and
`breaker.changed`; a group topic carries `group.changed` and `incident.changed`. Payloads
are console.events'; a consumer must not change state. Each user holds at most
WS_MAX_PER_USER sockets at once (counted in Redis across processes; 4429 beyond it), and
a topic that cannot name a channel group (non-ASCII) is refused with 4404, not a crash.
A socket lives no longer than its login session: logging out closes it at once (4401,
console.events.end_session), and before forwarding an event it re-reads the session at
most every SESSION_RECHECK_S (expired, flushed elsewhere, password changed, user
deactivated: closed with 4401, the event not sent).
"""

from __future__ import annotations

import logging
import re
import time
from importlib import import_module
from typing import Any

import redis
from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings
from django.contrib import auth
from django.core.cache import cache

from console import events
from faultline import metrics

log = logging.getLogger(__name__)

# What Channels accepts as a group name (ASCII only); a topic outside it names no stream.
_CHANNEL_NAME = re.compile(r"^[a-zA-Z0-9_.-]{1,99}$")
_COUNT_TTL_S = 3600  # a process killed holding sockets leaves its count for at most this
SESSION_RECHECK_S = 30.0


def _count_key(user_id: int) -> str:
    return f"ws-sockets:{user_id}"


def _open_socket(user_id: int) -> bool:
    """Count one more socket for this user; False (and not counted) when over the cap."""
    key = _count_key(user_id)
    try:
        cache.add(key, 0, timeout=_COUNT_TTL_S)
        if int(cache.incr(key)) > settings.WS_MAX_PER_USER:
            cache.decr(key)
            return False
        cache.touch(key, _COUNT_TTL_S)
    except Exception:  # Redis down: live updates beat the cap
        log.warning("consumers: socket cap unavailable", exc_info=True)
    return True


def _close_socket(user_id: int) -> None:
    try:
        if int(cache.decr(_count_key(user_id))) < 0:
            cache.set(_count_key(user_id), 0, timeout=_COUNT_TTL_S)
    except (ValueError, redis.RedisError):  # the key expired or Redis is down: no count
        return


def _session_user_id(session_key: str) -> int | None:
    """The user a login session still authenticates, read again now; None once it does not
    (logged out, expired, its user's password changed or the user deactivated)."""
    engine = import_module(settings.SESSION_ENGINE)

    class _Request:
        session = engine.SessionStore(session_key)

    user = auth.get_user(_Request())  # only .session is read
    return int(user.pk) if user.is_authenticated else None


class LiveConsumer(AsyncJsonWebsocketConsumer):
    """One socket per page; `?topic=fleet` or `?topic=group:<name>` picks the stream."""

    channel: str | None = None
    counted_for: int | None = None
    session_group: str | None = None
    session_key: str | None = None
    checked_at = 0.0

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=4401)
            return
        topic = self.scope["url_route"]["kwargs"].get("topic", "fleet")
        channel = None
        if topic == "fleet":
            channel = events.FLEET
        elif topic.startswith("group:"):
            channel = events.group_channel(topic.removeprefix("group:"))
        if channel is None or not _CHANNEL_NAME.match(channel):
            await self.close(code=4404)
            return
        if not await sync_to_async(_open_socket)(user.pk):
            await self.close(code=4429)
            return
        self.counted_for, self.channel = user.pk, channel
        session = self.scope.get("session")
        self.session_key = getattr(session, "session_key", None)
        if self.session_key:
            self.session_group = events.session_channel(self.session_key)
            await self.channel_layer.group_add(self.session_group, self.channel_name)
        self.checked_at = time.monotonic()
        await self.channel_layer.group_add(self.channel, self.channel_name)
        await self.accept()
        metrics.WEBSOCKET_CLIENTS.inc()
        await self.send_json({"type": "hello", "topic": topic})

    async def disconnect(self, code: int) -> None:
        if self.session_group:
            await self.channel_layer.group_discard(self.session_group, self.channel_name)
        if self.channel:
            metrics.WEBSOCKET_CLIENTS.dec()
            await self.channel_layer.group_discard(self.channel, self.channel_name)
        if self.counted_for is not None:
            await sync_to_async(_close_socket)(self.counted_for)
            self.counted_for = None

    async def push(self, message: dict[str, Any]) -> None:
        """Every event published to this socket's channel group (console.events.publish)."""
        if self.session_key and time.monotonic() - self.checked_at > SESSION_RECHECK_S:
            self.checked_at = time.monotonic()
            user_id = await database_sync_to_async(_session_user_id)(self.session_key)
            if user_id is None or user_id != self.counted_for:
                await self.close(code=4401)
                return
        await self.send_json(message["event"])

    async def session_ended(self, message: dict[str, Any]) -> None:
        """Its login session logged out (console.events.end_session)."""
        await self.close(code=4401)
