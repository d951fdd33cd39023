"""breaker.changed and action.changed reach a subscribed browser through the real channel
layer (channels_redis on the embedded Valkey: msgpack, not the in-memory layer)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from channels_redis.core import RedisChannelLayer
from django.db import connections

from console import actions
from console.routing import websocket_urlpatterns

pytestmark = pytest.mark.django_db(transaction=True)


async def _fleet_socket(user: Any) -> WebsocketCommunicator:
    comm = WebsocketCommunicator(URLRouter(websocket_urlpatterns), "/ws/live/fleet/")
    comm.scope["user"] = user
    connected, _ = await comm.connect()
    assert connected
    assert (await comm.receive_json_from(timeout=5))["type"] == "hello"
    return comm


def _write(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Run a write in asgiref's worker thread and close that thread's connection after
    (the test database is dropped at the end of the run)."""

    def call(**kwargs: Any) -> Any:
        try:
            return fn(**kwargs)
        finally:
            connections.close_all()

    return sync_to_async(call)


async def _next(comm: WebsocketCommunicator, kind: str) -> dict[str, Any]:
    """The next event of `kind` (node cards and other fleet events may come in between)."""
    while True:
        event = await comm.receive_json_from(timeout=5)
        if event["type"] == kind:
            return event


def test_it_runs_these_tests_on_the_redis_channel_layer():
    assert isinstance(get_channel_layer(), RedisChannelLayer)


def test_it_pushes_breaker_changes_with_iso_timestamps(cast, now):
    async def run() -> None:
        comm = await _fleet_socket(cast["viewer"])
        await _write(actions.set_breaker)(
            open=True, actor=cast["operator"], reason="xid storm", now=now
        )
        event = await _next(comm, "breaker.changed")
        data = event["data"]
        assert (data["open"], data["opened_by"]) == (True, "operator")
        assert data["reason"].endswith("xid storm")
        assert data["opened_at"] == now.isoformat() and data["closed_at"] is None
        await comm.disconnect()

    asyncio.run(run())


def test_it_pushes_one_action_changed_per_change(pool, cast, now, settings):
    """A proposal a person makes publishes once; an automatic one that policy approves at
    once publishes once too (its approved state), not once per step."""
    settings.FAULTLINE_REMEDIATION_POLICY = {"auto_approve": {"cordon_node": ["xid"]}}

    async def run() -> None:
        comm = await _fleet_socket(cast["viewer"])
        manual = await _write(actions.propose_action)(
            kind="cordon_node", target="node:n-03", reason="flaky NIC",
            actor=cast["operator"], now=now,
        )  # fmt: skip
        auto = await _write(actions.propose_action)(
            kind="cordon_node", target="node:n-04", reason="xid 79", actor=None,
            rule="xid-cordon", trigger="xid:79", now=now,
        )  # fmt: skip
        first = await _next(comm, "action.changed")
        second = await _next(comm, "action.changed")
        assert (first["data"]["id"], first["data"]["state"]) == (manual.action.pk, "proposed")
        assert (second["data"]["id"], second["data"]["state"]) == (auto.action.pk, "approved")
        assert first["data"]["reasons"] == list(manual.reasons)
        # Nothing else about these two actions follows.
        while not await comm.receive_nothing(timeout=0.5):
            extra = await comm.receive_json_from()
            assert extra["type"] != "action.changed", extra
        await comm.disconnect()

    asyncio.run(run())
