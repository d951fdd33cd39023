"""Numerics rule family: NaN/Inf loss, gradient explosion, loss-scale collapse.

Owns `nan_loss`, `grad_explosion` and `loss_scale_collapse`, each a group root cause
that blocks automatic restart (skipping a bad step masks corruption). Must not flag
a mixed-precision overflow step whose non-finite gradient the loss scaler skipped.
"""

from __future__ import annotations

from functools import partial
from math import isfinite

from console.diagnosis.findings import CRITICAL, MAJOR, ROOT_CAUSE, group_subject
from console.diagnosis.rules.base import Context
from console.diagnosis.snapshot import StepRecord
from console.diagnosis.stats import median


def _emit(
    ctx: Context,
    kind: str,
    severity: str,
    summary: str,
    bad: list[tuple[int, StepRecord]],
    extra: dict[str, object],
) -> None:
    first = min(bad, key=lambda x: x[1].ts)
    f = ctx.put(
        ctx.new(
            kind=kind,
            subject=group_subject(ctx.snap.group),
            role=ROOT_CAUSE,
            severity=severity,
            summary=summary,
            first_seen=first[1].ts,
            last_seen=max(s.ts for _, s in bad),
            evidence={
                "first_rank": first[0],
                "first_step": first[1].step,
                "ranks": ctx.capped(sorted({rk for rk, _ in bad})),
                **extra,
            },
        )
    )
    ctx.unsafe_reasons[f.id] = (
        f"{kind}: a restart would replay or skip corrupt numerics; a human must find the "
        "bad data or model state first"
    )


def _exploded(x: float | None, limit: float) -> bool:
    return x is not None and (not isfinite(x) or x > limit)


_Emission = tuple[str, str, str, list[tuple[int, StepRecord]], dict[str, object]]


def run(ctx: Context) -> None:
    cfg = ctx.cfg
    key = (
        cfg.grad_explosion_factor,
        cfg.loss_scale_floor,
        cfg.loss_scale_collapse_factor,
        cfg.max_evidence_items,
    )
    # A function of the ranks' steps alone: a pass in which no rank changed reuses it.
    for kind, severity, summary, bad, extra in ctx.per_pass("numerics", key, partial(_judge, ctx)):
        _emit(ctx, kind, severity, summary, bad, extra)


def _judge(ctx: Context) -> list[_Emission]:
    """What `run` emits, as `_emit` arguments (plain data, kept between passes)."""
    out: list[_Emission] = []
    # Each rank's recent steps and whether one has a non-finite loss come from its digest
    # (rules/digest.py: derived once per RankState, from the appended steps alone when its
    # steps slid). The walks over every recent step (the earlier grad norms, the peak loss
    # scale) run only when their check can fire: a pass whose newest steps report no grad
    # norm and no loss scale reads nothing else.
    per_rank: list[tuple[int, tuple[StepRecord, ...]]] = []
    nan: list[tuple[int, StepRecord]] = []
    last_step: int | None = None
    for rk, d in ctx.digests.items():
        win = d.win
        if not win:
            continue
        per_rank.append((rk, win))
        step = win[-1].step
        if last_step is None or step > last_step:
            last_step = step
        if d.bad:
            nan += [(rk, s) for s in d.nan_steps()]
    if last_step is None:
        return out
    if nan:
        rk, s = min(nan, key=lambda x: (x[1].step, x[0]))
        out.append(
            (
                "nan_loss",
                CRITICAL,
                f"Non-finite loss ({s.loss}) in {ctx.snap.group} from step {s.step} (rank {rk})",
                nan,
                {"loss": s.loss, "steps": ctx.capped(sorted({x.step for _, x in nan}))},
            )
        )
    # Explosion: the newest grad norm against the median of the group's earlier ones.
    newest: list[tuple[int, StepRecord]] = []
    latest: list[tuple[int, StepRecord]] = []
    for rk, ss in per_rank:
        s = ss[-1]
        if s.step == last_step:
            newest.append((rk, s))
            if s.grad_norm is not None:
                latest.append((rk, s))
    earlier = _earlier(per_rank, last_step) if latest else []
    if earlier and latest:
        base = median(earlier)
        limit = ctx.cfg.grad_explosion_factor * base
        boom = [(rk, s) for rk, s in latest if not s.overflow and _exploded(s.grad_norm, limit)]
        if boom:
            worst = max(boom, key=lambda x: x[1].grad_norm or 0.0)[1].grad_norm
            out.append(
                (
                    "grad_explosion",
                    MAJOR,
                    f"Gradient norm {worst} at step {last_step} is over "
                    f"{ctx.cfg.grad_explosion_factor:g}x the recent median {base:.3g}",
                    boom,
                    {"grad_norm": worst, "median_grad_norm": base, "limit": limit},
                )
            )
    scales = [s.loss_scale for _, s in newest if s.loss_scale is not None]
    peak = _peak(per_rank) if scales else None
    if peak is None or not scales:
        return out
    now_scale = min(scales)
    floor = ctx.cfg.loss_scale_floor
    if now_scale < floor or (
        now_scale > 0 and peak / now_scale >= ctx.cfg.loss_scale_collapse_factor
    ):
        overflows = sum(1 for _, ss in per_rank for s in ss if s.overflow)
        out.append(
            (
                "loss_scale_collapse",
                MAJOR,
                f"Loss scale collapsed to {now_scale:g} (peak {peak:g}) after "
                f"{overflows} overflow step(s)",
                newest,
                {
                    "loss_scale": now_scale,
                    "peak_loss_scale": peak,
                    "overflow_steps": overflows,
                    "floor": floor,
                },
            )
        )
    return out


def _earlier(per_rank: list[tuple[int, tuple[StepRecord, ...]]], last_step: int) -> list[float]:
    """The finite grad norms of the recent steps before `last_step`, rank by rank."""
    out: list[float] = []
    for _, ss in per_rank:
        for s in ss:
            gn = s.grad_norm
            if gn is not None and s.step < last_step and isfinite(gn):
                out.append(gn)
    return out


def _peak(per_rank: list[tuple[int, tuple[StepRecord, ...]]]) -> float | None:
    """The largest loss scale of the recent steps (the first of equals; a NaN, never
    larger, stays only if it came first), rank by rank."""
    peak: float | None = None
    for _, ss in per_rank:
        for s in ss:
            scale = s.loss_scale
            if scale is not None and (peak is None or scale > peak):
                peak = scale
    return peak
