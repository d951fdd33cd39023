from __future__ import annotations

from datetime import timedelta

from console.diagnosis import UNDETERMINED, diagnose
from tests.diagnosis.factory import (
    T0,
    checkpoint,
    of_kind,
    process,
    snap,
    step,
    training,
    transition,
)


def _stop_rank(recs: list[dict], rank: int, after: int) -> list[dict]:
    return [
        r for r in recs if not (r["kind"] == "step" and r["rank"] == rank and r["step"] > after)
    ]


def test_it_reports_a_rank_silent_beyond_the_threshold_as_rank_hang() -> None:
    recs = _stop_rank(training(ranks=8, steps=100), rank=3, after=110)  # silent for 89 s
    d = diagnose(snap(recs), T0)
    assert [f.subject for f in of_kind(d, "rank_hang")] == ["rank:llama-70b/3"]


def test_it_does_not_call_a_rank_hung_within_the_floor() -> None:
    recs = _stop_rank(training(ranks=8), rank=3, after=117)
    d = diagnose(snap(recs), T0 + timedelta(seconds=30))
    assert of_kind(d, "rank_hang") == []


def test_it_scales_the_threshold_with_the_groups_own_step_time() -> None:
    # 40 s steps: 110 s of silence is over the 60 s floor but under 3 x 40 s.
    recs = _stop_rank(training(ranks=8, step_ms=40_000), rank=2, after=117)
    d = diagnose(snap(recs), T0 + timedelta(seconds=30))
    assert of_kind(d, "rank_hang") == []


def test_it_reports_all_ranks_silent_as_one_undetermined_group_stall() -> None:
    d = diagnose(snap(training(ranks=8)), T0 + timedelta(minutes=5))
    (stall,) = d.findings
    assert (stall.kind, stall.role) == ("group_stall", UNDETERMINED)
    assert "missing_evidence" in stall.evidence


def test_it_does_not_call_a_checkpointing_group_hung() -> None:
    recs = [*training(ranks=8), transition(T0 + timedelta(seconds=1), "running", "checkpointing")]
    d = diagnose(snap(recs, state="checkpointing"), T0 + timedelta(minutes=10))
    assert d.findings == ()


def test_it_does_not_call_a_quiescing_group_hung() -> None:
    d = diagnose(snap(training(ranks=8), state="quiescing"), T0 + timedelta(minutes=10))
    assert d.findings == ()


def test_it_trusts_a_checkpoint_phase_in_the_last_step() -> None:
    recs = training(ranks=4)
    for rk in range(4):
        recs.append(step(rk, 120, T0 + timedelta(seconds=1), phases={"checkpoint": 500.0}))
    d = diagnose(snap(recs), T0 + timedelta(minutes=10))
    assert d.findings == ()


def test_it_trusts_a_checkpoint_being_written_after_the_last_step() -> None:
    recs = [*training(ranks=4), checkpoint(T0 + timedelta(seconds=2), "ckpt-120", 120, "staging")]
    d = diagnose(snap(recs), T0 + timedelta(minutes=10))
    assert d.findings == ()


def test_it_calls_a_checkpoint_overrunning_its_grace_a_stall() -> None:
    recs = [*training(ranks=4), checkpoint(T0 + timedelta(seconds=2), "ckpt-120", 120, "staging")]
    d = diagnose(snap(recs), T0 + timedelta(hours=1))
    assert [f.kind for f in d.findings] == ["group_stall"]


def test_it_raises_nothing_during_a_quiet_warm_up_without_history() -> None:
    recs = [
        transition(T0, "initializing", "running"),
        *[process(rk, T0, "started") for rk in range(8)],
    ]
    d = diagnose(snap(recs), T0 + timedelta(minutes=20))
    assert d.findings == ()


def test_it_calls_a_warm_up_beyond_its_timeout_a_stall() -> None:
    recs = [
        transition(T0, "initializing", "running"),
        *[process(rk, T0, "started") for rk in range(8)],
    ]
    d = diagnose(snap(recs), T0 + timedelta(hours=1))
    assert [f.kind for f in d.findings] == ["group_stall"]


def test_it_leaves_a_finished_group_alone() -> None:
    d = diagnose(snap(training(ranks=4), state="completed"), T0 + timedelta(hours=2))
    assert d.findings == ()


def test_it_advises_against_auto_restart_while_a_stall_is_unexplained() -> None:
    d = diagnose(snap(training(ranks=8)), T0 + timedelta(minutes=5))
    assert d.recovery is not None and d.recovery.auto_restart_safe is False
    assert "cause undetermined" in d.recovery.reason
