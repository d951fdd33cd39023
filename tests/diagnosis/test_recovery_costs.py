"""The seed's five recovery costs: the one definition drills and incidents share."""

from __future__ import annotations

from console.diagnosis import recovery_costs as rc

T0 = 1_800_000_000.0


def _steps(gen: int, steps: range, *, at: float, ranks: int = 2, cursor_per_step: int = 2000):
    return [
        rc.StepPoint(
            ts=at + (s - steps.start),
            generation=gen,
            rank=r,
            step=s,
            tokens=1000,
            data_cursor=s * cursor_per_step,
        )
        for s in steps
        for r in range(ranks)
    ]


def _records(**kw):
    base = dict(
        generation=1,
        first_evidence=T0 + 25.5,
        detected=T0 + 27.0,
        steps=[*_steps(1, range(1, 26), at=T0 + 1), *_steps(2, range(21, 31), at=T0 + 36)],
        transitions=[
            rc.TransitionPoint(T0, 1, "running", "initializing", world_size=2),
            rc.TransitionPoint(T0 + 30, 1, "quiescing", "running"),
            rc.TransitionPoint(T0 + 31, 1, "recovering", "quiescing"),
            rc.TransitionPoint(T0 + 33, 2, "running", "recovering", world_size=2),
        ],
        checkpoints=[rc.CheckpointPoint(T0 + 20.5, "ckpt-20", 20, "verified", data_cursor=40000)],
        world_size=2,
    )
    base.update(kw)
    return rc.IncidentRecords(**base)


def test_the_five_costs_of_a_kill_restored_from_step_20():
    c = rc.recovery_costs(rc.marks_from_records(_records()))
    assert c.detection_s == 1.5
    assert c.quiesce_s == 3.0
    assert (c.resume_step, c.last_step, c.checkpoint) == (20, 25, "ckpt-20")
    assert c.lost_steps == 5 and c.lost_tokens == 5 * 2 * 1000
    assert c.lost_work_s == 5.0  # step 20 at T0+20, step 25 at T0+25
    assert c.lost_gpu_hours == round(5.0 * 2 / 3600, 6)
    assert c.restore_s == 3.0  # launched at T0+33, first step at T0+36
    assert c.repeated_steps == 5 and c.repeated_samples == 50000 - 40000
    assert c.downtime_s == 10.5
    assert c.numbers_held is True and c.complete is True and c.restarted is True
    assert c.slo_held is None  # nothing declared


def test_repeated_work_so_far_and_not_complete_until_caught_up():
    steps = [*_steps(1, range(1, 26), at=T0 + 1), *_steps(2, range(21, 24), at=T0 + 36)]
    c = rc.recovery_costs(rc.marks_from_records(_records(steps=steps)))
    assert c.repeated_steps == 3 and c.repeated_samples == 46000 - 40000
    assert c.complete is False


def test_a_nan_after_restore_means_the_numbers_did_not_hold():
    steps = [*_steps(1, range(1, 26), at=T0 + 1), *_steps(2, range(21, 31), at=T0 + 36)]
    steps[-1] = rc.StepPoint(steps[-1].ts, 2, 1, 30, 1000, 60000, valid=False)
    c = rc.recovery_costs(rc.marks_from_records(_records(steps=steps)))
    assert c.numbers_held is False


def test_without_a_restart_nothing_is_lost_yet_and_no_restore_is_measured():
    c = rc.recovery_costs(
        rc.marks_from_records(_records(transitions=[], steps=_steps(1, range(1, 26), at=T0)))
    )
    assert c.restarted is False
    assert c.lost_steps is None and c.restore_s is None and c.repeated_steps is None
    assert c.detection_s == 1.5 and c.quiesce_s is None


def test_the_resume_cursor_falls_back_to_the_restart_then_the_step_record():
    no_manifest = [rc.CheckpointPoint(T0 + 20.5, "ckpt-20", 20, "verified")]
    c = rc.recovery_costs(rc.marks_from_records(_records(checkpoints=no_manifest)))
    assert c.repeated_samples == 10000  # the step-20 record's cursor (40000)
    moved = [*_records().transitions[:3]]
    moved.append(rc.TransitionPoint(T0 + 33, 2, "running", "recovering", 2, data_cursor=44000))
    c = rc.recovery_costs(
        rc.marks_from_records(_records(checkpoints=no_manifest, transitions=moved))
    )
    assert c.repeated_samples == 50000 - 44000


def test_objectives_are_judged_when_declared():
    held = rc.recovery_costs(rc.marks_from_records(_records(rto_s=11.0, rpo_steps=5)))
    assert (held.rto_held, held.rpo_held, held.slo_held) == (True, True, True)
    missed = rc.recovery_costs(rc.marks_from_records(_records(rto_s=10.0, rpo_steps=10)))
    assert (missed.rto_held, missed.rpo_held, missed.slo_held) == (False, True, False)
    served = rc.recovery_costs(rc.marks_from_records(_records(slo_breached=True)))
    assert served.slo_held is False


def test_drill_marks_give_the_drill_definitions():
    """faultline drill fills Marks itself; the costs are its old arithmetic."""
    m = rc.Marks(
        first_evidence=100.0, detected=101.2, quiesced=101.9, restarted=105.0,
        first_valid_step=107.5, last_step=14, resume_step=10, redone_step=14,
        lost_tokens=4 * 2048 * 2, gpus=2,
    )  # fmt: skip
    c = rc.recovery_costs(m)
    assert (c.detection_s, c.quiesce_s, c.restore_s) == (1.2, 0.7, 2.5)
    assert (c.lost_steps, c.repeated_steps, c.lost_tokens) == (4, 4, 16384)


def test_one_restart_is_one_interruption_blamed_on_its_first_root_cause():
    from console.diagnosis.reliability import GroupSpan, Interruption, fleet_report

    def stop(n: int, gen: int, kind: str, layer: str) -> Interruption:
        return Interruption(n, "g", gen, kind, layer, T0 + n, True, total_lost_gpu_hours=1.0)

    report = fleet_report(
        [
            stop(1, 1, "xid", "gpu"),
            stop(2, 1, "process_exit", "software"),
            stop(3, 2, "oom", "software"),
        ],
        [GroupSpan("g", "training", 8, T0, T0 + 86400)],
        start=T0,
        end=T0 + 86400,
    )
    assert report["interruptions"] == 2 and report["other_incidents"] == 1
    assert [r["kind"] for r in report["by_cause"]] == ["oom", "xid"]
    assert report["ettr"] == round(1 - 2.0 / (8 * 24), 4)
