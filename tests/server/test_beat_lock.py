"""The beat leader lock: one holder at a time, taken over when it lapses."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid

import pytest
import redis
from django.conf import settings

from faultline.beat import LeaderScheduler, Leadership


@pytest.fixture
def key() -> str:
    return f"test:beat:{uuid.uuid4().hex}"


def _client() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL)


def test_one_beat_leads_the_other_takes_over_when_its_lock_lapses(key):
    first, second = (Leadership(_client(), ttl_s=0.6, key=key, tag=t) for t in "ab")
    assert first.hold() and not second.hold()
    for _ in range(3):  # renewing keeps it past the TTL
        time.sleep(0.3)
        assert first.hold() and not second.hold()
    time.sleep(0.8)  # the leader stops renewing (dead or frozen)
    assert second.hold()
    assert not first.hold() and not first.leading  # it finds out, and stands by


def test_a_beat_that_stops_cleanly_hands_the_lock_over_at_once(key):
    first, second = (Leadership(_client(), ttl_s=30, key=key, tag=t) for t in "ab")
    assert first.hold() and not second.hold()
    second.release()  # not the holder: nothing happens
    assert not second.hold()
    first.release()
    assert second.hold()


def test_a_standby_scheduler_sends_nothing(key, monkeypatch, tmp_path):
    from faultline.celery import app

    sent: list[str] = []
    monkeypatch.setattr(LeaderScheduler, "apply_async", lambda self, entry, **kw: sent.append(
        entry.name))  # fmt: skip
    holder = Leadership(_client(), ttl_s=30, key=key, tag="another")
    assert holder.hold()
    beat = LeaderScheduler(app=app, schedule_filename=str(tmp_path / "schedule"), lazy=True)
    beat.leadership.key = key
    beat.setup_schedule()
    assert beat.tick() <= 0.5
    assert sent == []
    holder.release()
    for _ in range(10):
        beat.tick()
        time.sleep(0.2)
    assert beat.leadership.leading and "sweep" in sent
    beat.close()
    assert _client().get(key) is None


def test_a_restarted_beat_takes_the_lock_of_its_dead_predecessor_at_once(key):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    _client().set(key, f"{socket.gethostname()}:{dead.pid}:sched-a", px=30_000)
    assert not Leadership(_client(), ttl_s=30, key=key, tag="sched-b").hold()  # another's
    assert Leadership(_client(), ttl_s=30, key=key, tag="sched-a").hold()
    # A live holder of the same instance (here: our parent process) is never taken over.
    _client().set(key, f"{socket.gethostname()}:{os.getppid()}:sched-a", px=30_000)
    assert not Leadership(_client(), ttl_s=30, key=key, tag="sched-a").hold()
