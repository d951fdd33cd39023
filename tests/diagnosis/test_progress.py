from __future__ import annotations

from datetime import timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from console.diagnosis import SYMPTOM, UNDETERMINED, DiagnosisConfig, diagnose
from console.diagnosis.rules import progress
from console.diagnosis.rules.base import Context
from tests.diagnosis.factory import (
    T0,
    checkpoint,
    collective,
    entry,
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


def _after_checkpoint_phase(ms: float) -> list[dict]:
    """Four ranks whose last step (at T0 + 1 s) carried a checkpoint phase of `ms`."""
    recs = training(ranks=4)
    for rk in range(4):
        recs.append(step(rk, 120, T0 + timedelta(seconds=1), phases={"checkpoint": ms}))
    return recs


def test_it_trusts_a_checkpoint_phase_in_the_last_step_within_its_measured_grace() -> None:
    # 500 ms save, the group's last checkpoint took 1 s: excused for max(2 x 1 s, 10 s).
    d = diagnose(snap(_after_checkpoint_phase(500.0)), T0 + timedelta(seconds=9))
    assert d.findings == ()


def test_it_names_a_rank_that_hangs_right_after_a_short_checkpoint_within_a_minute() -> None:
    # The old rule excused this for 30 minutes (checkpoint_grace_s): the hole the drills
    # found. Rank 2 stops after the checkpoint step; its peers wait for it in seq 121.
    recs = _after_checkpoint_phase(500.0)
    began = T0 + timedelta(seconds=1.2)
    for rk in range(4):
        state = "completed" if rk == 2 else "started"
        last = [entry(120, "completed", T0), *([] if rk == 2 else [entry(121, state, began)])]
        recs.append(collective(rk, T0 + timedelta(seconds=3), last))
    d = diagnose(snap(recs), T0 + timedelta(seconds=60))
    (hang,) = of_kind(d, "rank_hang")
    assert hang.subject == "rank:llama-70b/2"


def test_it_calls_all_ranks_silent_after_a_short_checkpoint_a_stall() -> None:
    d = diagnose(snap(_after_checkpoint_phase(500.0)), T0 + timedelta(minutes=10))
    (stall,) = of_kind(d, "group_stall")
    assert stall.evidence["checkpoint_grace_s"] == 10.0
    assert stall.evidence["checkpoint_measured_s"] == 1.0


def test_it_scales_the_grace_with_the_checkpoints_own_duration() -> None:
    # A 5-minute save: excused for 10 minutes, not for 30, not for 10 seconds.
    recs = _after_checkpoint_phase(300_000.0)
    assert diagnose(snap(recs), T0 + timedelta(minutes=9)).findings == ()
    assert of_kind(diagnose(snap(recs), T0 + timedelta(minutes=11)), "group_stall")


def test_it_caps_the_grace_at_checkpoint_grace_s() -> None:
    recs = _after_checkpoint_phase(3_600_000.0)  # an hour-long save: 2 h, capped at 30 min
    assert diagnose(snap(recs), T0 + timedelta(minutes=29)).findings == ()
    assert of_kind(diagnose(snap(recs), T0 + timedelta(minutes=31)), "group_stall")


def test_it_trusts_a_checkpoint_being_written_after_the_last_step() -> None:
    recs = [*training(ranks=4), checkpoint(T0 + timedelta(seconds=2), "ckpt-120", 120, "staging")]
    d = diagnose(snap(recs), T0 + timedelta(seconds=9))
    assert d.findings == ()


def test_it_calls_a_checkpoint_far_slower_than_the_last_one_a_stall() -> None:
    recs = [*training(ranks=4), checkpoint(T0 + timedelta(seconds=2), "ckpt-120", 120, "staging")]
    d = diagnose(snap(recs), T0 + timedelta(minutes=10))
    assert [f.kind for f in d.findings] == ["group_stall"]


def test_it_trusts_an_unmeasured_first_checkpoint_up_to_the_cap() -> None:
    recs = training(ranks=4, with_checkpoint=False)
    recs.append(checkpoint(T0 + timedelta(seconds=2), "ckpt-120", 120, "staging"))
    recs[-1]["duration_ms"] = None
    assert diagnose(snap(recs), T0 + timedelta(minutes=10)).findings == ()


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


# -- a group stall beside its located cause (docs/drills.md item 10) ----------------------


def _waits_for_rank_1(ranks: int) -> list[dict]:
    """Every rank's last step at T0; rank 0 then entered seq 121 at T0 + 0.5 s and waits
    (its watchdog reported it); rank 1 never entered (hung in its compute phase)."""
    recs = training(ranks=ranks)
    recs.append(
        collective(
            0,
            T0 + timedelta(seconds=2.5),
            [entry(120, "completed", T0 - timedelta(seconds=0.5)),
             entry(121, "started", T0 + timedelta(seconds=0.5))],
        )
    )  # fmt: skip
    recs.append(collective(1, T0 + timedelta(seconds=0.2), [entry(120, "completed", T0)]))
    return recs


def test_it_waits_for_the_collective_verdict_instead_of_paging_a_stall_first() -> None:
    # 4.3 s after the last step every rank is silent past the 4 s floor, but rank 0 has
    # waited only 3.8 s in a call it entered after that step: not yet the collectives
    # rule's timeout. The old rule paged an undetermined group_stall here, and the
    # rank_hang a moment later opened beside it: two stories for one hang.
    early = diagnose(snap(_waits_for_rank_1(2)), T0 + timedelta(seconds=4.3))
    assert early.findings == ()
    later = diagnose(snap(_waits_for_rank_1(2)), T0 + timedelta(seconds=4.8))
    (hang,) = of_kind(later, "rank_hang")
    assert hang.subject == "rank:llama-70b/1" and of_kind(later, "group_stall") == []


def test_it_files_a_stall_as_a_symptom_of_the_rank_hang_that_explains_it() -> None:
    # Rank 2 is in another process group and reports no wait: the stall still has a
    # located cause (rank 1, which rank 0 waits for), so it is that cause's symptom.
    recs = _waits_for_rank_1(3)
    recs.append(collective(2, T0, [entry(50, "completed", T0 - timedelta(seconds=0.5), pg="1")]))
    d = diagnose(snap(recs), T0 + timedelta(seconds=5))
    (hang,) = of_kind(d, "rank_hang")
    (stall,) = of_kind(d, "group_stall")
    assert hang.subject == "rank:llama-70b/1"
    assert (stall.role, stall.caused_by) == (SYMPTOM, (hang.id,))
    assert [f.kind for f in d.findings if f.role != SYMPTOM] == ["rank_hang", "collective_timeout"]


def test_ranks_that_keep_entering_calls_without_stepping_still_stall() -> None:
    # A fresh `started` call every few seconds but no step for 9 s (> 2 x the 4 s floor):
    # held back no longer; nothing locates it, so it is the honest undetermined stall.
    recs = training(ranks=2)
    fresh = T0 + timedelta(seconds=7)
    for rk in (0, 1):
        recs.append(collective(rk, fresh, [entry(130, "started", fresh)]))
    d = diagnose(snap(recs), T0 + timedelta(seconds=9))
    (stall,) = of_kind(d, "group_stall")
    assert stall.role == UNDETERMINED


def test_a_stall_with_no_collective_evidence_stays_undetermined() -> None:
    d = diagnose(snap(training(ranks=2)), T0 + timedelta(seconds=4.3))
    (stall,) = d.findings
    assert (stall.kind, stall.role, stall.caused_by) == ("group_stall", UNDETERMINED, ())


def test_a_big_groups_step_time_is_read_from_every_kth_rank(monkeypatch: Any) -> None:
    """Past DURATION_RANKS ranks the stall threshold's median and MAD come from every k-th
    rank (a 16k-rank pass sorted 520k durations); a group at or under the cap
    reads every rank. Ranks 1 and 3 are slow here so the two readings differ."""
    from console.diagnosis.config import DiagnosisConfig
    from console.diagnosis.rules import base

    recs = []
    for rk in range(4):
        d = 9000.0 if rk % 2 else 1000.0
        recs += [step(rk, i, T0 - timedelta(seconds=30 - i), duration_ms=d) for i in range(5)]
    s = snap(recs)
    assert base.Context(s, T0, DiagnosisConfig()).median_duration_s == 5.0  # all four
    monkeypatch.setattr(base, "DURATION_RANKS", 2)
    ctx = base.Context(s, T0, DiagnosisConfig())
    assert ctx.median_duration_s == 1.0  # ranks 0 and 2
    assert len(ctx.recent_durations_s) == 10


def test_it_names_the_moment_a_silent_rank_crosses_its_threshold() -> None:
    # Rank 3 stopped two steps before the others: nothing is hung yet, and the pass says
    # when rank 3's silence becomes a hang with no new record (the pipeline's next check).
    s = snap(_stop_rank(training(ranks=8), rank=3, after=117))
    first = diagnose(s, T0 + timedelta(seconds=1))
    assert of_kind(first, "rank_hang") == []
    assert first.next_check is not None and first.next_check > T0 + timedelta(seconds=1)
    just_before = diagnose(s, first.next_check - timedelta(milliseconds=1))
    assert of_kind(just_before, "rank_hang") == []
    assert just_before.next_check == first.next_check
    just_after = diagnose(s, first.next_check + timedelta(milliseconds=1))
    assert [f.subject for f in of_kind(just_after, "rank_hang")] == ["rank:llama-70b/3"]
    # The next moment is the other ranks' (they stopped two steps later), then none.
    assert just_after.next_check is not None
    assert just_after.next_check - first.next_check == timedelta(seconds=2)
    everyone = diagnose(s, just_after.next_check + timedelta(milliseconds=1))
    assert of_kind(everyone, "group_stall") and everyone.next_check is None


def test_a_group_in_warm_up_is_due_when_its_warm_up_ends() -> None:
    recs = [r for r in training(ranks=4) if r["kind"] != "step"]
    d = diagnose(snap(recs), T0 + timedelta(seconds=5))
    assert d.findings == () and d.next_check is not None
    stalled = diagnose(snap(recs), d.next_check + timedelta(milliseconds=1))
    assert of_kind(stalled, "group_stall")


def test_a_minor_finding_elsewhere_does_not_explain_a_stall() -> None:
    """An informational Xid (63: a row remapped, on a healthy GPU) is a minor root cause
    that stops nothing: the stall stays undetermined, not its symptom (it was: any root
    cause of a stopping kind anywhere in the group explained a stall, minor or not)."""
    from tests.diagnosis.factory import device_event

    for code in (63, 92):
        recs = [*training(ranks=8), device_event(2, T0 + timedelta(seconds=1), "xid", code)]
        d = diagnose(snap(recs), T0 + timedelta(seconds=60))
        (stall,) = of_kind(d, "group_stall")
        assert (stall.role, stall.caused_by) == (UNDETERMINED, ()), code


def _stalled_by_loop(ctx: Any, thr: float) -> tuple[list[Any], Any, int]:
    """The rule's loop over every rank, as it was before the bisection (the reference)."""
    stalled, soonest, deferred = [], None, 0
    lagging = ctx.lagging_nodes
    for r in ctx.snap.ranks:
        last = ctx.last_progress(r)
        delivered = lagging.get(r.node or "")
        judged_at = ctx.now if delivered is None else delivered
        if last is None or (judged_at - last).total_seconds() > thr:
            stalled.append((r.rank, last))
        elif delivered is not None and (ctx.now - last).total_seconds() > thr:
            deferred += 1
        elif soonest is None or last < soonest:
            soonest = last
    return stalled, soonest, deferred


@settings(max_examples=300, deadline=None)
@given(
    ranks=st.lists(
        st.tuples(
            st.one_of(st.none(), st.integers(0, 40_000)),  # last step, ms before T0 (None: none)
            st.sampled_from([None, "n0", "n1", "n2"]),  # its node
            st.booleans(),  # a process started record (progress without a step)
        ),
        min_size=1,
        max_size=12,
    ),
    beats=st.lists(st.integers(0, 40_000), min_size=3, max_size=3),  # ms before T0 per node
    thr=st.sampled_from([0.5, 4.0, 7.25, 20.0]),
    later=st.integers(0, 20_000),
)
def test_stalled_ranks_by_bisection_are_the_loops(
    ranks: list[Any], beats: list[int], thr: float, later: int
) -> None:
    """`progress._stalled` (the ranks ordered by progress, bisected; kept between passes
    in the memo) finds what the loop over every rank finds, with nodes lagging or not,
    and again on a later pass in which no rank changed."""
    recs: list[dict[str, Any]] = []
    for rk, (ago, node, started) in enumerate(ranks):
        if started:
            recs.append(process(rk, T0 - timedelta(seconds=50), "started", node=node))
        if ago is not None:
            recs.append(step(rk, 1, T0 - timedelta(milliseconds=ago), node=node))
    nodes = {f"n{i}": T0 - timedelta(milliseconds=ms) for i, ms in enumerate(beats)}
    s = snap(recs, nodes=nodes)
    memo: dict[str, Any] = {}
    for now in (T0, T0 + timedelta(milliseconds=later)):
        ctx = Context(s, now, DiagnosisConfig(), memo)
        assert progress._stalled(ctx, thr) == _stalled_by_loop(ctx, thr)
