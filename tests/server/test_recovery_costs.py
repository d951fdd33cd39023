"""An incident's five recovery costs, replayed through ingest, equal the hand-computed ones.

The job: 2 ranks on one node, a verified checkpoint at step 20 whose manifest names the
data cursor, rank 1 killed after step 25, the launcher quiesces, recovers, and launches
generation 2 from step 20; generation 2 redoes steps 21..30. Every record goes through
POST /api/v1/ingest; the incident is opened and resolved by the real pipeline, and the
beat task's run measures the costs (console.queries.recovery) and stores them
(console.actions).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.core.cache import cache

from console import pipeline
from console.models import AuditLog, Incident
from tests.conftest import iso, make_batch

pytestmark = pytest.mark.django_db

GROUP, NODE = "train-rc", "node-rc"
TOKENS, CURSOR_PER_STEP = 1000, 2000  # per rank-step; the cursor is global (both ranks)


def _step(gen: int, rank: int, step: int, ts: datetime) -> dict:
    return {
        "kind": "step", "group": GROUP, "generation": gen, "rank": rank, "step": step,
        "tokens": TOKENS, "data_cursor": step * CURSOR_PER_STEP, "duration_ms": 1000.0,
        "loss": 2.0, "ts": iso(ts),
    }  # fmt: skip


def _transition(gen: int, frm: str | None, to: str, ts: datetime, **kw) -> dict:
    rec = {"kind": "transition", "group": GROUP, "generation": gen, "to_state": to,
           "world_size": 2, "ts": iso(ts), **kw}  # fmt: skip
    if frm:
        rec["from_state"] = frm
    return rec


def _ckpt(phase: str, ts: datetime) -> dict:
    return {
        "kind": "checkpoint", "group": GROUP, "generation": 1, "checkpoint_id": "ckpt-20",
        "step": 20, "phase": phase, "ts": iso(ts),
        "manifest": {"shards": [{"path": "s0.bin", "bytes": 10, "sha256": "0" * 64}],
                     "total_bytes": 10,
                     "format": "manifest"},
        "data_cursor": 20 * CURSOR_PER_STEP,
    }  # fmt: skip


def test_the_five_costs_of_a_replayed_kill_equal_the_hand_computed_ones(post_batch, client, cast):
    t0 = (datetime.now(UTC) - timedelta(seconds=150)).replace(microsecond=0)
    at = lambda s: t0 + timedelta(seconds=s)  # noqa: E731
    # Sent now, so ingest keeps each record's own time (it shifts a skewed agent's clock).
    send = lambda recs, s: post_batch(make_batch(recs, node=NODE))  # noqa: E731

    procs = [
        {"kind": "process", "group": GROUP, "generation": 1, "rank": r, "event": "started",
         "pid": 100 + r, "gpu": f"GPU-rc-{r}", "ts": iso(at(0))}
        for r in range(2)
    ]  # fmt: skip
    # The launcher declares its objectives: the costs judge them.
    declared = {"rto_s": 5, "rpo_steps": 10}
    start = _transition(1, "initializing", "running", at(0), objectives=declared)
    assert send([start, *procs], 0).status_code == 202
    steps = [_step(1, r, s, at(s)) for s in range(1, 26) for r in range(2)]
    ckpts = [_ckpt("committed", at(20.5)), _ckpt("verified", at(21))]
    assert send([*steps, *ckpts], 25).status_code == 202
    exit_at = at(25.5)
    killed = {"kind": "process", "group": GROUP, "generation": 1, "rank": 1, "event": "exited",
              "pid": 101, "gpu": "GPU-rc-1", "exit_code": 137, "signal": 9, "reason": "killed",
              "ts": iso(exit_at)}  # fmt: skip
    assert send([killed], 26).status_code == 202
    detected_at = at(27)
    pipeline.diagnose(group_name=GROUP, now=detected_at)
    (incident,) = Incident.objects.filter(group__name=GROUP).exclude(role="symptom")
    assert incident.timeline["first_evidence"] == exit_at.isoformat()
    assert incident.timeline["detected"] == detected_at.isoformat()

    # The launcher quiesces, recovers, and relaunches from the step-20 checkpoint.
    send([_transition(1, "running", "quiescing", at(30)),
          _transition(1, "quiescing", "recovering", at(31))], 31)  # fmt: skip
    restart = _transition(2, "recovering", "running", at(33), restart_count=1)
    assert send([restart], 33).status_code == 202
    redo = [_step(2, r, s, at(36 + s - 21)) for s in range(21, 31) for r in range(2)]
    assert send(redo, 46).status_code == 202
    for s in (47, 48 + 16):  # settle clock starts, then runs out: resolved
        pipeline.diagnose(group_name=GROUP, now=at(s))
    incident.refresh_from_db()
    assert incident.state == "resolved"
    assert not incident.costs  # a diagnosis pass waits for no accounting
    pipeline.forget_recent()
    pipeline.measure_recovery(now=at(65))  # beat's console.measure_recovery_costs
    incident.refresh_from_db()

    # By hand, from the records above.
    gpus = 2
    want = {
        "detection_s": 27 - 25.5,
        "quiesce_s": 30 - 27,
        "lost_steps": 25 - 20,
        "lost_tokens": (25 - 20) * gpus * TOKENS,
        "lost_work_s": 25 - 20,  # step 20 finished at t0+20, step 25 at t0+25
        "lost_gpu_hours": round((25 - 20) * gpus / 3600, 6),
        "restore_s": 36 - 33,  # generation 2 launched at t0+33, first valid step at t0+36
        "repeated_steps": 25 - 20,
        "repeated_samples": 25 * CURSOR_PER_STEP - 20 * CURSOR_PER_STEP,
        "downtime_s": 36 - 25.5,
        "checkpoint": "ckpt-20",
        "numbers_held": True,
        "restarted": True,
        "complete": True,
        # Objectives in force (the launcher's): down 10.5 s > RTO 5 s; lost 5 steps <= 10.
        "rto_s": 5.0,
        "rto_held": False,
        "rpo_steps": 10,
        "rpo_held": True,
        "slo_held": False,
    }
    got = {k: incident.costs.get(k) for k in want}
    assert got == want
    audited = AuditLog.objects.filter(verb="incident.costs_measured", object_id=str(incident.pk))
    assert audited.count() == 1

    # The incident REST and page show the same figures.
    client.force_login(cast["viewer"])
    body = client.get(f"/api/v1/incidents/{incident.pk}/").json()
    assert {k: body["costs"].get(k) for k in want} == want
    page = client.get(f"/incidents/{incident.pk}/").content.decode()
    assert 'id="recovery-costs"' in page and "ckpt-20" in page


def test_a_resolved_incidents_costs_are_measured_at_most_every_half_minute(monkeypatch):
    """Each measurement aggregates the steps lost and redone (bench/recovery_costs.py): runs
    a second apart measure an unfinished incident once per MEASURE_EVERY, whichever worker
    process runs them (the times are shared through the cache), one run at a time."""
    from types import SimpleNamespace

    calls: list[int] = []
    incident = SimpleNamespace(pk=987654)
    monkeypatch.setattr(pipeline.recovery, "to_measure", lambda group, now: [incident])
    monkeypatch.setattr(pipeline.recovery, "measure", lambda i: calls.append(i.pk))
    pipeline.forget_recent()
    t0 = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
    for s in range(0, 61):  # a run a second for a minute
        pipeline.measure_recovery(group_name="g", now=t0 + timedelta(seconds=s))
    assert calls == [987654] * 3  # at 0, 30 and 60 s
    # Another process's run is under way: this one does nothing.
    assert cache.add(pipeline.RUN_KEY, 1, timeout=60)
    assert pipeline.measure_recovery(now=t0 + timedelta(seconds=95)) is False
    assert calls == [987654] * 3
    cache.delete(pipeline.RUN_KEY)
    assert pipeline.measure_recovery(now=t0 + timedelta(seconds=95)) is True
    assert len(calls) == 4
    pipeline.forget_recent()
    pipeline.measure_recovery(group_name="g", now=t0 + timedelta(seconds=96))
    assert len(calls) == 5


def test_a_pass_measures_for_its_budget_and_the_next_goes_on_with_the_rest(monkeypatch):
    """A restart resolves every incident of the failed generation at once. Measured in
    one pass, 128 of them held a 16k-rank group's diagnosis for 96 s (bench/detect.py):
    a pass measures for MEASURE_BUDGET_S, the least recently measured first."""
    from types import SimpleNamespace

    clock = [0.0]
    calls: list[int] = []
    incidents = [SimpleNamespace(pk=pk) for pk in range(100, 110)]

    def measure(incident):
        clock[0] += 0.2  # each measurement costs 0.2 s
        calls.append(incident.pk)

    monkeypatch.setattr(pipeline, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    monkeypatch.setattr(pipeline, "MEASURE_BUDGET_S", 0.5)
    monkeypatch.setattr(pipeline.recovery, "to_measure", lambda group, now: list(incidents))
    monkeypatch.setattr(pipeline.recovery, "measure", measure)
    pipeline.forget_recent()
    t0 = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
    per_pass = []
    for s in range(6):
        before = len(calls)
        pipeline.measure_recovery(group_name="g", now=t0 + timedelta(seconds=s))
        per_pass.append(len(calls) - before)
    assert per_pass == [3, 3, 3, 1, 0, 0]  # 0.6 s spent stops a pass; then nothing is due
    assert sorted(calls) == [inc.pk for inc in incidents]  # each once, none left behind
    # Due again after MEASURE_EVERY: the least recently measured go first.
    pipeline.measure_recovery(group_name="g", now=t0 + timedelta(seconds=31))
    assert calls[-3:] == [100, 101, 102]
    pipeline.forget_recent()


@pytest.mark.parametrize("case", ["checkpointed", "no_checkpoint_record", "redo_invalid_at_first"])
def test_a_long_jobs_costs_come_from_the_interruption_not_the_window(post_batch, case):
    """The costs read the failed generation's steps from its resume step on and the
    restored generation's until it caught up (bench/recovery_costs.py: the window is every
    rank's every step for hours), and come out as by hand: with the checkpoint's records
    (its step looked up just before them) or without (looked up in the window); a NaN
    after the catch-up is no longer the recovery's; a redo whose first steps were all
    invalid restores at its first valid step, wherever that lies."""
    from console.models import ConsistencyGroup
    from console.queries import recovery

    t0 = (datetime.now(UTC) - timedelta(seconds=1000)).replace(microsecond=0)
    at = lambda s: t0 + timedelta(seconds=s)  # noqa: E731
    send = lambda recs: post_batch(make_batch(recs, node=NODE))  # noqa: E731
    redo_at = lambda s: at(660 + 30 + 10 * (s - 50))  # noqa: E731  generation 2's step s

    start = _transition(1, "initializing", "running", at(0))
    failed = [_step(1, r, s, at(10 * s)) for s in range(1, 61) for r in range(2)]
    saved = []
    if case != "no_checkpoint_record":
        for phase, dt in (("committed", 3), ("verified", 4)):
            rec = _ckpt(phase, at(500 + dt))
            rec.update(checkpoint_id="ckpt-50", step=50, data_cursor=50 * CURSOR_PER_STEP)
            saved.append(rec)
    assert send([start, *failed, *saved]).status_code == 202
    stops = [_transition(1, "running", "quiescing", at(615)),
             _transition(1, "quiescing", "recovering", at(620)),
             _transition(2, "recovering", "running", at(660), restart_count=1)]  # fmt: skip
    redo = []
    for s in range(51, 91):
        for r in range(2):
            rec = _step(2, r, s, redo_at(s))
            invalid = s == 80 or (case == "redo_invalid_at_first" and s <= 65)
            if invalid:
                rec["loss"] = "NaN"
            redo.append(rec)
    assert send([*stops, *redo]).status_code == 202
    group = ConsistencyGroup.objects.get(name=GROUP)
    incident = Incident.objects.create(
        group=group, generation=1, fingerprint="long", kind="process_exit",
        subject=f"rank:{GROUP}/1", severity="major", summary="rank 1 exited",
        state="resolved", opened_at=at(607), resolved_at=at(660),
        timeline={"first_evidence": at(605).isoformat(), "detected": at(607).isoformat()},
    )  # fmt: skip

    costs = recovery.measure(incident)
    assert costs is not None
    first_valid = 66 if case == "redo_invalid_at_first" else 51
    want = {
        "lost_steps": 10,
        "lost_tokens": 10 * 2 * TOKENS,
        "lost_work_s": 100.0,  # step 50 finished at t0+500, step 60 at t0+600
        "repeated_steps": 10,
        "repeated_samples": 10 * CURSOR_PER_STEP,
        "restore_s": (redo_at(first_valid) - at(660)).total_seconds(),
        "last_step": 60,
        "resume_step": 50,
        "checkpoint": None if case == "no_checkpoint_record" else "ckpt-50",
        "numbers_held": case != "redo_invalid_at_first",  # step 80's NaN is after catch-up
        "complete": True,
    }
    assert {k: costs.get(k) for k in want} == want
