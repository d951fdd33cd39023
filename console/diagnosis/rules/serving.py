"""Serving rule family (minimal): per-worker windows against SLOs and serving contracts.

Owns `slo_breach`, `ready_before_loaded`, `drained_worker_traffic`, `stale_version`,
`retry_storm` (per worker) and `duplicate_finish`. Must not treat a window with zero
requests as a failure: a quiet period is not an outage.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from console.diagnosis.findings import CRITICAL, MAJOR, ROOT_CAUSE, worker_subject
from console.diagnosis.rules.base import Context
from console.diagnosis.snapshot import ServingWindow


def _emit(
    ctx: Context,
    w: ServingWindow,
    kind: str,
    severity: str,
    summary: str,
    evidence: dict[str, Any],
    unsafe: str | None = None,
) -> None:
    f = ctx.put(
        ctx.new(
            kind=kind,
            subject=worker_subject(ctx.snap.group, w.worker),
            role=ROOT_CAUSE,
            severity=severity,
            summary=f"Worker {w.worker}: {summary}",
            first_seen=w.ts,
            evidence={
                "worker": w.worker,
                "window_ts": w.ts,
                "model_version": w.model_version,
                "kv_schema": w.kv_schema,
                **evidence,
            },
        )
    )
    if unsafe:
        ctx.unsafe_reasons[f.id] = unsafe


def _majority(values: list[str | None]) -> str | None:
    counts = Counter(v for v in values if v is not None)
    if not counts:
        return None
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[0][0]


def run(ctx: Context) -> None:
    cfg = ctx.cfg
    ready = [w for w in ctx.snap.serving if w.ready and not w.draining]
    model = _majority([w.model_version for w in ready])
    schema = _majority([w.kv_schema for w in ready])
    for w in ctx.snap.serving:
        win = w.window
        requests = int(win.get("requests") or 0)
        if w.ready and (w.model_version is None or w.kv_schema is None):
            _emit(
                ctx,
                w,
                "ready_before_loaded",
                CRITICAL,
                "reports ready before model and KV schema are loaded",
                {"ready": True},
                "readiness lies: traffic would hit an unloaded worker",
            )
        if w.draining and requests > 0:
            _emit(
                ctx,
                w,
                "drained_worker_traffic",
                MAJOR,
                f"took {requests} request(s) while draining",
                {"requests": requests},
            )
        if (
            w.ready
            and not w.draining
            and len(ready) > 1
            and ((model and w.model_version != model) or (schema and w.kv_schema != schema))
        ):
            _emit(
                ctx,
                w,
                "stale_version",
                MAJOR,
                f"serves {w.model_version}/{w.kv_schema}, fleet serves {model}/{schema}",
                {"fleet_model_version": model, "fleet_kv_schema": schema},
                "stale model or KV schema must not rejoin traffic automatically",
            )
        if (win.get("duplicate_tokens") or 0) > 0:
            _emit(
                ctx,
                w,
                "duplicate_finish",
                MAJOR,
                f"{win['duplicate_tokens']} duplicated streamed token(s)",
                {"duplicate_tokens": win["duplicate_tokens"]},
                "duplicate output: replay is not idempotent",
            )
        if requests == 0:
            continue  # a quiet window is not a failure
        met = win.get("slo_met")
        if met is not None and met / requests < cfg.slo_target:
            _emit(
                ctx,
                w,
                "slo_breach",
                MAJOR,
                f"{met}/{requests} requests met SLO ({met / requests:.1%} < {cfg.slo_target:.0%})",
                {
                    "requests": requests,
                    "slo_met": met,
                    "slo_target": cfg.slo_target,
                    **{
                        k: win.get(k)
                        for k in ("ttft_ms_p99", "tpot_ms_p99", "e2e_ms_p99", "timeouts", "oom")
                    },
                },
            )
        retries = int(win.get("retries") or 0)
        if retries >= cfg.serving_retry_min and retries / requests > cfg.serving_retry_ratio:
            _emit(
                ctx,
                w,
                "retry_storm",
                CRITICAL,
                f"{retries} retries for {requests} requests",
                {"retries": retries, "requests": requests, "ratio_limit": cfg.serving_retry_ratio},
                "retry storm: retries duplicate work and side effects",
            )
