"""What the rules read of one rank's steps, derived once per `RankState`.

Owns `RankDigest`: a rank's steps of the active generation, its recent window (the newest
`RECENT_STEPS` of them), the window's per-step columns (step time, each phase, a
non-finite loss) and the values derived from them (the straggler means, the recent step
times of the stall threshold). Several rules used to walk every rank's recent steps for
these, each its own way; at 16k ranks, in a pass after every rank stepped, that walk was
most of the pass.

`rank_digest(r, prev)` derives a digest from `r` alone. Given the digest of the rank's
previous state (the engine's memo keeps it), it reads only what changed when the new
steps are the old ones with the oldest dropped and newer ones appended (the live state's
shape): the columns are carried over and the appended steps alone are read. Sums are
still taken over the whole window, in step order, so every value is the float a digest
built from scratch gives (exact float sums forbid subtracting the dropped step). Any other
change is derived from scratch. Must not depend on anything but the rank's steps and
generation: a digest is reused for any `RankState` with the same steps.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import count
from math import isfinite
from operator import attrgetter
from typing import Any

from console.diagnosis.records import StepRecord
from console.diagnosis.snapshot import RankState

__all__ = ["RECENT_STEPS", "RankDigest", "rank_digest", "slide_cut"]

RECENT_STEPS = 32  # the window the rules judge a rank's recent steps by

_serials = count(1)

_Means = tuple[float, dict[str, float]]


def _bad_loss(s: StepRecord) -> bool:
    loss = s.loss
    return loss is not None and not isfinite(loss)


class RankDigest:
    """One rank's steps as the rules read them; see the module docstring. Read-only once
    built (digests are shared between passes and between ranks' unchanged states)."""

    __slots__ = (
        "_durations_s",
        "added",
        "bad",
        "base",
        "cols",
        "cur",
        "cut",
        "dropped",
        "gen",
        "inexact",
        "means",
        "serial",
        "steps",
        "timed",
        "untimed",
        "win",
    )

    steps: tuple[StepRecord, ...]  # the RankState's steps it was derived from
    gen: int  # the RankState's generation
    cur: tuple[StepRecord, ...]  # steps of the generation, oldest first
    win: tuple[StepRecord, ...]  # cur[-RECENT_STEPS:]
    untimed: int  # steps of `win` without a duration
    bad: int  # steps of `win` with a NaN or infinite loss
    inexact: int  # steps of `cur` whose tokens are not an int (totals would not be exact)
    means: _Means | None  # (mean step ms, mean ms per phase) over `win`'s timed steps
    timed: tuple[float, ...]  # the durations of `win`'s timed steps, oldest first
    # (durations, then each phase in PHASES order) of `win`'s timed steps, oldest first
    cols: tuple[tuple[float, ...], ...]
    # Lineage for incremental consumers (the engine's step totals): `serial` names this
    # digest; `base` the digest it was slid from (0: derived from scratch), `dropped` and
    # `added` the steps of `cur` that left and joined since then.
    serial: int
    base: int
    dropped: tuple[StepRecord, ...]
    added: tuple[StepRecord, ...]
    cut: int  # how many of the base digest's steps (any generation) were dropped
    _durations_s: list[float] | None

    @property
    def last(self) -> StepRecord | None:
        return self.cur[-1] if self.cur else None

    def durations_s(self) -> list[float]:
        """The recent steps' durations in seconds, oldest first (stall threshold)."""
        out = self._durations_s
        if out is None:
            out = self._durations_s = list(map(_PER_1000, self.timed))  # d / 1000.0, in C
        return out

    def nan_steps(self) -> list[StepRecord]:
        """The recent steps whose loss is NaN or infinite, oldest first."""
        return [s for s in self.win if _bad_loss(s)] if self.bad else []


_ROW = attrgetter("row")
_PER_1000 = (1000.0).__rtruediv__  # x -> x / 1000.0


def _means(d: RankDigest, prev: RankDigest | None = None, shift: int = 0) -> None:
    """`d.means`: mean step time and mean per phase over the window's steps that have a
    duration (a phase a step did not report counts 0), each sum over the steps in window
    order, in C loops over the window's columns (the straggler statistics' cost at 16k
    ranks); `d.timed`, those steps' durations in order; `d.cols`, the columns.

    `prev`: the digest `d` slid from, whose window lost its `shift` oldest steps, every
    step of both windows timed: its columns less those, plus the new steps' (the same
    tuples a build from the rows gives, without walking 32 rows per rank)."""
    c: tuple[tuple[float, ...], ...] | list[tuple[float, ...]]
    if prev is not None and prev.cols:
        new = d.win[max(0, len(prev.win) - shift) :]
        if not new:
            c = tuple([col[shift:] for col in prev.cols])
        elif len(new) == 1:
            row: Any = new[0].row  # every step timed: the caller checked
            c = tuple([(*col[shift:], v) for col, v in zip(prev.cols, row, strict=True)])
        else:
            add = list(zip(*map(_ROW, new), strict=True))
            c = tuple([col[shift:] + a for col, a in zip(prev.cols, add, strict=True)])
    else:
        rows = list(map(_ROW, d.win))
        if d.untimed:
            rows = [x for x in rows if x is not None]
        if not rows:
            d.means, d.timed, d.cols = None, (), ()
            return
        c = tuple(zip(*rows, strict=True))
    n = len(c[0])
    if not n:
        d.means, d.timed, d.cols = None, (), ()
        return
    d.cols = c
    d.timed = c[0]
    d.means = (
        sum(c[0]) / n,
        {
            "compute": sum(c[1], 0.0) / n,
            "collective": sum(c[2], 0.0) / n,
            "input": sum(c[3], 0.0) / n,
            "checkpoint": sum(c[4], 0.0) / n,
            "optimizer": sum(c[5], 0.0) / n,
        },
    )


def _untimed(steps: Iterable[StepRecord]) -> int:
    return sum([1 for s in steps if s.duration_ms is None])


def _bad(steps: Iterable[StepRecord]) -> int:
    return sum([1 for s in steps if _bad_loss(s)])


def _inexact(steps: Iterable[StepRecord]) -> int:
    return sum([1 for s in steps if type(s.tokens or 0) is not int])


def _scratch(r: RankState) -> RankDigest:
    d = RankDigest()
    d.steps = r.steps
    d.gen = r.generation
    cur = d.cur = r.current_steps
    win = d.win = cur[-RECENT_STEPS:]
    d.untimed = _untimed(win)
    d.bad = _bad(win)
    d.inexact = _inexact(cur)
    _means(d)
    d.serial = next(_serials)
    d.base = d.cut = 0
    d.dropped = d.added = ()
    d._durations_s = None
    return d


def slide_cut(old: tuple[StepRecord, ...], new: tuple[StepRecord, ...]) -> int:
    """How many of `old`'s oldest steps `new` dropped, when `new` is `old` with its oldest
    steps dropped and newer ones appended; -1 when it is not."""
    first = new[0]
    if old[0] is first:
        cut = 0
    elif len(old) > 1 and old[1] is first:
        cut = 1  # one step dropped: the live state's shape once its window is full
    else:
        cut = next((i for i, s in enumerate(old) if s is first), -1)
        if cut < 0:
            return -1
    kept = len(old) - cut
    if kept > len(new) or old[cut:] != new[:kept]:  # element identity first: C speed
        return -1
    return cut


def rank_digest(r: RankState, prev: RankDigest | None = None) -> RankDigest:
    """`r`'s digest; `prev`, the digest of an earlier state of the same rank, lets what
    both share be carried over. Same values either way."""
    if prev is None or prev.gen != r.generation or not prev.steps or not r.steps:
        return _scratch(r)
    old, new = prev.steps, r.steps
    if new is old:
        return prev  # a state rebuilt with the same steps (a new node, a new window)
    hint = r.slid_from  # the live state says how these steps follow the old ones
    cut = hint[1] if hint is not None and hint[0] is old else slide_cut(old, new)
    if cut < 0:
        return _scratch(r)
    g = r.generation
    appended = new[len(old) - cut :]
    same = prev.cur is old
    for s in appended:  # a loop, not all(<generator>): one step a pass
        if s.generation != g:
            same = False
            break
    if same:
        # Every step of the generation (the common case): `cur` is the steps themselves.
        dropped, added, cur = old[:cut], appended, new
    else:
        dropped = tuple([s for s in old[:cut] if s.generation == g])
        added = tuple([s for s in appended if s.generation == g])
        cur = prev.cur[len(dropped) :] + added
        if len(cur) == len(new):
            cur = new
    d = RankDigest()
    d.steps = new
    d.gen = g
    d.serial = next(_serials)
    d.base = prev.serial
    d.cut = cut
    d.dropped = dropped
    d.added = added
    if not dropped and not added:  # only other generations' steps moved
        d.cur, d.win, d.means, d.timed = prev.cur, prev.win, prev.means, prev.timed
        d.cols = prev.cols
        d.untimed, d.bad, d.inexact = prev.untimed, prev.bad, prev.inexact
        d._durations_s = prev._durations_s
        return d
    d.cur = cur
    win = d.win = cur[-RECENT_STEPS:]
    # How many of the old window's oldest steps left it: the dropped ones, and those the
    # appended ones pushed out once `cur` is longer than the window.
    shift = len(dropped) + max(0, len(cur) - RECENT_STEPS) - max(0, len(prev.cur) - RECENT_STEPS)
    untimed, bad, inexact = prev.untimed, prev.bad, prev.inexact
    if untimed or bad:  # what left the window takes its flags with it
        left = prev.win[:shift]
        untimed -= _untimed(left)
        bad -= _bad(left)
    if inexact:
        inexact -= _inexact(dropped)
    for s in win[max(0, len(prev.win) - shift) :]:  # the steps new to the window
        if s.duration_ms is None:
            untimed += 1
        loss = s.loss
        if loss is not None and not isfinite(loss):
            bad += 1
    for s in added:
        if type(s.tokens or 0) is not int:
            inexact += 1
    d.untimed, d.bad, d.inexact = untimed, bad, inexact
    # Every step of both windows timed (the common case): slide the columns.
    _means(d, prev if not untimed and not prev.untimed else None, shift)
    d._durations_s = None
    return d


def same_digest(a: RankDigest, b: RankDigest) -> bool:
    """Equal derived values (the tests' check that a slid digest is a scratch one)."""
    return (
        a.cur == b.cur
        and a.win == b.win
        and a.untimed == b.untimed
        and a.bad == b.bad
        and a.inexact == b.inexact
        and repr(a.means) == repr(b.means)  # repr: NaN compares unequal to itself
        and repr(a.timed) == repr(b.timed)
        and repr(a.cols) == repr(b.cols)
        and repr(a.durations_s()) == repr(b.durations_s())
    )
