from __future__ import annotations

from datetime import timedelta

from console.diagnosis import ROOT_CAUSE, SYMPTOM, UNDETERMINED, diagnose
from tests.diagnosis.factory import (
    T0,
    collective,
    device_event,
    entry,
    heartbeats,
    of_kind,
    process,
    rank_subject,
    snap,
    training,
)

NOW = T0 + timedelta(minutes=5)
WAIT = T0 + timedelta(seconds=1)


def _windows(
    ranks: int,
    *,
    absent: set[int] = frozenset(),
    odd: dict[int, dict] | None = None,
    last_state: str = "started",
) -> list[dict]:
    out = []
    for rk in range(ranks):
        ents = [entry(40 + i, "completed", T0 - timedelta(seconds=5 - i)) for i in range(5)]
        if rk not in absent:
            ents.append(entry(45, last_state, WAIT, **(odd or {}).get(rk, {})))
        out.append(collective(rk, NOW - timedelta(seconds=2), ents))
    return out


def _diag(recs: list[dict], ranks: int = 8):
    return diagnose(snap(recs, now=NOW, nodes=heartbeats(ranks, NOW)), NOW)


def test_it_blames_the_rank_whose_call_differs_from_the_majority() -> None:
    d = _diag([*training(ranks=8), *_windows(8, odd={6: {"dtype": "float32"}})])
    (m,) = of_kind(d, "collective_mismatch")
    assert (m.subject, m.role) == (rank_subject(6), ROOT_CAUSE)
    assert m.evidence["majority_call"]["dtype"] == "bfloat16"
    assert m.evidence["differs_in"] == ["dtype"]


def test_it_links_waits_at_a_mismatched_seq_to_the_mismatch() -> None:
    d = _diag([*training(ranks=8), *_windows(8, odd={6: {"op": "all_gather"}})])
    (m,) = of_kind(d, "collective_mismatch")
    waits = of_kind(d, "collective_timeout")
    assert len(waits) == 7 and all(w.caused_by == (m.id,) for w in waits)


def test_it_blocks_auto_restart_after_a_mismatch() -> None:
    d = _diag([*training(ranks=8), *_windows(8, odd={6: {"numel": 7}})])
    assert d.recovery is not None and d.recovery.auto_restart_safe is False


def test_it_links_waits_to_the_exit_of_the_rank_that_never_entered() -> None:
    recs = [
        *training(ranks=8),
        *_windows(8, absent={2}),
        process(
            2,
            T0 + timedelta(milliseconds=500),
            "exited",
            exit_code=1,
            reason="exception",
            error_type="RuntimeError",
        ),
    ]
    d = _diag(recs)
    (exc,) = of_kind(d, "exception")
    waits = of_kind(d, "collective_timeout")
    assert exc.role == ROOT_CAUSE and len(waits) == 7
    assert {w.caused_by for w in waits} == {(exc.id,)} and {w.role for w in waits} == {SYMPTOM}


def test_it_says_what_is_missing_when_nothing_explains_the_absent_rank() -> None:
    d = _diag([*training(ranks=8), *_windows(8, absent={2})])
    (suspect,) = of_kind(d, "rank_hang")
    waits = of_kind(d, "collective_timeout")
    assert suspect.role == UNDETERMINED and "missing_evidence" in suspect.evidence
    assert {w.role for w in waits} == {UNDETERMINED} and waits[0].caused_by == (suspect.id,)


def test_it_points_at_links_when_every_rank_entered_and_waits() -> None:
    d = _diag([*training(ranks=8), *_windows(8)])
    waits = of_kind(d, "collective_timeout")
    assert len(waits) == 8 and all(w.role == UNDETERMINED for w in waits)
    assert "links" in waits[0].evidence["missing_evidence"]


def test_it_ignores_waits_shorter_than_the_threshold() -> None:
    recs = [*training(ranks=8), *_windows(8, absent={2})]
    # Waiting 2 s for an unexplained rank stays under the 5 s floor: no story yet.
    d = diagnose(snap(recs, nodes=heartbeats(8, T0)), T0 + timedelta(seconds=3))
    assert of_kind(d, "collective_timeout") == []


def test_it_raises_nothing_when_every_collective_completed() -> None:
    recs = [*training(ranks=8), *_windows(8, last_state="completed")]
    d = diagnose(snap(recs, nodes=heartbeats(8, T0)), T0 + timedelta(seconds=3))
    assert d.findings == ()


def test_it_does_not_time_out_barrier_waits_while_a_checkpoint_is_written() -> None:
    recs = [*training(ranks=8), *_windows(8, absent={0})]
    d = diagnose(snap(recs, state="checkpointing", nodes=heartbeats(8, NOW)), NOW)
    assert d.findings == ()


def test_it_still_reports_a_mismatch_while_checkpointing() -> None:
    recs = [*training(ranks=8), *_windows(8, odd={6: {"dtype": "float32"}})]
    d = diagnose(snap(recs, state="checkpointing", nodes=heartbeats(8, NOW)), NOW)
    assert [f.kind for f in d.findings] == ["collective_mismatch"]


def test_it_folds_waits_under_an_explained_cause_at_once() -> None:
    """A rank lost its GPU one second ago: the others' waits are symptoms immediately."""
    recs = [
        *training(ranks=8),
        *_windows(8, absent={2}),
        device_event(2, WAIT, "xid", code=79),
    ]
    d = diagnose(snap(recs, nodes=heartbeats(8, T0)), WAIT + timedelta(seconds=1))
    roots = [f for f in d.findings if f.role == "root_cause"]
    assert [f.kind for f in roots] == ["xid"]
    waits = of_kind(d, "collective_timeout")
    assert len(waits) == 7
    assert all(f.caused_by == (roots[0].id,) for f in waits)
