"""Diagnosis scheduling on ingest's hot path (issue 19): one Redis round trip, and none
for an ordinary batch within the debounce window of finding a run already pending; a
batch with a critical device event still checks."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.cache import cache

from console import scheduling


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any]]:
    calls: list[tuple[str, Any]] = []
    monkeypatch.setattr(
        scheduling,
        "enqueue",
        lambda name, *args, countdown=None, **lane: None if lane else calls.append((name, args)),
    )  # the ordinary lane only (the urgent one: tests/server/security/test_urgent_lane.py)
    return calls


def test_it_queues_once_and_uses_the_keys_the_task_clears(sent):
    scheduling.schedule_diagnosis("g-deb-1")
    assert sent == [(scheduling.DIAGNOSE_GROUP, ("g-deb-1",))]
    assert cache.get(scheduling.pending_key("g-deb-1")) == 1  # as `cache.add` set it
    cache.delete(scheduling.pending_key("g-deb-1"))  # what the task does when it starts
    scheduling.forget_recent()
    scheduling.schedule_diagnosis("g-deb-1")
    assert len(sent) == 2


def test_a_run_pending_elsewhere_covers_ordinary_batches_without_asking_again(sent, monkeypatch):
    cache.add(scheduling.pending_key("g-deb-2"), 1, timeout=5)  # another process queued it
    asked: list[str] = []
    claim = scheduling._young_and_claim

    def counting(group: str, timeout_s: int) -> tuple[bool, bool]:
        asked.append(group)
        return claim(group, timeout_s)

    monkeypatch.setattr(scheduling, "_young_and_claim", counting)
    scheduling.schedule_diagnosis("g-deb-2")
    scheduling.schedule_diagnosis("g-deb-2")  # within the window: no round trip
    assert (asked, sent) == (["g-deb-2"], [])
    cache.delete(scheduling.pending_key("g-deb-2"))  # the run started
    scheduling.schedule_diagnosis("g-deb-2", urgent=True)  # an Xid: checks, and queues
    assert asked == ["g-deb-2", "g-deb-2"]
    assert sent == [(scheduling.DIAGNOSE_GROUP, ("g-deb-2",))]


def test_a_young_group_keeps_the_longer_guard(sent, settings):
    settings.DIAGNOSIS_YOUNG_DEBOUNCE_MS = 20_000
    scheduling.mark_young(["g-deb-3"], node="node-deb-3")
    scheduling.schedule_diagnosis("g-deb-3")
    assert len(sent) == 1
    ttl = scheduling._redis().ttl(cache.make_key(scheduling.pending_key("g-deb-3")))
    assert ttl > scheduling.PENDING_TIMEOUT_S + 10
