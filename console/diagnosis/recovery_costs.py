"""The seed's five recovery costs of one interruption: one definition for drills and incidents.

Owns what each cost means and how it is computed from marks on the interruption's
timeline (`Marks` -> `RecoveryCosts`): detection (first evidence -> incident opened),
quiesce (incident opened -> the group stopped), lost work (steps, tokens and GPU-hours
done since the restored checkpoint and thrown away), restore (the new generation's
launch -> its first valid step), repeated work (steps and samples done twice, the
samples from the data cursor) and whether the final numbers and the objectives held.
`faultline drill` fills `Marks` from what it did and saw; the console fills them from an
incident's records (`marks_from_records`, over plain record dataclasses). Both call
`recovery_costs`, so a drill's row and its incident's costs mean the same thing.

RPO/RTO are not defined here: a caller passes them (`rto_s`, `rpo_steps`, `rpo_s`) when
the group declares objectives, and the costs say whether they held. Pure: no ORM, no
clock; times are epoch seconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from agents import vocab

# A group leaves `running` for one of these when it stops to recover (or dies).
STOPPED_STATES = frozenset(
    {vocab.QUIESCING, vocab.CHECKPOINTING, vocab.RECOVERING, vocab.STOPPED, vocab.FAILED}
)
VALID_CHECKPOINT_PHASES = frozenset({"committed", "verified"})


@dataclass(frozen=True, slots=True)
class Marks:
    """What happened, when (epoch seconds), and how far the job got on either side.

    `last_step`: the newest step the failed generation reached; `resume_step`: the step
    of the checkpoint the new generation restored (0: from scratch); `redone_step`: the
    newest step the new generation has reached so far. Cursors are the data cursor
    (samples or tokens consumed) at those three points.
    """

    first_evidence: float | None
    detected: float | None
    quiesced: float | None = None
    restarted: float | None = None
    first_valid_step: float | None = None
    last_step: int | None = None
    resume_step: int | None = None
    redone_step: int | None = None
    lost_tokens: int | None = None
    gpus: int | None = None
    lost_span_s: float | None = None  # wall time the failed generation spent past resume
    cursor_last: int | None = None
    cursor_resume: int | None = None
    cursor_redone: int | None = None
    numbers_held: bool | None = None
    slo_breached: bool | None = None  # a serving SLO breach during the interruption
    checkpoint: str | None = None
    # The objectives hook: RTO/RPO a group declares (None: not declared).
    rto_s: float | None = None
    rpo_steps: int | None = None
    rpo_s: float | None = None


@dataclass(frozen=True, slots=True)
class RecoveryCosts:
    detection_s: float | None
    quiesce_s: float | None
    lost_steps: int | None
    lost_tokens: int | None
    lost_gpu_hours: float | None
    lost_work_s: float | None  # wall time of the work thrown away (resume step -> last step)
    restore_s: float | None
    repeated_steps: int | None
    repeated_samples: int | None
    downtime_s: float | None  # first evidence -> first valid step: the time to useful work
    downtime_gpu_hours: float | None
    total_lost_gpu_hours: float | None  # lost work + downtime, what the fleet report sums
    restarted: bool
    checkpoint: str | None
    resume_step: int | None
    last_step: int | None
    gpus: int | None
    numbers_held: bool | None
    rto_s: float | None
    rto_held: bool | None
    rpo_steps: int | None
    rpo_s: float | None
    rpo_held: bool | None
    slo_held: bool | None
    complete: bool  # every cost is final: the new generation caught up (or no restart)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _span(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round(max(0.0, b - a), 3)


def _hours(seconds: float | None, gpus: int | None) -> float | None:
    if seconds is None or not gpus:
        return None
    return round(seconds * gpus / 3600.0, 6)


def recovery_costs(m: Marks) -> RecoveryCosts:
    """The five costs from the marks; a cost whose marks are missing is None."""
    restarted = m.restarted is not None
    lost_steps = repeated = samples = None
    if restarted and m.last_step is not None and m.resume_step is not None:
        lost_steps = max(0, m.last_step - m.resume_step)
        if m.redone_step is not None:
            repeated = max(0, min(m.redone_step, m.last_step) - m.resume_step)
        known = (m.cursor_last, m.cursor_resume, m.cursor_redone)
        if all(c is not None for c in known):
            redone, last, resume = int(known[2] or 0), int(known[0] or 0), int(known[1] or 0)
            samples = max(0, min(redone, last) - resume)
    lost_span = m.lost_span_s if restarted else None
    downtime = _span(m.first_evidence, m.first_valid_step)
    lost_h = _hours(lost_span, m.gpus)
    down_h = _hours(downtime, m.gpus)
    total_h = None if lost_h is None and down_h is None else round((lost_h or 0) + (down_h or 0), 6)
    rto_held = None if m.rto_s is None or downtime is None else downtime <= m.rto_s
    rpo_held: bool | None = None
    if m.rpo_steps is not None and lost_steps is not None:
        rpo_held = lost_steps <= m.rpo_steps
    if m.rpo_s is not None and lost_span is not None:
        rpo_held = (rpo_held is not False) and lost_span <= m.rpo_s
    judged = [v for v in (rto_held, rpo_held) if v is not None]
    if m.slo_breached is not None:
        judged.append(not m.slo_breached)
    caught_up = (
        m.first_valid_step is not None
        and m.redone_step is not None
        and m.last_step is not None
        and m.redone_step >= m.last_step
    )
    return RecoveryCosts(
        detection_s=_span(m.first_evidence, m.detected),
        quiesce_s=_span(m.detected, m.quiesced),
        lost_steps=lost_steps,
        lost_tokens=m.lost_tokens if restarted else None,
        lost_gpu_hours=lost_h,
        lost_work_s=None if lost_span is None else round(lost_span, 3),
        restore_s=_span(m.restarted, m.first_valid_step),
        repeated_steps=repeated,
        repeated_samples=samples,
        downtime_s=downtime,
        downtime_gpu_hours=down_h,
        total_lost_gpu_hours=total_h,
        restarted=restarted,
        checkpoint=m.checkpoint,
        resume_step=m.resume_step if restarted else None,
        last_step=m.last_step,
        gpus=m.gpus,
        numbers_held=m.numbers_held,
        rto_s=m.rto_s,
        rto_held=rto_held,
        rpo_steps=m.rpo_steps,
        rpo_s=m.rpo_s,
        rpo_held=rpo_held,
        slo_held=(all(judged) if judged else None),
        complete=caught_up or not restarted,
    )


# -- from an incident's records ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StepPoint:
    ts: float
    generation: int
    rank: int
    step: int
    tokens: int = 0
    data_cursor: int | None = None
    valid: bool = True  # passed the numeric checks (finite loss and grad norm, no overflow)


@dataclass(frozen=True, slots=True)
class TransitionPoint:
    ts: float
    generation: int
    to_state: str
    from_state: str | None = None
    world_size: int | None = None
    data_cursor: int | None = None


@dataclass(frozen=True, slots=True)
class CheckpointPoint:
    ts: float
    checkpoint_id: str
    step: int | None
    phase: str
    data_cursor: int | None = None  # the checkpoint record's data cursor, when the writer named it


@dataclass(frozen=True, slots=True)
class IncidentRecords:
    """What the console holds about one incident of a group, as plain data."""

    generation: int  # the generation the incident happened in
    first_evidence: float
    detected: float
    steps: Sequence[StepPoint] = ()
    transitions: Sequence[TransitionPoint] = ()
    checkpoints: Sequence[CheckpointPoint] = ()
    world_size: int | None = None
    slo_breached: bool | None = None
    rto_s: float | None = None
    rpo_steps: int | None = None
    rpo_s: float | None = None


def marks_from_records(r: IncidentRecords) -> Marks:
    """Where the marks fall in the records.

    quiesced: the first transition of the failed generation out of `running` (or the next
    generation's launch) after the first evidence. restarted: the first transition into
    `running` of a later generation. The new generation restored the step just before its
    first step (`resume_step`); its first valid step is the restore's end. Lost work: the
    failed generation's steps past `resume_step` (their tokens, and the wall time from the
    resume step to its last step). The resume cursor comes from the restored checkpoint's
    manifest, else the restart transition, else the step record at `resume_step`.
    """
    g = r.generation
    later = sorted((t for t in r.transitions if t.ts >= r.first_evidence - 1.0), key=lambda t: t.ts)
    restart = next((t for t in later if t.to_state == "running" and t.generation > g), None)
    stops = [
        t.ts for t in later if (t.generation == g and t.to_state in STOPPED_STATES) or t is restart
    ]
    failed = [s for s in r.steps if s.generation == g]
    last_step = max((s.step for s in failed), default=None)
    gpus = r.world_size or (
        (restart.world_size if restart else None) or len({s.rank for s in failed}) or None
    )
    base = Marks(
        first_evidence=r.first_evidence,
        detected=r.detected,
        quiesced=min(stops) if stops else None,
        last_step=last_step,
        gpus=gpus,
        slo_breached=r.slo_breached,
        rto_s=r.rto_s,
        rpo_steps=r.rpo_steps,
        rpo_s=r.rpo_s,
    )
    if restart is None:
        return base
    new = [s for s in r.steps if s.generation == restart.generation]
    if not new:
        return replace(base, restarted=restart.ts)
    resume = min(s.step for s in new) - 1
    valid_new = [s for s in new if s.valid]
    ckpt = max(
        (c for c in r.checkpoints if c.step == resume and c.phase in VALID_CHECKPOINT_PHASES),
        key=lambda c: (c.data_cursor is not None, c.ts),
        default=None,
    )
    past = [s for s in failed if s.step > resume]
    at_resume = [s for s in r.steps if s.step == resume and s.generation <= g]
    span: float | None = None
    if past:
        start = max((s.ts for s in at_resume if s.generation == g), default=None)
        start = start if start is not None else min(s.ts for s in past)
        span = max(s.ts for s in past) - start
    elif last_step is not None:
        span = 0.0

    def cursor(points: Sequence[StepPoint]) -> int | None:
        return max((s.data_cursor for s in points if s.data_cursor is not None), default=None)

    cursor_resume = ckpt.data_cursor if ckpt is not None else None
    if cursor_resume is None:
        cursor_resume = restart.data_cursor
    if cursor_resume is None:
        cursor_resume = cursor(at_resume)
    redone_cap = last_step if last_step is not None else resume
    return replace(
        base,
        restarted=restart.ts,
        first_valid_step=min((s.ts for s in valid_new), default=None),
        resume_step=resume,
        redone_step=max(s.step for s in new),
        lost_tokens=sum(s.tokens for s in past),
        lost_span_s=span,
        cursor_last=cursor([s for s in failed if s.step == last_step]),
        cursor_resume=cursor_resume,
        cursor_redone=cursor([s for s in new if s.step <= redone_cap]),
        numbers_held=all(s.valid for s in new),
        checkpoint=ckpt.checkpoint_id if ckpt is not None else None,
    )
