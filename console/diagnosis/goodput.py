"""Goodput and badput of a group over a trailing window.

Owns `G_train` (tokens of steps that passed numeric checks / wall time), `G_serve`
(requests meeting every SLO / window time) and badput seconds by cause:
`stall` (gaps between steps beyond the hang threshold, outside restarts), `restart`
(time in `recovering`/`initializing`), `checkpoint` (the checkpoint phase of each
step), `recompute` (steps done again after a restart) and `invalid` (steps that failed
numeric checks). Must not read the clock: the window ends at the caller's `now`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial
from itertools import islice, pairwise
from operator import is_, itemgetter
from typing import Any

from agents import vocab

from console.diagnosis.rules.digest import RankDigest, slide_cut
from console.diagnosis.snapshot import GroupSnapshot, RankState, StepRecord
from console.diagnosis.stats import is_bad_number

RESTART_STATES = frozenset({vocab.RECOVERING, vocab.INITIALIZING})


@dataclass(frozen=True, slots=True)
class Goodput:
    window_s: float
    wall_s: float
    tokens_total: int = 0
    tokens_valid: int = 0
    g_train_tokens_per_s: float | None = None
    g_serve_requests_per_s: float | None = None
    badput_s: dict[str, float] = field(default_factory=dict)
    productive_fraction: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "window_s": self.window_s,
            "wall_s": self.wall_s,
            "tokens_total": self.tokens_total,
            "tokens_valid": self.tokens_valid,
            "g_train_tokens_per_s": self.g_train_tokens_per_s,
            "g_serve_requests_per_s": self.g_serve_requests_per_s,
            "badput_s": dict(self.badput_s),
            "productive_fraction": self.productive_fraction,
        }


def _valid(s: StepRecord) -> bool:
    return not (is_bad_number(s.loss) or is_bad_number(s.grad_norm) or s.overflow)


def _restart_intervals(
    snap: GroupSnapshot, start: datetime, now: datetime
) -> list[tuple[datetime, datetime]]:
    out = []
    trans = list(snap.transitions)
    for i, t in enumerate(trans):
        if t.to_state not in RESTART_STATES:
            continue
        end = trans[i + 1].ts if i + 1 < len(trans) else now
        a, b = max(t.ts, start), min(end, now)
        if b > a:
            out.append((a, b))
    return out


def _overlap(a: datetime, b: datetime, spans: list[tuple[datetime, datetime]]) -> float:
    return sum(max(0.0, (min(b, y) - max(a, x)).total_seconds()) for x, y in spans)


# Per (generation, step) across a rank's steps in the window: [first ts, longest duration
# (ms), tokens, last ts, longest checkpoint phase (ms), all valid]. Maxima, minima and
# integer sums merge exactly, so ranks' partials summed give the group's table as is.
_Partial = list[Any]
PerRank = Callable[[str, RankState, Callable[[], Any]], Any]


def _partials(steps: tuple[StepRecord, ...], start: datetime) -> dict[tuple[int, int], _Partial]:
    out: dict[tuple[int, int], _Partial] = {}
    for s in steps:
        if s.ts <= start:
            continue
        d, c, tok = s.duration_ms or 0.0, s.phases.checkpoint or 0.0, s.tokens or 0
        p = out.get((s.generation, s.step))
        if p is None:
            out[(s.generation, s.step)] = [s.ts, d, tok, s.ts, c, _valid(s)]
            continue
        p[0] = min(p[0], s.ts)
        p[1] = max(p[1], d)
        p[2] += tok
        p[3] = max(p[3], s.ts)
        p[4] = max(p[4], c)
        p[5] = p[5] and _valid(s)
    return out


def _fold(acc: _Partial, part: _Partial) -> None:
    """Merge one rank's partial of a (generation, step) into the table's, in place: the one
    rule both the rebuilt table and the live one use (they must give the same floats).
    min()/max() spelled out: the hot loop of a pass in which every rank stepped."""
    if part[0] < acc[0]:
        acc[0] = part[0]
    if part[1] > acc[1]:
        acc[1] = part[1]
    acc[2] += part[2]
    if part[3] > acc[3]:
        acc[3] = part[3]
    if part[4] > acc[4]:
        acc[4] = part[4]
    acc[5] = acc[5] and part[5]


@dataclass(frozen=True, slots=True)
class _Table:
    """The ranks' merged step table and their first timestamps (see `_rank_table`)."""

    steps: dict[tuple[int, int], _Partial]
    # The earliest of the ranks' first process and first step start; or, when a first
    # process is at or before the window's start, the earliest first process (the window
    # then begins at its start either way, and the steps' starts need not be worked out).
    first_ts: datetime | None
    start_free: bool  # every rank's steps are all after `start`: the table ignores it
    oldest: datetime | None  # the oldest step of any rank


def _first_start(s: StepRecord) -> datetime:
    """When a rank's first step began: its timestamp less its duration."""
    return s.ts - timedelta(milliseconds=s.duration_ms or 0)


def _rank_table(snap: GroupSnapshot, start: datetime, per_rank: PerRank | None) -> _Table:
    steps: dict[tuple[int, int], _Partial] = {}
    first_ts: list[datetime] = []
    start_free = True
    oldest: datetime | None = None
    for r in snap.ranks:
        if per_rank is not None and r.steps and r.steps[0].ts > start:
            mine = per_rank("goodput", r, partial(_partials, r.steps, start))
        else:
            mine = _partials(r.steps, start)
            start_free = start_free and not r.steps
        for key, part in mine.items():
            acc = steps.get(key)
            if acc is None:
                steps[key] = list(part)  # the memo's own list stays as it was
                continue
            _fold(acc, part)
        first_ts += [p.ts for p in r.processes[:1]]
        if r.steps:
            first_ts.append(_first_start(r.steps[0]))
            oldest = r.steps[0].ts if oldest is None else min(oldest, r.steps[0].ts)
    return _Table(steps, min(first_ts, default=None), start_free, oldest)


def _inside(steps: tuple[StepRecord, ...], start: datetime) -> bool:
    """Every step after `start`: the rank's step table does not depend on the window."""
    return bool(steps) and steps[0].ts > start


def _single(s: StepRecord) -> _Partial:
    """One step's partial, as `_partials` makes it for a (generation, step) seen once."""
    return [s.ts, s.duration_ms or 0.0, s.tokens or 0, s.ts, s.phases.checkpoint or 0.0, _valid(s)]


def _keys(steps: tuple[StepRecord, ...]) -> list[tuple[int, int]]:
    return [(s.generation, s.step) for s in steps]


def _slid(
    rank: int,
    old: tuple[StepRecord, ...],
    new: tuple[StepRecord, ...],
    contrib: dict[tuple[int, int], dict[int, _Partial]],
    cut: int = -1,
) -> tuple[list[tuple[int, int]], list[tuple[int, int]]] | None:
    """`new` as `old` with its oldest steps dropped and newer ones appended (the live
    state's shape), for a rank whose steps hold each (generation, step) once: its parts of
    the dropped steps leave `contrib` and a part per appended step joins it, from the
    changed steps alone. (keys dropped, keys appended); None, with `contrib` untouched,
    when `new` is not such a slide or an appended step repeats a key (recompute the rank).
    `cut`: how many steps were dropped, when the caller knows (the rank's digest)."""
    if cut < 0:
        cut = slide_cut(old, new)
        if cut < 0:
            return None
    appended = new[len(old) - cut :]
    if cut <= 1 and len(appended) == 1:  # the live shape: one step in, at most one out
        s = appended[0]
        key = (s.generation, s.step)
        out = old[0] if cut else None
        gone = None if out is None else (out.generation, out.step)
        mine = contrib.get(key)
        if mine is not None and rank in mine and key != gone:
            return None
        if gone is not None:
            contrib[gone].pop(rank, None)
        if mine is None:
            contrib[key] = {rank: _single(s)}
        else:
            mine[rank] = _single(s)
        return ([] if gone is None else [gone]), [key]
    dropped = _keys(old[:cut])
    added = _keys(appended)
    for key in added:
        mine = contrib.get(key)
        if mine is not None and rank in mine and key not in dropped:
            return None
    if len(added) > 1 and len(set(added)) < len(added):
        return None
    for key in dropped:
        contrib[key].pop(rank, None)
    for key, s in zip(added, appended, strict=True):
        mine = contrib.get(key)
        if mine is None:
            contrib[key] = {rank: _single(s)}
        else:
            mine[rank] = _single(s)
    return dropped, added


_FIELDS = tuple(itemgetter(i) for i in range(6))


def _merged(parts: list[_Partial]) -> _Partial:
    """`_fold` of `parts` in order into a copy of the first, in C loops (a new step's entry
    folds every rank's part): builtin min and max keep the first of equals and compare as
    `_fold` does (NaN included), and sum adds left to right from the first's tokens."""
    f0, f1, f2, f3, f4, f5 = _FIELDS
    return [
        min(map(f0, parts)),
        max(map(f1, parts)),
        sum(map(f2, islice(parts, 1, None)), parts[0][2]),
        max(map(f3, parts)),
        max(map(f4, parts)),
        all(map(f5, parts)),
    ]


def _live_table(
    snap: GroupSnapshot,
    start: datetime,
    state: dict[str, Any],
    digests: Mapping[int, RankDigest] | None = None,
) -> _Table:
    """`_rank_table` kept up to date between passes in `state` (the engine's memo): only
    the ranks whose steps changed are looked at step by step, and only the (generation,
    step) entries their changes touched are merged again, from every rank's part in the
    snapshot's rank order (the operations of a rebuild, in its order: the same floats)."""
    last = state.get("last")
    if last is not None and len(last[0]) == len(snap.ranks):
        t: _Table = last[1]
        if (
            t.start_free
            and (t.oldest is None or t.oldest > start)
            and (last[0] is snap.ranks or all(map(is_, last[0], snap.ranks)))
        ):
            return t  # every rank the same, all its steps still inside the window
    # rank -> (its steps, their parts by (generation, step), or None when every step is
    # inside the window and holds its own key (the parts are then the steps' own, in
    # `contrib`), all inside the window, (first step, when it began), the serial of the
    # rank digest of these steps or 0)
    prev: dict[int, tuple[tuple[StepRecord, ...], dict[Any, _Partial] | None, bool, Any, int]]
    prev = state.setdefault("ranks", {})
    contrib: dict[tuple[int, int], dict[int, _Partial]] = state.setdefault("contrib", {})
    table: dict[tuple[int, int], _Partial] = state.setdefault("table", {})
    dirty: set[tuple[int, int]] = set()
    first_ts: datetime | None = None
    start_free = True
    oldest: datetime | None = None
    for r in snap.ranks:
        steps = r.steps
        inside = _inside(steps, start)
        had = prev.get(r.rank)
        if had is None or not had[2] or not inside or had[0] is not steps:
            d = None if digests is None else digests.get(r.rank)
            serial = 0 if d is None or d.steps is not steps else d.serial
            got = None
            if had is not None and had[1] is None and inside:
                # The rank's digest slid from the one of the steps held: its cut is this one.
                cut = d.cut if d is not None and serial and had[4] and d.base == had[4] else -1
                got = _slid(r.rank, had[0], steps, contrib, cut)
            parts = None
            if got is not None:
                dirty.update(got[0])
                dirty.update(got[1])
            else:
                if had is not None:
                    _drop(r.rank, had, contrib, dirty)
                made = _partials(steps, start)
                for key, part in made.items():
                    got_key = contrib.get(key)
                    if got_key is None:
                        contrib[key] = {r.rank: part}
                    else:
                        got_key[r.rank] = part
                    dirty.add(key)
                if not inside or len(made) != len(steps):
                    parts = made
            prev[r.rank] = (steps, parts, inside, None if had is None else had[3], serial)
        if not inside:
            start_free = start_free and not steps
        if r.processes:
            p = r.processes[0].ts
            if first_ts is None or p < first_ts:
                first_ts = p
        if steps:
            s0 = steps[0].ts
            if oldest is None or s0 < oldest:
                oldest = s0
    if first_ts is None or first_ts > start:
        # A group younger than the window: when its first step began counts. Each rank's
        # is kept with the first step it was worked out for (a timedelta a rank a pass).
        for r in snap.ranks:
            steps = r.steps
            if not steps:
                continue
            had = prev[r.rank]
            first = had[3]
            if first is None or first[0] is not steps[0]:
                first = (steps[0], _first_start(steps[0]))
                prev[r.rank] = (had[0], had[1], had[2], first, had[4])
            if first_ts is None or first[1] < first_ts:
                first_ts = first[1]
    if len(prev) != len(snap.ranks):  # every rank here is in `prev`: the others left
        here = {r.rank for r in snap.ranks}
        for rk in [rk for rk in prev if rk not in here]:
            _drop(rk, prev.pop(rk), contrib, dirty)
    if dirty:
        pos = {r.rank: i for i, r in enumerate(snap.ranks)}
        for key in dirty:
            mine = contrib.get(key)
            if not mine:
                contrib.pop(key, None)
                table.pop(key, None)
                continue
            order = sorted(mine, key=pos.__getitem__)
            table[key] = _merged([mine[rk] for rk in order])
    out = _Table(table, first_ts, start_free, oldest)
    state["last"] = (snap.ranks, out)
    return out


def _drop(
    rank: int,
    had: tuple[tuple[StepRecord, ...], dict[Any, _Partial] | None, bool, Any, int],
    contrib: dict[tuple[int, int], dict[int, _Partial]],
    dirty: set[tuple[int, int]],
) -> None:
    """Take a rank's parts, as kept in `had`, out of `contrib`."""
    for key in _keys(had[0]) if had[1] is None else had[1]:
        contrib[key].pop(rank, None)
        dirty.add(key)


def compute_goodput(
    snap: GroupSnapshot,
    now: datetime,
    *,
    window_s: float,
    stall_threshold_s: float | None,
    per_rank: PerRank | None = None,
    live: dict[str, Any] | None = None,
    digests: Mapping[int, RankDigest] | None = None,
) -> Goodput:
    """Goodput over (now - window_s, now], clipped to the group's first record.

    `per_rank` (the engine's `Context.per_rank`) reuses a rank's step table from the last
    pass when its state is unchanged and every step of it is inside the window; `live`
    (a slot of the engine's memo) keeps the group's merged table between passes and
    merges again only the steps that changed (`_live_table`; `digests`, the engine's rank
    digests, tell it how far each rank's steps slid); same result."""
    start = now - timedelta(seconds=window_s)
    if snap.kind == "serving":
        met = sum(int(w.window.get("slo_met") or 0) for w in snap.serving)
        secs = max((float(w.window.get("seconds") or 0) for w in snap.serving), default=0.0)
        return Goodput(
            window_s=window_s, wall_s=secs, g_serve_requests_per_s=(met / secs) if secs else None
        )
    if live is not None:
        table = _live_table(snap, start, live, digests)
    else:
        table = _rank_table(snap, start, per_rank)
    steps = table.steps
    first_ts = [t.ts for t in snap.transitions[:1]]
    if table.first_ts is not None:
        first_ts.append(table.first_ts)
    begin = max(start, min(first_ts)) if first_ts else start
    wall = max((now - begin).total_seconds(), 0.0)
    restarts = _restart_intervals(snap, begin, now)
    bad = {
        "stall": 0.0,
        "restart": sum(((b - a).total_seconds() for a, b in restarts), 0.0),
        "checkpoint": 0.0,
        "recompute": 0.0,
        "invalid": 0.0,
    }
    tokens_total = tokens_valid = 0
    done: dict[int, int] = {}  # step -> generation that first completed it in the window
    ends: list[datetime] = []
    # Oldest first; (generation, step) breaks ties in first ts, so the order (and the
    # float sums below) does not depend on how the table was built.
    for (gen, step), (_, dur_ms, tokens, last, ckpt_ms, valid) in sorted(
        steps.items(), key=lambda kv: (kv[1][0], kv[0])
    ):
        dur = dur_ms / 1000.0
        tokens_total += tokens
        ends.append(last)
        bad["checkpoint"] += ckpt_ms / 1000.0
        if not valid:
            bad["invalid"] += dur
        elif step in done and done[step] != gen:
            bad["recompute"] += dur  # the same step again after a restart
        else:
            tokens_valid += tokens
        done.setdefault(step, gen)
    if stall_threshold_s is not None and ends:
        ends.sort()
        for a, b in [*pairwise(ends), (ends[-1], now)]:
            gap = (b - a).total_seconds()
            if gap > stall_threshold_s:
                bad["stall"] += max(0.0, gap - _overlap(a, b, restarts))
    bad = {k: round(v, 3) for k, v in bad.items()}
    return Goodput(
        window_s=window_s,
        wall_s=round(wall, 3),
        tokens_total=tokens_total,
        tokens_valid=tokens_valid,
        g_train_tokens_per_s=(tokens_valid / wall) if wall else None,
        badput_s=bad,
        productive_fraction=max(0.0, 1.0 - sum(bad.values()) / wall) if wall else None,
    )
