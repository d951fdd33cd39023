"""Websocket live views: authentication, topics, and events published after commit."""

from __future__ import annotations

import asyncio

import pytest
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import AnonymousUser

from console import events, live
from console.routing import websocket_urlpatterns

pytestmark = pytest.mark.django_db(transaction=True)


async def _connect(path: str, user) -> WebsocketCommunicator:
    """The consumer behind the router, with the user the auth middleware would have set."""
    comm = WebsocketCommunicator(URLRouter(websocket_urlpatterns), path)
    comm.scope["user"] = user
    return comm


def test_it_refuses_anonymous_sockets():
    async def run():
        comm = await _connect("/ws/live/fleet/", AnonymousUser())
        connected, code = await comm.connect()
        assert connected is False
        assert code == 4401

    asyncio.run(run())


def test_it_refuses_unknown_topics(cast):
    async def run():
        comm = await _connect("/ws/live/secrets/", cast["viewer"])
        connected, code = await comm.connect()
        assert (connected, code) == (False, 4404)

    asyncio.run(run())


def test_it_pushes_fleet_and_group_events_to_subscribers(cast):
    async def run():
        fleet = await _connect("/ws/live/fleet/", cast["viewer"])
        group = await _connect("/ws/live/group:job-a/", cast["viewer"])
        assert (await fleet.connect())[0] and (await group.connect())[0]
        assert (await fleet.receive_json_from())["type"] == "hello"
        assert (await group.receive_json_from())["topic"] == "group:job-a"
        from asgiref.sync import sync_to_async

        await sync_to_async(live.publish)(events.FLEET, "node.changed", {"name": "n1"})
        await sync_to_async(live.publish)(
            events.group_channel("job-a"), "incident.changed", {"id": 7}
        )
        node_event = await fleet.receive_json_from(timeout=5)
        incident_event = await group.receive_json_from(timeout=5)
        assert node_event["type"] == "node.changed" and node_event["data"] == {"name": "n1"}
        assert incident_event["type"] == "incident.changed" and incident_event["version"] > 0
        assert await fleet.receive_nothing(timeout=0.3)  # group events stay on their topic
        await fleet.disconnect()
        await group.disconnect()

    asyncio.run(run())


def test_it_delivers_events_in_publish_order_without_blocking_the_caller(cast):
    """publish() queues for the process's sender thread: it returns at once, and a burst
    (a fleet of node pushes) arrives complete and in order."""

    async def run():
        fleet = await _connect("/ws/live/fleet/", cast["viewer"])
        assert (await fleet.connect())[0]
        assert (await fleet.receive_json_from())["type"] == "hello"
        from asgiref.sync import sync_to_async

        def burst() -> None:
            for i in range(50):
                live.publish(events.FLEET, "node.changed", {"name": f"n{i}"})

        await sync_to_async(burst)()
        names = [(await fleet.receive_json_from(timeout=5))["data"]["name"] for _ in range(50)]
        assert names == [f"n{i}" for i in range(50)]
        await fleet.disconnect()

    asyncio.run(run())


def test_it_refuses_a_non_ascii_topic_instead_of_crashing(cast):
    async def run():
        comm = await _connect("/ws/live/group:j%C3%B6b-\u0663/", cast["viewer"])
        connected, code = await comm.connect()
        assert (connected, code) == (False, 4404)

    asyncio.run(run())


def test_it_caps_the_sockets_one_user_holds_open(cast, settings):
    settings.WS_MAX_PER_USER = 2

    async def run():
        socks = [await _connect("/ws/live/fleet/", cast["viewer"]) for _ in range(3)]
        assert (await socks[0].connect())[0] and (await socks[1].connect())[0]
        assert await socks[2].connect() == (False, 4429)
        other = await _connect("/ws/live/fleet/", cast["operator"])
        assert (await other.connect())[0]  # the cap is per user
        await socks[0].disconnect()
        again = await _connect("/ws/live/fleet/", cast["viewer"])
        assert (await again.connect())[0]  # a closed socket gives its place back
        for comm in (socks[1], other, again):
            await comm.disconnect()

    asyncio.run(run())
