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


# -- a socket lives no longer than its login session ----------------------------------------


def _in_thread(fn):
    """Run `fn` in asgiref's worker thread and close that thread's database connection
    after (the test database is dropped at the end of the run)."""
    from asgiref.sync import sync_to_async
    from django.db import connections

    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        finally:
            connections.close_all()

    return sync_to_async(call)


def _logged_in(user):
    """A browser's login: the test client holding the session, and the session as the
    websocket's scope carries it."""
    from importlib import import_module

    from django.conf import settings
    from django.test import Client

    browser = Client()
    browser.force_login(user)
    store = import_module(settings.SESSION_ENGINE).SessionStore(browser.session.session_key)
    return browser, store


async def _socket(user, session) -> WebsocketCommunicator:
    comm = await _connect("/ws/live/fleet/", user)
    comm.scope["session"] = session
    assert (await comm.connect())[0]
    assert (await comm.receive_json_from())["type"] == "hello"
    return comm


def test_logging_out_closes_that_sessions_sockets_and_not_another_sessions(cast):
    from asgiref.sync import sync_to_async

    async def run():
        browser, session = await _in_thread(_logged_in)(cast["viewer"])
        _, other_session = await _in_thread(_logged_in)(cast["viewer"])
        mine = await _socket(cast["viewer"], session)
        other = await _socket(cast["viewer"], other_session)
        response = await _in_thread(browser.post)("/logout/")
        assert response.status_code == 302
        closed = await mine.receive_output(timeout=5)
        assert closed == {"type": "websocket.close", "code": 4401}
        await sync_to_async(live.publish)(events.FLEET, "node.changed", {"name": "n1"})
        assert (await other.receive_json_from(timeout=5))["type"] == "node.changed"
        await other.disconnect()
        await _in_thread(lambda: None)()  # the consumer's session reads used that thread

    asyncio.run(run())


@pytest.mark.parametrize("how", ["flushed", "password", "deactivated"])
def test_a_socket_whose_session_ended_elsewhere_gets_no_further_event(cast, how, monkeypatch):
    from asgiref.sync import sync_to_async

    from console import consumers

    monkeypatch.setattr(consumers, "SESSION_RECHECK_S", 0.0)
    user = cast["operator"]
    held = {}

    def end() -> None:
        if how == "flushed":
            held["session"].delete()  # an admin cleared sessions; the cookie's age ran out
        elif how == "password":
            user.set_password("a-new-password-456")
            user.save()
        else:
            user.is_active = False
            user.save()

    async def run():
        _, held["session"] = await _in_thread(_logged_in)(user)
        comm = await _socket(user, held["session"])
        await sync_to_async(live.publish)(events.FLEET, "node.changed", {"name": "n0"})
        assert (await comm.receive_json_from(timeout=5))["data"] == {"name": "n0"}
        await _in_thread(end)()
        await sync_to_async(live.publish)(events.FLEET, "node.changed", {"name": "n1"})
        closed = await comm.receive_output(timeout=5)
        assert closed == {"type": "websocket.close", "code": 4401}
        await _in_thread(lambda: None)()  # the consumer's session reads used that thread

    asyncio.run(run())
