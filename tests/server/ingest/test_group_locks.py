"""One job's batches do not queue on their group's row; transitions still fence them.

Batches of steps and collectives take FOR KEY SHARE on the group row, transitions and
checkpoints FOR UPDATE. Another connection stands in for a batch in flight.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from django.db import connection

from console.models import ConsistencyGroup
from ingest.models import StepRecord
from tests.conftest import make_batch

pytestmark = pytest.mark.django_db(transaction=True)

GROUP = "g-locks"


def _transition(generation: int, **extra: Any) -> dict[str, Any]:
    return {"kind": "transition", "group": GROUP, "generation": generation,
            "to_state": "running", **extra}  # fmt: skip


def _step(generation: int, step: int, ts: datetime | None = None) -> dict[str, Any]:
    rec = {"kind": "step", "group": GROUP, "generation": generation, "rank": 0, "step": step}
    if ts is not None:
        rec["ts"] = ts.isoformat()
    return rec


@contextmanager
def _row_lock(mode: str) -> Iterator[None]:
    """Hold `mode` on the group's row from a second connection until the block ends."""
    s = connection.settings_dict
    with psycopg.connect(
        dbname=s["NAME"], host=s["HOST"] or None, port=s["PORT"] or None, user=s["USER"]
    ) as other:
        sql = f"SELECT 1 FROM console_consistencygroup WHERE name = %s {mode}"  # noqa: S608
        other.execute(sql, [GROUP])
        yield
        other.rollback()


def _in_thread(fn: Callable[[], Any]) -> tuple[threading.Event, list[Any]]:
    done, out = threading.Event(), []

    def run() -> None:
        try:
            out.append(fn())
        finally:
            connection.close()
            done.set()

    threading.Thread(target=run, daemon=True).start()
    return done, out


def test_a_step_batch_does_not_wait_for_another_batch_of_its_job(post_batch):
    assert post_batch(make_batch([_transition(1), _step(1, 0)])).status_code == 202
    with _row_lock("FOR KEY SHARE"):  # a step batch of another node, not yet committed
        done, out = _in_thread(lambda: post_batch(make_batch([_step(1, 5)])))
        assert done.wait(5), "a step batch queued behind another step batch of its group"
    assert out[0].status_code == 202


def test_a_transition_waits_for_step_batches_in_flight_then_fences_them(post_batch):
    assert post_batch(make_batch([_transition(1), _step(1, 0)])).status_code == 202
    with _row_lock("FOR KEY SHARE"):
        done, out = _in_thread(lambda: post_batch(make_batch([_transition(2)])))
        assert not done.wait(0.7), "the transition did not wait for the batch in flight"
    assert done.wait(5)
    assert out[0].status_code == 202
    assert ConsistencyGroup.objects.get(name=GROUP).generation == 2
    # A generation-1 step after the transition is stored, flagged stale, and moves nothing.
    assert post_batch(make_batch([_step(1, 6)])).status_code == 202
    assert list(StepRecord.objects.filter(step=6).values_list("stale", flat=True)) == [True]
    assert ConsistencyGroup.objects.get(name=GROUP).ranks.get(rank=0).last_step == 0


def test_a_step_batch_waits_while_a_transition_is_in_flight(post_batch):
    assert post_batch(make_batch([_transition(1), _step(1, 0)])).status_code == 202
    with _row_lock("FOR UPDATE"):  # a transition not yet committed
        done, _ = _in_thread(lambda: post_batch(make_batch([_step(1, 5)])))
        assert not done.wait(0.7), "a step read the group while a transition held it"
    assert done.wait(5)


def test_a_transition_keeps_what_diagnosis_wrote_in_the_summary(post_batch):
    post_batch(make_batch([_transition(1, model_version="m-1")]))
    ConsistencyGroup.objects.filter(name=GROUP).update(
        summary={"goodput": 0.93, "advice": "restore ck-9", "versions_seen": []}
    )
    post_batch(make_batch([_transition(1, model_version="m-2")]))
    summary = ConsistencyGroup.objects.get(name=GROUP).summary
    assert summary == {"goodput": 0.93, "advice": "restore ck-9", "versions_seen": ["m-1"]}
    post_batch(make_batch([_step(1, 1)]))
    assert ConsistencyGroup.objects.get(name=GROUP).summary == summary


def test_steps_move_last_activity_forward_only(post_batch):
    t0 = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=30)
    post_batch(make_batch([_transition(1, ts=t0.isoformat())]))
    post_batch(make_batch([_step(1, 1, t0 + timedelta(seconds=10))]))
    assert ConsistencyGroup.objects.get(name=GROUP).last_activity == t0 + timedelta(seconds=10)
    post_batch(make_batch([_step(1, 0, t0 + timedelta(seconds=2))]))  # a late delivery
    assert ConsistencyGroup.objects.get(name=GROUP).last_activity == t0 + timedelta(seconds=10)
    post_batch(make_batch([_step(1, 2, t0 + timedelta(seconds=20))]))
    assert ConsistencyGroup.objects.get(name=GROUP).last_activity == t0 + timedelta(seconds=20)


def test_the_first_steps_after_a_transition_set_the_kind_without_waiting(post_batch):
    """A launcher's transition creates the group (kind unknown); every node's first steps
    then name it at once. None may need the row FOR UPDATE: they would deadlock."""
    assert post_batch(make_batch([_transition(1)])).status_code == 202
    assert ConsistencyGroup.objects.get(name=GROUP).kind == "unknown"
    with _row_lock("FOR KEY SHARE"):  # another node's first step batch, in flight
        done, out = _in_thread(lambda: post_batch(make_batch([_step(1, 0)])))
        assert done.wait(5), "a first step batch waited to set the group's kind"
    assert out[0].status_code == 202
    assert ConsistencyGroup.objects.get(name=GROUP).kind == "training"


def test_a_batch_naming_a_new_group_does_not_wait_for_batches_of_the_existing_one(post_batch):
    assert post_batch(make_batch([_transition(1), _step(1, 0)])).status_code == 202
    other = {"kind": "step", "group": "g-new-job", "generation": 1, "rank": 0, "step": 0}
    with _row_lock("FOR KEY SHARE"):
        done, out = _in_thread(lambda: post_batch(make_batch([_step(1, 1), other])))
        assert done.wait(5), "creating a group upgraded the lock on the existing one"
    assert out[0].status_code == 202, out[0].content
    new = ConsistencyGroup.objects.get(name="g-new-job")
    assert (new.kind, new.generation) == ("training", 1)


def test_it_stores_the_schedulers_job_id_from_a_transition_or_a_process(post_batch):
    post_batch(make_batch([_transition(1, job="4242")]))
    assert ConsistencyGroup.objects.get(name=GROUP).scheduler_job == "4242"
    post_batch(make_batch([_step(1, 1)]))  # a batch without a job id keeps it
    assert ConsistencyGroup.objects.get(name=GROUP).scheduler_job == "4242"
    process = {"kind": "process", "group": GROUP, "generation": 1, "rank": 0,
               "event": "started", "job": "4343"}  # fmt: skip
    post_batch(make_batch([_transition(1), process]))
    assert ConsistencyGroup.objects.get(name=GROUP).scheduler_job == "4343"
