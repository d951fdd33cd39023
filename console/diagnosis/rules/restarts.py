"""Restart rule family: too many restarts in a window is a retry storm.

Owns the training-side `retry_storm` (transitions into `recovering`). Must not block
a single restart: one recovery is what automation is for.
"""

from __future__ import annotations

from datetime import timedelta

from console.diagnosis.findings import CRITICAL, ROOT_CAUSE, group_subject
from console.diagnosis.rules.base import Context


def run(ctx: Context) -> None:
    since = ctx.now - timedelta(seconds=ctx.cfg.retry_window_s)
    restarts = [t for t in ctx.snap.transitions if t.to_state == "recovering" and t.ts >= since]
    if len(restarts) <= ctx.cfg.retry_limit:
        return
    f = ctx.put(
        ctx.new(
            kind="retry_storm",
            subject=group_subject(ctx.snap.group),
            role=ROOT_CAUSE,
            severity=CRITICAL,
            summary=f"{len(restarts)} restarts of {ctx.snap.group} in "
            f"{ctx.cfg.retry_window_s / 60:.0f} min (limit {ctx.cfg.retry_limit})",
            first_seen=restarts[0].ts,
            last_seen=restarts[-1].ts,
            evidence={
                "restarts": len(restarts),
                "window_s": ctx.cfg.retry_window_s,
                "limit": ctx.cfg.retry_limit,
                "reasons": ctx.capped([t.reason for t in restarts]),
                "restart_ts": ctx.capped([t.ts for t in restarts]),
            },
        )
    )
    ctx.unsafe_reasons[f.id] = "retry storm: restarts keep failing; a human must look first"
