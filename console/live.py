"""After-commit hand-off from ingest: live websocket updates and debounced diagnosis.

Both are best-effort by design: if Redis is down the batch is already stored, the page shows
its "live connection lost" banner, and the periodic sweep diagnoses the touched groups once
the broker is back. Nothing here may raise into the ingest response.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from typing import Any

from channels.layers import get_channel_layer
from django.conf import settings
from django.core.cache import cache
from django.utils import timezone

from console import events, queries

log = logging.getLogger(__name__)


class _Publisher:
    """One event loop thread per process sends every live event, in order, off the request.

    `async_to_sync(layer.group_send)` built a new event loop and a new Redis connection per
    event (4.9 ms of CPU each, measured); this loop keeps its connections. The queue is
    bounded: with Redis away, events beyond it are dropped (pages refetch on reconnect).
    """

    LIMIT = 10_000

    def __init__(self) -> None:
        self.pid = 0
        self.loop: asyncio.AbstractEventLoop | None = None
        self.queue: asyncio.Queue[tuple[str, dict[str, Any]]] | None = None
        self.lock = threading.Lock()
        self.dropped = 0

    def submit(self, channel: str, message: dict[str, Any]) -> None:
        loop, queue = self._started()
        if queue.qsize() >= self.LIMIT:
            self.dropped += 1
            return
        loop.call_soon_threadsafe(queue.put_nowait, (channel, message))

    def _started(self) -> tuple[asyncio.AbstractEventLoop, asyncio.Queue[Any]]:
        with self.lock:
            if self.pid != os.getpid() or self.loop is None or self.queue is None:
                # First use in this process (gunicorn and Celery fork after import).
                self.loop = asyncio.new_event_loop()
                self.queue = asyncio.Queue()
                self.pid = os.getpid()
                threading.Thread(
                    target=self.loop.run_forever, name="faultline-live", daemon=True
                ).start()
                asyncio.run_coroutine_threadsafe(self._drain(self.queue), self.loop)
            return self.loop, self.queue

    async def _drain(self, queue: asyncio.Queue[tuple[str, dict[str, Any]]]) -> None:
        layer = get_channel_layer()
        while True:
            channel, message = await queue.get()
            try:
                if layer is not None:
                    await layer.group_send(channel, message)
            except Exception:  # live updates must never break anything else
                log.warning("live: could not publish to %s", channel, exc_info=True)


_publisher = _Publisher()


def publish(channel: str, kind: str, data: Any) -> None:
    """Queue a typed event for `channel`'s subscribers; returns at once, never raises."""
    try:
        _publisher.submit(channel, {"type": "push", "event": events.make_event(kind, data)})
    except Exception:  # live updates must never break a write
        log.warning("live: could not queue %s for %s", kind, channel, exc_info=True)


# Per web process: when each node's card was last pushed. Agents report every second; the
# fleet page needs at most one update per node per second, urgent ones (device events) at
# once. Losing this on a restart only means one extra push.
_last_push: dict[str, float] = {}
PUSH_EVERY_S = 1.0


def push_due(node: str) -> bool:
    """Whether this node's card is due for a push (ingest then reads it in its last send)."""
    return time.monotonic() - _last_push.get(node, 0.0) >= PUSH_EVERY_S


def after_ingest(
    *, groups: list[str], nodes: list[str], urgent: bool = False, card: Any = None
) -> None:
    """Push the node card ingest read as it committed (`card`, when one was due or the batch
    carried a critical device event) and schedule diagnosis of the touched groups."""
    if card is not None:
        publish(events.FLEET, "node.changed", card)
        _last_push[card["name"]] = time.monotonic()
    # A device event (Xid, GPU lost) names no group: diagnose every group with ranks on the
    # node at once, so the root cause is named within a second, not at the next sweep.
    targets = set(groups) | (set(queries.groups_on_nodes(nodes)) if urgent else set())
    for name in sorted(targets):
        schedule_diagnosis(name)


PENDING_TIMEOUT_S = 5


# Per process: when this process last queued each group's diagnosis. A batch within the
# debounce countdown of that is covered by the queued run (which starts no earlier than the
# countdown, and reads the database then), so it skips even the Redis round trip.
_queued_at: dict[str, float] = {}


def schedule_diagnosis(group: str) -> None:
    """Debounce: at most one pending diagnosis per group per debounce window."""
    from console.tasks import diagnose_group

    delay_ms = settings.DIAGNOSIS_DEBOUNCE_MS
    now = time.monotonic()
    if now - _queued_at.get(group, -1e9) < delay_ms / 1000:
        return
    try:
        # The task deletes this key when it starts, so a batch arriving during a run
        # schedules the next one; the timeout only guards against a lost task (a worker
        # killed holding it). Keep it short: the sweep also goes through this key, so a
        # lost task silences the group's diagnosis until the key expires (30 s measured
        # with 30; docs/reliability.md). A too-early expiry only costs one extra run.
        if not cache.add(pending_key(group), 1, timeout=PENDING_TIMEOUT_S):
            return
        diagnose_group.apply_async(args=[group], countdown=delay_ms / 1000)
        _queued_at[group] = now
    except Exception:  # broker down: the sweep catches up
        log.warning("live: could not schedule diagnosis of %s", group, exc_info=True)


def forget_recent() -> None:
    """Drop this process's memory of recent pushes and queued diagnoses (tests)."""
    _last_push.clear()
    _queued_at.clear()


def pending_key(group: str) -> str:
    return f"diag-pending:{group}"


def actions_for_node(node: Any) -> list[dict[str, Any]]:
    """Approved actions for this node ride back on the ingest response.

    Handing an action to its agent is its dispatch, so this goes through the write path
    (every gate re-checked at dispatch), not through a read in console.queries.
    """
    from console.remediation import dispatch_for_node

    return dispatch_for_node(node=node, now=timezone.now())
