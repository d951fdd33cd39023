"""Diagnosis scheduling on ingest's hot path: one Redis round trip, and none
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


# -- the sweep: many groups at once (bench/sweep.py: a send per group took 1.6 s a second) --
@pytest.fixture
def sent_all(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, tuple[Any, ...]]]:
    calls: list[tuple[str, tuple[Any, ...]]] = []
    monkeypatch.setattr(
        scheduling, "enqueue", lambda name, *args, countdown=None: calls.append((name, args))
    )
    return calls


def test_the_sweep_claims_every_group_at_once_and_sends_them_in_chunks(sent_all, monkeypatch):
    groups = [f"g-sw-{i:03d}" for i in range(150)]
    cache.add(scheduling.pending_key("g-sw-007"), 1, timeout=5)  # its run is pending
    trips: list[int] = []
    real = scheduling._redis

    def counting() -> Any:
        trips.append(1)
        return real()

    monkeypatch.setattr(scheduling, "_redis", counting)
    assert scheduling.schedule_sweep(groups) == 149
    assert len(trips) == 1  # one round trip for every claim
    chunks = [args[0] for name, args in sent_all if name == scheduling.DIAGNOSE_GROUPS]
    assert [len(c) for c in chunks] == [19] * 7 + [16]  # 8 messages: every worker gets some
    assert [g for c in chunks for g in c] == [g for g in groups if g != "g-sw-007"]
    assert all(cache.get(scheduling.pending_key(g)) == 1 for g in groups)
    assert scheduling.schedule_sweep(groups) == 0  # within the window: not even a trip
    assert len(trips) == 1
    scheduling.forget_recent()
    cache.delete_many([scheduling.pending_key(g) for g in groups[:10]])  # those started
    assert scheduling.schedule_sweep(groups) == 10
    pairs = [(scheduling.DIAGNOSE_GROUPS, (groups[i : i + 2],)) for i in range(0, 10, 2)]
    assert sent_all[-5:] == pairs  # 10 groups: 5 messages of 2


def test_a_large_sweep_sends_at_most_sweep_chunk_groups_a_message(sent_all):
    groups = [f"g-sw-big-{i:04d}" for i in range(1000)]
    assert scheduling.schedule_sweep(groups) == 1000
    sizes = [len(args[0]) for _, args in sent_all]
    assert sizes == [scheduling.SWEEP_CHUNK] * 15 + [1000 - 15 * scheduling.SWEEP_CHUNK]


def test_the_sweep_sends_young_groups_alone_on_their_budget(sent_all, settings):
    settings.DIAGNOSIS_YOUNG_PER_S = 4  # the sweep's own budget: half of it
    young = [f"g-sw-young-{i}" for i in range(5)]
    scheduling.mark_young(young, node="node-sw")
    assert scheduling.schedule_sweep(["g-sw-old", *young]) == 1
    singles = [args[0] for name, args in sent_all if name == scheduling.DIAGNOSE_GROUP]
    assert singles == young[:2]
    assert (scheduling.DIAGNOSE_GROUPS, (["g-sw-old"],)) in sent_all
    # Over budget: their claims are released for the next tick.
    assert all(cache.get(scheduling.pending_key(g)) is None for g in young[2:])


def test_a_sweep_the_broker_refused_releases_its_claims(monkeypatch):
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise ConnectionError("broker down")

    monkeypatch.setattr(scheduling, "enqueue", refuse)
    groups = [f"g-sw-down-{i}" for i in range(3)]
    assert scheduling.schedule_sweep(groups) == 0
    assert all(cache.get(scheduling.pending_key(g)) is None for g in groups)
    scheduling.forget_recent()
    sent: list[Any] = []
    monkeypatch.setattr(
        scheduling, "enqueue", lambda name, *args, countdown=None: sent.append(args)
    )
    assert scheduling.schedule_sweep(groups) == 3  # the next tick


def test_a_sweep_chunk_runs_every_group_though_one_fails(monkeypatch):
    from console import tasks

    ran: list[str] = []

    def diagnose(group: str) -> None:
        if group == "g-sw-bad":
            raise RuntimeError("a broken group")
        ran.append(group)

    monkeypatch.setattr(tasks, "_diagnose", diagnose)
    groups = ["g-sw-a", "g-sw-bad", "g-sw-b"]
    for g in groups:
        cache.add(scheduling.pending_key(g), 1, timeout=5)
    took = tasks.diagnose_groups(groups)
    assert ran == ["g-sw-a", "g-sw-b"] and len(took) == 2
    assert all(cache.get(scheduling.pending_key(g)) is None for g in groups)
