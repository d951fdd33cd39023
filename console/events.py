"""Live events: the typed websocket payloads and the one publisher that sends them.

Owns the channel names, every payload shape a live page receives (TypedDicts, JSON-safe:
datetimes travel as ISO strings, because the Redis channel layer's msgpack cannot encode
them), `publish`/`publish_on_commit`, and `end_session` (a logout closes that session's
sockets, console.consumers). Every message carries `type` and a
monotonically increasing `version` (milliseconds since the epoch at publish) so a page
that reconnects can refetch anything newer than it saw. It must not read or write the
database: callers build payloads from rows they already hold.
"""

from __future__ import annotations

import asyncio
import atexit
import hashlib
import logging
import os
import threading
import time
from datetime import datetime
from typing import Any, Literal, Protocol, TypedDict

import msgspec
from channels.layers import get_channel_layer
from django.db import transaction

log = logging.getLogger(__name__)

FLEET = "fleet"

EventKind = Literal[
    "node.changed", "group.changed", "incident.changed", "action.changed", "breaker.changed"
]


def session_channel(session_key: str) -> str:
    """The channel group of one login session's sockets, named by a hash (the key is a
    credential and channel names show up in Redis)."""
    return "session." + hashlib.sha256(session_key.encode()).hexdigest()[:40]


def end_session(session_key: str) -> None:
    """Close every socket opened with this login session (it logged out); never raises."""
    try:
        _publisher.submit(session_channel(session_key), {"type": "session.ended"})
    except Exception:
        log.warning("live: could not close the sockets of a session", exc_info=True)


def group_channel(name: str) -> str:
    # Channels group names allow only ASCII alphanumerics, hyphens, underscores and periods.
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
    return f"group.{safe}"[:99]


def iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


# -- payloads --------------------------------------------------------------------------------


class NodeDevice(TypedDict):
    uuid: str
    index: int
    health: str
    temp_c: float | None
    power_w: float | None
    util_pct: float | None
    sm_clock_mhz: float | None
    throttle_reasons: list[str]
    lifecycle: str  # console.policy.fleet_health.HealthState


class NodePayload(TypedDict):
    name: str
    health: str
    last_seen: str | None
    quarantined: bool
    cordoned: bool
    devices: list[NodeDevice]
    # The latched health lifecycle (console.policy.fleet_health), its reason and since when.
    lifecycle: str
    lifecycle_reason: str
    lifecycle_since: str | None
    taken_out_by: str
    replace_flagged: bool
    # How late the node's newest batch arrived (console.delivery); None before any sample.
    delivery_delay_s: float | None


def node_payload(row: tuple[Any, ...]) -> NodePayload:
    """A node card from one row of the card columns, in `NodePayload`'s order (the fleet
    grid's query and ingest's in-batch `NODE_CARD` select the same columns): one
    definition of the card for the page, the REST and the live push."""
    (
        name,
        health,
        last_seen,
        quarantined,
        cordoned,
        devices,
        lifecycle,
        reason,
        since,
        taken_out_by,
        flagged,
        delivery_delay_s,
    ) = row
    return {
        "name": name,
        "health": health,
        "last_seen": last_seen.isoformat() if last_seen else None,
        "quarantined": quarantined,
        "cordoned": cordoned,
        "devices": msgspec.json.decode(devices) if isinstance(devices, str) else devices,
        "lifecycle": lifecycle,
        "lifecycle_reason": reason,
        "lifecycle_since": since.isoformat() if since else None,
        "taken_out_by": taken_out_by,
        "replace_flagged": flagged,
        "delivery_delay_s": delivery_delay_s,
    }


class GroupPayload(TypedDict):
    name: str


class IncidentPayload(TypedDict):
    id: int
    group: str | None
    generation: int
    state: str
    kind: str
    subject: str
    role: str
    severity: str
    summary: str
    symptom_count: int
    opened_at: str
    resolved_at: str | None
    recovery: dict[str, Any]
    version: int
    # Until then the root cause may still be revised (Incident.verdict_settled).
    settles_at: str


class ActionPayload(TypedDict):
    id: int
    kind: str
    target: str
    state: str
    approvals_required: int
    reasons: list[str]


class BreakerPayload(TypedDict):
    open: bool
    reason: str
    opened_at: str | None
    opened_by: str
    closed_at: str | None
    closed_by: str
    closed_reason: str
    description: str


class _Named(Protocol):
    name: str


class _IncidentRow(Protocol):
    pk: Any
    generation: int
    state: str
    kind: str
    subject: str
    role: str
    severity: str
    summary: str
    symptom_count: int
    opened_at: datetime
    resolved_at: datetime | None
    recovery: Any
    version: int

    @property
    def settles_at(self) -> datetime: ...

    @property
    def group(self) -> _Named | None: ...


class _ActionRow(Protocol):
    pk: Any
    kind: str
    target: str
    state: str
    approvals_required: int
    gate_reasons: Any


class _BreakerRow(Protocol):
    open: bool
    reason: str
    opened_at: datetime | None
    opened_by: str
    closed_at: datetime | None
    closed_by: str
    closed_reason: str


def incident_payload(incident: _IncidentRow) -> IncidentPayload:
    """The incident as live pages receive it (`incident.changed`)."""
    return {
        "id": incident.pk,
        "group": incident.group.name if incident.group else None,
        "generation": incident.generation,
        "state": incident.state,
        "kind": incident.kind,
        "subject": incident.subject,
        "role": incident.role,
        "severity": incident.severity,
        "summary": incident.summary,
        "symptom_count": incident.symptom_count,
        "opened_at": incident.opened_at.isoformat(),
        "resolved_at": iso(incident.resolved_at),
        "recovery": incident.recovery,
        "version": incident.version,
        "settles_at": incident.settles_at.isoformat(),
    }


def action_payload(action: _ActionRow) -> ActionPayload:
    """An action's state as the approvals queue receives it (`action.changed`)."""
    return {
        "id": action.pk,
        "kind": action.kind,
        "target": action.target,
        "state": action.state,
        "approvals_required": action.approvals_required,
        "reasons": list(action.gate_reasons),
    }


def breaker_payload(row: _BreakerRow, *, description: str) -> BreakerPayload:
    """The circuit breaker (`breaker.changed`, and GET /api/v1/breaker/), JSON-safe."""
    return {
        "open": row.open,
        "reason": row.reason,
        "opened_at": iso(row.opened_at),
        "opened_by": row.opened_by,
        "closed_at": iso(row.closed_at),
        "closed_by": row.closed_by,
        "closed_reason": row.closed_reason,
        "description": description,
    }


class Event(TypedDict):
    type: EventKind
    version: int
    data: Any


def make_event(kind: EventKind, data: Any) -> Event:
    return {"type": kind, "version": time.time_ns() // 1_000_000, "data": data}


# -- the publisher ---------------------------------------------------------------------------


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
        self.thread: threading.Thread | None = None
        self.at_exit = False

    def submit(self, channel: str, message: dict[str, Any]) -> None:
        loop, queue = self._started()
        if queue.qsize() >= self.LIMIT:
            self.dropped += 1
            return
        loop.call_soon_threadsafe(queue.put_nowait, (channel, message))

    def _started(
        self,
    ) -> tuple[asyncio.AbstractEventLoop, asyncio.Queue[tuple[str, dict[str, Any]]]]:
        with self.lock:
            if self.pid != os.getpid() or self.loop is None or self.queue is None:
                # First use in this process (gunicorn and Celery fork after import).
                self.loop = asyncio.new_event_loop()
                self.queue = asyncio.Queue()
                self.pid = os.getpid()
                self.thread = threading.Thread(
                    target=self.loop.run_forever, name="faultline-live", daemon=True
                )
                self.thread.start()
                asyncio.run_coroutine_threadsafe(self._drain(self.queue), self.loop)
                if not self.at_exit:
                    atexit.register(self.close)
                    self.at_exit = True
            return self.loop, self.queue

    def close(self, timeout: float = 2.0) -> None:
        """At interpreter exit: send what is queued, then stop the loop and its thread.

        A short-lived process (`faultline token create` registering a node) exited while
        this daemon thread was inside a Redis call, and the interpreter's teardown aborted
        it (SIGABRT). Bounded: a Redis that does not answer costs `timeout`, not the exit.
        """
        with self.lock:
            loop, queue, thread = self.loop, self.queue, self.thread
            if loop is None or queue is None or thread is None or self.pid != os.getpid():
                return
            self.loop = self.queue = self.thread = None
        try:
            asyncio.run_coroutine_threadsafe(queue.join(), loop).result(timeout)
        except Exception:  # noqa: BLE001 - an exit never waits longer on live updates
            log.debug("live: %d event(s) not sent at exit", queue.qsize())
        try:
            asyncio.run_coroutine_threadsafe(_cancel_others(), loop).result(timeout)
        except Exception:  # noqa: BLE001 - the same bound as above
            log.debug("live: the publisher's tasks did not stop at exit")
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout)
        if not thread.is_alive():
            loop.close()

    async def _drain(self, queue: asyncio.Queue[tuple[str, dict[str, Any]]]) -> None:
        layer = get_channel_layer()
        while True:
            channel, message = await queue.get()
            try:
                if layer is not None:
                    await layer.group_send(channel, message)
            except Exception:  # live updates must never break anything else
                log.warning("live: could not publish to %s", channel, exc_info=True)
            finally:
                queue.task_done()


async def _cancel_others() -> None:
    """Cancel the loop's other tasks (the drain) and wait for them to end."""
    others = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in others:
        task.cancel()
    await asyncio.gather(*others, return_exceptions=True)


_publisher = _Publisher()


def publish(channel: str, kind: EventKind, data: Any) -> None:
    """Queue a typed event for `channel`'s subscribers; returns at once, never raises."""
    try:
        _publisher.submit(channel, {"type": "push", "event": make_event(kind, data)})
    except Exception:  # live updates must never break a write
        log.warning("live: could not queue %s for %s", kind, channel, exc_info=True)


def publish_on_commit(channel: str, kind: EventKind, data: Any) -> None:
    """Publish once the current transaction commits (at once outside one)."""
    transaction.on_commit(lambda: publish(channel, kind, data))
