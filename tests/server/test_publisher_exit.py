"""A process that publishes and exits at once (a CLI verb) sends what it queued and stops
the publisher's thread before the interpreter is torn down, within a bound."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from console import events


class SlowLayer:
    def __init__(self, delay: float) -> None:
        self.delay, self.sent = delay, []

    async def group_send(self, channel: str, message: dict[str, Any]) -> None:
        await asyncio.sleep(self.delay)
        self.sent.append((channel, message["n"]))


@pytest.mark.parametrize("count", [0, 1, 5])
def test_close_sends_what_was_queued_then_stops_the_thread(monkeypatch, count) -> None:
    layer = SlowLayer(0.02)
    monkeypatch.setattr(events, "get_channel_layer", lambda: layer)
    publisher = events._Publisher()
    for n in range(count):
        publisher.submit("fleet", {"n": n})
    if count == 0:
        publisher._started()
    thread = publisher.thread
    publisher.close()
    assert layer.sent == [("fleet", n) for n in range(count)]
    assert thread is not None and not thread.is_alive()
    publisher.close()  # twice is harmless


def test_close_is_bounded_when_the_layer_hangs(monkeypatch) -> None:
    layer = SlowLayer(60)
    monkeypatch.setattr(events, "get_channel_layer", lambda: layer)
    publisher = events._Publisher()
    publisher.submit("fleet", {"n": 1})
    started = time.monotonic()
    publisher.close(timeout=0.3)
    assert time.monotonic() - started < 2
    assert layer.sent == []


def test_a_closed_publisher_starts_again_on_the_next_event(monkeypatch) -> None:
    layer = SlowLayer(0)
    monkeypatch.setattr(events, "get_channel_layer", lambda: layer)
    publisher = events._Publisher()
    publisher.submit("fleet", {"n": 1})
    publisher.close()
    publisher.submit("fleet", {"n": 2})
    publisher.close()
    assert layer.sent == [("fleet", 1), ("fleet", 2)]


def test_a_forked_child_leaves_its_parents_publisher_alone(monkeypatch) -> None:
    """A Celery prefork child inherits the parent's publisher but not its thread: closing it
    at the child's exit must neither wait on a loop nobody runs nor stop the parent's."""
    import os

    layer = SlowLayer(0)
    monkeypatch.setattr(events, "get_channel_layer", lambda: layer)
    publisher = events._Publisher()
    publisher.submit("fleet", {"n": 1})
    pid = os.fork()
    if pid == 0:  # the child: report by exit status only, never return into pytest
        code = 1
        try:
            started = time.monotonic()
            publisher.close(timeout=5)
            code = 0 if time.monotonic() - started < 0.5 else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert publisher.thread is not None and publisher.thread.is_alive()  # the parent's runs on
    publisher.submit("fleet", {"n": 2})
    publisher.close()
    assert layer.sent == [("fleet", 1), ("fleet", 2)]
