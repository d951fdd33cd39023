"""A pass at the moment a silent rank crosses its hang threshold: the pass that
sees the same deadline twice queues one check for then, and the check runs only while
that deadline still holds. Without it the rank waited for the sweep's next tick, its
debounce and the pass in front (seconds at 16k ranks)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from console import scheduling, tasks
from console.models import Incident
from tests.conftest import iso, make_batch

GROUP = "dl-a"


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[tuple[tuple[Any, ...], float | None]]:
    calls: list[tuple[tuple[Any, ...], float | None]] = []

    def enqueue(name: str, *args: Any, countdown: float | None = None, **lane: Any) -> None:
        if name == scheduling.CHECK_GROUP:
            calls.append((args, countdown))

    monkeypatch.setattr(scheduling, "enqueue", enqueue)
    return calls


def test_a_deadline_seen_twice_is_queued_once_for_then(sent):
    at = datetime.now(UTC) + timedelta(seconds=8)
    scheduling.schedule_check("g-dl-1", at)
    assert sent == []  # once: a stepping group's deadline moves every step
    scheduling.schedule_check("g-dl-1", at)
    scheduling.schedule_check("g-dl-1", at)
    [(args, countdown)] = sent
    assert args == ("g-dl-1", at.timestamp())
    assert countdown is not None and 7 < countdown <= 8
    later = at + timedelta(seconds=1)  # the rank stepped after all
    scheduling.schedule_check("g-dl-1", later)
    assert len(sent) == 1
    scheduling.schedule_check("g-dl-1", later)
    assert [a[1] for a, _ in sent] == [at.timestamp(), later.timestamp()]


def test_a_deadline_past_the_horizon_is_left_to_the_sweep(sent):
    far = datetime.now(UTC) + timedelta(seconds=scheduling.CHECK_HORIZON_S + 60)
    for _ in range(3):
        scheduling.schedule_check("g-dl-2", far)
    assert sent == []


def test_a_check_runs_only_while_its_deadline_holds(sent):
    at = datetime.now(UTC) + timedelta(seconds=5)
    scheduling.schedule_check("g-dl-3", at)
    scheduling.schedule_check("g-dl-3", at)
    assert scheduling.check_still_due("g-dl-3", at.timestamp())
    assert not scheduling.check_still_due("g-dl-3", at.timestamp())  # run once

    scheduling.schedule_check("g-dl-4", at)
    scheduling.schedule_check("g-dl-4", at)
    scheduling.schedule_check("g-dl-4", at + timedelta(seconds=1))  # it stepped since
    assert not scheduling.check_still_due("g-dl-4", at.timestamp())

    scheduling.schedule_check("g-dl-5", at)
    scheduling.schedule_check("g-dl-5", at)
    sooner = at - timedelta(seconds=3)  # another rank's, queued after
    scheduling.schedule_check("g-dl-5", sooner)
    scheduling.schedule_check("g-dl-5", sooner)
    assert not scheduling.check_still_due("g-dl-5", at.timestamp())  # superseded
    assert scheduling.check_still_due("g-dl-5", sooner.timestamp())


def _one_rank_silent(post_batch: Any) -> datetime:
    """8 ranks stepping every 2 s; rank 3 stopped one step before the others. Its threshold
    (3 x 2 s) is crossed ~3.8 s from now, with no record arriving: that moment."""
    now = datetime.now(UTC)
    start = now - timedelta(seconds=18.2)
    for node_index in range(2):
        node = f"dl-node-{node_index}"
        records: list[dict[str, Any]] = []
        for local in range(4):
            rank = node_index * 4 + local
            records.append({"kind": "process", "group": GROUP, "generation": 1, "rank": rank,
                            "event": "started", "pid": 1000 + rank, "gpu": f"GPU-{node}-{local}",
                            "ts": iso(start)})  # fmt: skip
            for s in range(9 if rank == 3 else 10):
                records.append({"kind": "step", "group": GROUP, "generation": 1, "rank": rank,
                                "step": s, "tokens": 2048, "duration_ms": 2000.0,
                                "ts": iso(start + timedelta(seconds=2 * s))})  # fmt: skip
        assert post_batch(make_batch(records, node=node, sent_at=now)).status_code == 202
    return start + timedelta(seconds=16 + 6)  # rank 3's last step + the threshold


@pytest.mark.django_db
def test_a_silent_rank_is_named_by_the_check_at_its_threshold(post_batch, sent):
    due = _one_rank_silent(post_batch)
    tasks.diagnose_group(GROUP)
    assert sent == []  # one pass: not yet known to be stable
    tasks.diagnose_group(GROUP)
    [(args, countdown)] = sent
    assert args == (GROUP, due.timestamp())
    assert countdown is not None and 0 < countdown < 3.8
    assert not Incident.objects.filter(group__name=GROUP, kind="rank_hang").exists()

    time.sleep(max(0.0, due.timestamp() - time.time()) + 0.05)
    # The agents keep sending (GPU samples, as every batch does): the nodes are not
    # lagging, so rank 3's silence is judged at the clock, not at their newest record.
    for node_index in range(2):
        node = f"dl-node-{node_index}"
        at = datetime.now(UTC)
        samples = [{"kind": "device_sample", "gpu": f"GPU-{node}-{i}", "index": i,
                    "temp_c": 60.0, "ts": iso(at)} for i in range(4)]  # fmt: skip
        assert post_batch(make_batch(samples, node=node, sent_at=at)).status_code == 202
    assert tasks.check_group(*args) is True
    (hang,) = Incident.objects.filter(group__name=GROUP, kind="rank_hang")
    assert hang.subject == f"rank:{GROUP}/3"
    assert tasks.check_group(*args) is False  # one pass per queued check
    # That pass queues the next deadline's check only once it is stable (the others').
    assert len(sent) == 1


@pytest.mark.django_db
def test_with_checks_off_only_the_sweep_judges_silence(post_batch, sent, settings):
    settings.DIAGNOSIS_CHECKS = False
    _one_rank_silent(post_batch)
    tasks.diagnose_group(GROUP)
    tasks.diagnose_group(GROUP)
    assert sent == []
