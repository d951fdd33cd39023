"""Goodput and badput of a group over a trailing window.

Owns `G_train` (tokens of steps that passed numeric checks / wall time), `G_serve`
(requests meeting every SLO / window time) and badput seconds by cause:
`stall` (gaps between steps beyond the hang threshold, outside restarts), `restart`
(time in `recovering`/`initializing`), `checkpoint` (the checkpoint phase of each
step), `recompute` (steps done again after a restart) and `invalid` (steps that failed
numeric checks). Must not read the clock: the window ends at the caller's `now`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from itertools import pairwise
from typing import Any

from console.diagnosis.snapshot import GroupSnapshot, StepRecord
from console.diagnosis.stats import is_bad_number

RESTART_STATES = frozenset({"recovering", "initializing"})


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


def compute_goodput(
    snap: GroupSnapshot, now: datetime, *, window_s: float, stall_threshold_s: float | None
) -> Goodput:
    """Goodput over (now - window_s, now], clipped to the group's first record."""
    start = now - timedelta(seconds=window_s)
    if snap.kind == "serving":
        met = sum(int(w.window.get("slo_met") or 0) for w in snap.serving)
        secs = max((float(w.window.get("seconds") or 0) for w in snap.serving), default=0.0)
        return Goodput(
            window_s=window_s, wall_s=secs, g_serve_requests_per_s=(met / secs) if secs else None
        )
    steps: dict[tuple[int, int], list[StepRecord]] = {}
    first_ts: list[datetime] = [t.ts for t in snap.transitions[:1]]
    for r in snap.ranks:
        for s in r.steps:
            if s.ts > start:
                steps.setdefault((s.generation, s.step), []).append(s)
        first_ts += [p.ts for p in r.processes[:1]]
        if r.steps:
            first_ts.append(r.steps[0].ts - timedelta(milliseconds=r.steps[0].duration_ms or 0))
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
    for (gen, step), recs in sorted(steps.items(), key=lambda kv: min(s.ts for s in kv[1])):
        dur = max((s.duration_ms or 0.0) for s in recs) / 1000.0
        tokens = sum(s.tokens or 0 for s in recs)
        tokens_total += tokens
        ends.append(max(s.ts for s in recs))
        bad["checkpoint"] += max((s.phases.checkpoint or 0.0) for s in recs) / 1000.0
        if not all(_valid(s) for s in recs):
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
