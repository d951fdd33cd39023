"""A rank digest derived from the last one (the live state's slides) is the digest derived
from scratch, value for value (rules/digest.py)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from console.diagnosis.records import Phases, StepRecord
from console.diagnosis.rules import digest
from console.diagnosis.rules.digest import RankDigest, rank_digest, same_digest
from console.diagnosis.snapshot import RankState

T0 = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)


@st.composite
def step(draw: st.DrawFn) -> StepRecord:
    d = draw(st.one_of(st.none(), st.floats(0, 5000), st.just(float("nan"))))
    return StepRecord(
        ts=T0 + timedelta(seconds=draw(st.integers(0, 100))),
        generation=draw(st.sampled_from([1, 1, 1, 2])),
        step=draw(st.integers(0, 20)),
        duration_ms=d,
        phases=Phases(
            compute=draw(st.one_of(st.none(), st.floats(0, 3000))),
            collective=draw(st.one_of(st.none(), st.floats(0, 3000))),
        ),
        tokens=draw(st.sampled_from([None, 0, 7, 4096, 2.5, True])),
        loss=draw(st.sampled_from([None, 2.0, float("nan"), float("inf")])),
    )


# What happens to a rank's steps between two passes: the live state's slide (oldest
# dropped, newer appended), the same steps, another list altogether, a new generation.
op = st.one_of(
    st.tuples(st.just("slide"), st.integers(0, 3), st.lists(step(), max_size=4)),
    st.tuples(st.just("same"), st.just(0), st.just([])),
    st.tuples(st.just("other"), st.just(0), st.lists(step(), max_size=8)),
    st.tuples(st.just("generation"), st.just(0), st.just([])),
)


def _states(first: list[StepRecord], ops: list[tuple[str, int, list[StepRecord]]]) -> list:
    steps, gen = tuple(first), 1
    out = [RankState(rank=0, node=None, gpu=None, steps=steps, generation=gen)]
    for kind, cut, new in ops:
        if kind == "slide":
            steps = steps[cut:] + tuple(new)
        elif kind == "other":
            steps = tuple(new)
        elif kind == "generation":
            gen = 3 - gen
        out.append(RankState(rank=0, node=None, gpu=None, steps=steps, generation=gen))
    return out


def _check(states: list[RankState]) -> list[RankDigest]:
    prev: RankDigest | None = None
    got = []
    for r in states:
        d = rank_digest(r, prev)
        assert same_digest(d, rank_digest(r))
        assert d.cur == r.current_steps and d.win == r.current_steps[-digest.RECENT_STEPS :]
        if prev is not None and d is not prev and d.base == prev.serial:
            # The lineage the step totals follow: the old steps less the dropped (oldest
            # first), plus the added, are the new ones.
            assert prev.cur[: len(d.dropped)] == d.dropped
            assert prev.cur[len(d.dropped) :] + d.added == d.cur
        prev = d
        got.append(d)
    return got


@settings(max_examples=400, deadline=None)
@given(
    first=st.lists(step(), max_size=10),
    ops=st.lists(op, max_size=8),
    window=st.sampled_from([2, 3, 32]),
)
def test_a_slid_digest_is_a_scratch_digest(
    first: list[StepRecord], ops: list[Any], window: int
) -> None:
    # Short windows make the slides push steps out of the window as well as drop them.
    real = digest.RECENT_STEPS
    digest.RECENT_STEPS = window
    try:
        _check(_states(first, ops))
    finally:
        digest.RECENT_STEPS = real


def test_a_slide_reads_only_the_appended_steps() -> None:
    """The live shape: one step dropped, one appended; the digest is derived from the last
    one (lineage), and a state rebuilt with the very same steps reuses it."""
    steps = tuple(
        StepRecord(ts=T0 + timedelta(seconds=i), generation=1, step=i, duration_ms=1000.0 + i)
        for i in range(40)
    )
    a = RankState(rank=0, node=None, gpu=None, steps=steps[:33], generation=1)
    b = RankState(rank=0, node="n1", gpu=None, steps=steps[1:34], generation=1)
    c = RankState(rank=0, node="n2", gpu=None, steps=b.steps, generation=1)
    da, db, dc = _check([a, b, c])
    assert db.base == da.serial and db.dropped == steps[:1] and db.added == steps[33:34]
    assert db.cur is b.steps  # every step of the generation: no copy
    assert dc is db
    assert (
        db.means is not None and db.means[0] == sum(s.duration_ms or 0 for s in b.steps[-32:]) / 32
    )


def test_a_broken_slide_fails_the_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check above can fail: a slide that misses the dropped step."""
    steps = tuple(
        StepRecord(ts=T0 + timedelta(seconds=i), generation=1, step=i, duration_ms=1.0)
        for i in range(6)
    )
    states = [
        RankState(rank=0, node=None, gpu=None, steps=steps[:3], generation=1),
        RankState(rank=0, node=None, gpu=None, steps=steps[1:5], generation=1),
    ]
    real = digest.slide_cut
    monkeypatch.setattr(digest, "slide_cut", lambda old, new: max(0, real(old, new) - 1))
    with pytest.raises(AssertionError):
        _check(states)


@settings(max_examples=200, deadline=None)
@given(
    per_rank=st.lists(
        st.tuples(st.lists(step(), max_size=6), st.lists(op, min_size=3, max_size=3)),
        min_size=1,
        max_size=3,
    ),
    leave=st.lists(st.booleans(), min_size=4, max_size=4),
)
def test_step_totals_kept_between_passes_equal_a_recount(
    per_rank: list[tuple[list[StepRecord], list[Any]]], leave: list[bool]
) -> None:
    """The engine's per-step token totals follow each rank's digest lineage (the dropped
    and added steps) and swap whole ranks otherwise; with ranks leaving and coming back, and
    tokens that are not ints (a recount), they equal a count from scratch every pass."""
    from console.diagnosis import engine
    from console.diagnosis.config import DiagnosisConfig
    from console.diagnosis.rules.base import Context
    from console.diagnosis.snapshot import GroupSnapshot

    lives = [
        [replace(s, rank=rk) for s in _states(first, ops)]
        for rk, (first, ops) in enumerate(per_rank)
    ]
    memo: dict[str, Any] = {}
    for i in range(4):
        ranks = tuple(states[i] for rk, states in enumerate(lives) if not (leave[i] and rk == 0))
        snap = GroupSnapshot(group="g", kind="training", state="running", generation=1,
                             taken_at=T0, ranks=ranks)  # fmt: skip
        ctx = Context(snap, T0, DiagnosisConfig(), memo)
        live = ctx.slot("step_totals_live")
        assert live is not None
        want = engine._step_totals(Context(snap, T0, DiagnosisConfig()))
        assert repr(engine._live_step_totals(ctx, live)) == repr(want)


def test_a_live_states_slide_hint_is_taken_and_a_false_one_shows() -> None:
    """RankState.slid_from (the live state's word that the steps slid) spares the digest
    its check; the digest trusts it, so a false hint gives a wrong digest (which is why
    tests/diagnosis/test_live.py checks every hint LiveGroup gives)."""
    steps = tuple(
        StepRecord(ts=T0 + timedelta(seconds=i), generation=1, step=i, duration_ms=1.0 + i)
        for i in range(6)
    )
    a = RankState(rank=0, node=None, gpu=None, steps=steps[:4], generation=1)
    b = RankState(rank=0, node=None, gpu=None, steps=steps[1:5], generation=1,
                  slid_from=(a.steps, 1))  # fmt: skip
    da = rank_digest(a)
    db = rank_digest(b, da)
    assert db.base == da.serial and db.cut == 1 and same_digest(db, rank_digest(b))
    late = replace(steps[5], loss=float("nan"))  # a late step went in between, a NaN loss
    inserted = (*steps[:2], late, *steps[2:4])
    false = RankState(rank=0, node=None, gpu=None, steps=inserted, generation=1,
                      slid_from=(a.steps, 0))  # fmt: skip
    assert not same_digest(rank_digest(false, da), rank_digest(false))
    assert same_digest(rank_digest(replace(false, slid_from=None), da), rank_digest(false))
