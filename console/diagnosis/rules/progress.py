"""Progress rule family: ranks that stopped advancing, judged against the group's own
step-time history.

Owns `rank_hang` and `group_stall`. A rank is hung after
max(multiplier x (median + k*MAD of recent step durations), floor) without a step.
Phase-aware: a checkpoint in progress or a quiescing group is not hung, for a grace
relative to the checkpoint's own measured duration (Context.quiet_grace_s, capped);
a group with no step history only stalls after the warm-up timeout. Must run after
every evidence rule: a rank some finding already explains gets no second story.
"""

from __future__ import annotations

from datetime import datetime

from console.diagnosis.findings import (
    CRITICAL,
    MAJOR,
    ROOT_CAUSE,
    SEVERITY_RANK,
    SYMPTOM,
    UNDETERMINED,
    group_subject,
    rank_subject,
)
from console.diagnosis.rules.base import TERMINAL_STATES, Context

# Root causes that stop a synchronous group outright.
STOPPING = frozenset(
    {
        "xid",
        "gpu_lost",
        "ecc_dbe",
        "node_down",
        "oom",
        "exception",
        "process_exit",
        "collective_mismatch",
        "split_brain",
        "stale_generation",
    }
)


def _threshold(ctx: Context) -> float | None:
    thr = ctx.stall_threshold_s
    if thr is not None:
        return thr
    # Warm-up: no step yet in this generation. Only a long silence counts.
    starts = [
        p.ts for r in ctx.snap.ranks for p in r.processes if p.generation == ctx.snap.generation
    ]
    start = ctx.generation_start or (min(starts) if starts else None)
    age = ctx.age_s(start)
    if age is None or age <= ctx.cfg.warmup_timeout_s:
        return None
    return ctx.cfg.warmup_timeout_s


def run(ctx: Context) -> None:
    snap = ctx.snap
    if snap.kind != "training" or not snap.ranks or snap.state in TERMINAL_STATES:
        return
    since = ctx.quiet_since
    if ctx.quiet:
        return
    thr = _threshold(ctx)
    if thr is None:
        return
    stalled: list[tuple[int, datetime | None]] = []
    for r in snap.ranks:
        last = ctx.last_progress(r)
        if last is None or (ctx.age_s(last) or 0) > thr:
            stalled.append((r.rank, last))
    uncovered = [(rk, ts) for rk, ts in stalled if not ctx.covered(rk)]
    if not uncovered:
        return
    base = {
        "threshold_s": round(thr, 3),
        "history_steps": len(ctx.recent_durations_s),
        "checkpoint_since": since,
        **(
            {}
            if since is None
            else {
                "checkpoint_grace_s": round(ctx.quiet_grace_s, 3),
                "checkpoint_measured_s": ctx.checkpoint_measured_s,
            }
        ),
    }
    if len(stalled) == len(snap.ranks):
        roots = sorted(
            (f for f in ctx.findings.values() if f.role == ROOT_CAUSE and f.kind in STOPPING),
            key=lambda f: (SEVERITY_RANK[f.severity], f.id),
        )
        last = max((ts for _, ts in stalled if ts is not None), default=None)
        age = ctx.age_s(last)
        ctx.put(
            ctx.new(
                kind="group_stall",
                subject=group_subject(snap.group),
                role=SYMPTOM if roots else UNDETERMINED,
                severity=CRITICAL,
                summary=f"{snap.group} stalled: no rank advanced for "
                f"{'ever' if age is None else f'{age:.0f}s'} (threshold {thr:.0f}s)"
                + (f"; caused by {roots[0].summary}" if roots else ""),
                first_seen=last or ctx.now,
                last_seen=ctx.now,
                evidence={
                    **base,
                    "ranks": len(snap.ranks),
                    "last_step_ts": last,
                    "unexplained_ranks": ctx.capped([rk for rk, _ in uncovered]),
                    **(
                        {}
                        if roots
                        else {
                            "missing_evidence": "no exit, device, node or "
                            "collective evidence; collect stack dumps of every rank"
                        }
                    ),
                },
                caused_by=[f.id for f in roots[: ctx.cfg.max_evidence_items]],
            )
        )
        return
    for rk, ts in uncovered:
        r = ctx.ranks[rk]
        age = ctx.age_s(ts)
        ctx.put(
            ctx.new(
                kind="rank_hang",
                subject=rank_subject(snap.group, rk),
                role=ROOT_CAUSE,
                severity=MAJOR,
                summary=f"Rank {rk} on {r.node or '?'} made no progress for "
                f"{'ever' if age is None else f'{age:.0f}s'} (threshold {thr:.0f}s)",
                first_seen=ts or ctx.now,
                last_seen=ctx.now,
                evidence={
                    **base,
                    "rank": rk,
                    "node": r.node,
                    "gpu": r.gpu,
                    "last_step_ts": ts,
                    "last_step": None if (ls := ctx.last_step(r)) is None else ls.step,
                    "missing_evidence": "no exit, device or node fault; collect a stack "
                    "dump of this rank",
                },
            )
        )
