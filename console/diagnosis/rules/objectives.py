"""Recovery-objective rule family: RPO and RTO findings and the data-consistency
limit on restart advice.

Owns `rpo_exceeded` (the progress a failure would lose now — steps since, or age of, the
newest valid checkpoint — is over the group's RPO: a risk found before any failure, so it
is judged against the caller's `now` on every pass, the periodic sweep's too),
`rto_exceeded` (a recovery still running past the RTO) and `ctx.restart_unsafe` (a
restart from the valid checkpoint would break the group's data consistency or serving
semantics). The objectives come in the snapshot as plain data; must read no clock and
must not emit root causes that block restarts: these are risks (findings.RISK_KINDS).
"""

from __future__ import annotations

from datetime import datetime

from console.diagnosis.findings import (
    MAJOR,
    ROOT_CAUSE,
    RPO_EXCEEDED,
    RTO_EXCEEDED,
    group_subject,
)
from console.diagnosis.rules.base import TERMINAL_STATES, Context
from console.diagnosis.snapshot import CheckpointState

COMMITTED = frozenset({"committed", "verified"})


def committed_at(c: CheckpointState) -> datetime | None:
    """When the checkpoint was first committed (or verified)."""
    return next((e.ts for e in c.events if e.phase in COMMITTED), None)


def resume_cursor(c: CheckpointState) -> int | None:
    """The data cursor a restore from `c` resumes at (its newest report), or None."""
    return next((e.data_cursor for e in reversed(c.events) if e.data_cursor is not None), None)


def consumed_cursor(ctx: Context, c: CheckpointState) -> int | None:
    """The data cursor the ranks reported at the checkpoint's step in its generation (the
    samples the checkpointed model had consumed), the largest if ranks differ; None when no
    step record of it is at hand. Scans each rank's steps newest first and stops below the
    step: a recent checkpoint costs a few records per rank."""
    if c.step is None or not c.events:
        return None
    gen = c.events[0].generation
    best: int | None = None
    for r in ctx.snap.ranks:
        for s in reversed(r.steps):
            if s.generation < gen or (s.generation == gen and s.step < c.step):
                break
            if s.generation == gen and s.step == c.step and s.data_cursor is not None:
                best = s.data_cursor if best is None else max(best, s.data_cursor)
                break
    return best


def _progress(ctx: Context) -> tuple[int, datetime] | None:
    """The newest step of the active generation and its time, or None."""
    lasts = [s for s in (ctx.last_step(r) for r in ctx.snap.ranks) if s is not None]
    if not lasts:
        return None
    newest = max(lasts, key=lambda s: (s.step, s.ts))
    return newest.step, max(s.ts for s in lasts)


def _rpo(ctx: Context) -> None:
    obj = ctx.snap.objectives
    if obj.rpo_steps is None and obj.rpo_minutes is None:
        return
    if ctx.snap.kind != "training" or ctx.snap.state in TERMINAL_STATES:
        return
    progress = _progress(ctx)
    if progress is None:
        return  # nothing made since the generation started: nothing to lose
    step, last_ts = progress
    ckpt = ctx.valid_checkpoint
    base_step = 0 if ckpt is None or ckpt.step is None else ckpt.step
    since = None if ckpt is None else committed_at(ckpt)
    if since is None:
        # No valid checkpoint: everything since the generation (or its first step) is at risk.
        firsts = [s.ts for r in ctx.snap.ranks for s in ctx.steps(r)[:1]]
        since = ctx.generation_start or min(firsts, default=last_ts)
    at_risk_steps = max(step - base_step, 0)
    age_s = max((ctx.now - since).total_seconds(), 0.0)
    over: list[str] = []
    if obj.rpo_steps is not None and at_risk_steps > obj.rpo_steps:
        over.append(f"{at_risk_steps} steps since it (RPO {obj.rpo_steps} steps)")
    if obj.rpo_minutes is not None and age_s > obj.rpo_minutes * 60.0 and step > base_step:
        over.append(f"{age_s / 60:.1f} min old (RPO {obj.rpo_minutes:g} min)")
    if not over:
        return
    what = (
        "no valid checkpoint" if ckpt is None else f"newest valid checkpoint {ckpt.checkpoint_id}"
    )
    ctx.put(
        ctx.new(
            kind=RPO_EXCEEDED,
            subject=group_subject(ctx.snap.group),
            role=ROOT_CAUSE,
            severity=MAJOR,
            summary=f"RPO exceeded in {ctx.snap.group}: {what}, "
            + "; ".join(over)
            + " — a failure now loses more than promised",
            first_seen=since,
            last_seen=ctx.now,
            evidence={
                "checkpoint": None if ckpt is None else ckpt.checkpoint_id,
                "checkpoint_step": None if ckpt is None else ckpt.step,
                "checkpoint_committed_at": None if ckpt is None else since,
                "current_step": step,
                "steps_at_risk": at_risk_steps,
                "age_s": round(age_s, 1),
                "rpo_steps": obj.rpo_steps,
                "rpo_minutes": obj.rpo_minutes,
                "objective_source": obj.sources.get("rpo_steps") or obj.sources.get("rpo_minutes"),
                "risk": True,
            },
        )
    )


def _rto(ctx: Context) -> None:
    obj = ctx.snap.objectives
    if obj.rto_s is None or ctx.snap.state in TERMINAL_STATES:
        return
    starts = [t for t in ctx.snap.transitions if t.to_state == "recovering"]
    if not starts:
        return
    start = starts[-1]
    # Useful work resumed: a step of the active generation (never older than the recovering
    # one) after it; the newest step per rank says.
    if any((last := ctx.last_step(r)) is not None and last.ts >= start.ts for r in ctx.snap.ranks):
        return
    elapsed = (ctx.now - start.ts).total_seconds()
    if elapsed <= obj.rto_s:
        return
    ctx.put(
        ctx.new(
            kind=RTO_EXCEEDED,
            subject=group_subject(ctx.snap.group),
            role=ROOT_CAUSE,
            severity=MAJOR,
            summary=f"RTO exceeded in {ctx.snap.group}: recovering for {elapsed:.0f} s "
            f"(RTO {obj.rto_s:g} s) without a step of the new generation",
            first_seen=start.ts,
            last_seen=ctx.now,
            key=start.ts.isoformat(),
            evidence={
                "recovering_since": start.ts,
                "reason": start.reason,
                "elapsed_s": round(elapsed, 1),
                "rto_s": obj.rto_s,
                "state": ctx.snap.state,
                "objective_source": obj.sources.get("rto_s"),
                "risk": True,
            },
        )
    )


def restart_consistency(ctx: Context) -> str | None:
    """Why a restart from the valid checkpoint would break the group's data consistency
    (or serving semantics), or None. `exact` needs a checkpoint that records where its data
    resumes and agrees with what the model had consumed at its step; `allow_repeat`
    refuses only a proven skip, `allow_skip` only a proven repeat."""
    obj = ctx.snap.objectives
    if obj.semantics == "at_most_once":
        retries = sum(int(w.window.get("retries") or 0) for w in ctx.snap.serving)
        if retries:
            return (
                f"{retries} request retries in an at_most_once group: a restart that replays "
                "them may duplicate side effects"
            )
    ckpt = ctx.valid_checkpoint
    if obj.consistency is None or ctx.snap.kind != "training" or ckpt is None:
        return None
    resume = resume_cursor(ckpt)
    consumed = consumed_cursor(ctx, ckpt)
    where = f"checkpoint {ckpt.checkpoint_id} (step {ckpt.step})"
    if resume is None:
        if obj.consistency == "exact":
            return (
                f"data consistency is exact but {where} records no data cursor: a restart "
                "cannot prove each sample is seen once"
            )
        return None
    if consumed is None:
        return None
    if resume < consumed and obj.consistency != "allow_repeat":
        return (
            f"a restart from {where} would repeat {consumed - resume} samples (its data "
            f"resumes at cursor {resume}, the model had consumed {consumed}); consistency is "
            f"{obj.consistency}"
        )
    if resume > consumed and obj.consistency != "allow_skip":
        return (
            f"a restart from {where} would skip {resume - consumed} samples (its data resumes "
            f"at cursor {resume}, the model had consumed {consumed}); consistency is "
            f"{obj.consistency}"
        )
    return None


def run(ctx: Context) -> None:
    _rpo(ctx)
    _rto(ctx)
    ctx.restart_unsafe = restart_consistency(ctx)
